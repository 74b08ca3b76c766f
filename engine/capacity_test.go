package engine

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/megamoe/megamoe/kvcache"
)

// New refuses a cache that cannot hold one sequence of MaxModelLen, naming
// the longest that fits.
func TestNewRefusesSmallCache(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int // bytes: the toy's state is 1000, a block of 8 tokens 16
		maxLen   int
		wantErr  string
	}{
		{"exact fit", 1000 + 8*16, 64, ""},
		{"one token over", 1000 + 8*16, 65, "at most 64 tokens, less than the context length 65"},
		{"state only", 1000, 8, "at most 0 tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(newToy(t, tc.capacity), Config{MaxModelLen: tc.maxLen})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// With a cache that holds exactly one sequence of the context length,
// concurrent requests that each grow to that length all finish (by length,
// with every token), with the same tokens as under a roomy cache: they wait
// or are preempted and recomputed, never failed.
func TestTinyCacheConcurrentRequestsAllFinish(t *testing.T) {
	const maxLen = 64
	var reqs []*Request
	for i := range 8 {
		p := make([]int32, 5+i*6)
		for j := range p {
			p[j] = int32((i*7 + j) % 50)
		}
		// MaxTokens beyond the room: the context length ends every request.
		reqs = append(reqs, &Request{Prompt: p, MaxTokens: 1000, Params: SamplingParams{Temperature: 0.7, Seed: seed(uint64(i))}})
	}
	want, _ := runEngine(t, newToy(t, 1<<20), Config{MaxModelLen: maxLen, MaxBatchTokens: 16}, reqs)

	// A small fixed state, so that several short sequences are admitted
	// together and their growth preempts.
	tiny := newToy(t, 0)
	tiny.cache = kvcache.NewManager(kvcache.Layout{BlockTokens: 8, StateBytes: 10, BlockBytes: 16}, 10+maxLen/8*16)
	e, err := New(tiny, Config{MaxModelLen: maxLen, MaxBatchTokens: 16, MaxNumSeqs: 4})
	if err != nil {
		t.Fatal(err)
	}
	// Submitted together before the engine runs, so that they compete for
	// the cache (the toy model would finish each before the next arrives).
	streams := make([]*Stream, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			var err error
			if streams[i], err = e.Submit(r); err != nil {
				t.Errorf("request %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	got := make([][]int32, len(reqs))
	for i, st := range streams {
		wg.Go(func() {
			toks, fin := collect(t, st)
			if fin != FinishLength {
				t.Errorf("request %d finished %q after %d tokens", i, fin, len(toks))
			}
			got[i] = toks
		})
	}
	wg.Wait()
	for i := range reqs {
		if n := len(reqs[i].Prompt) + len(got[i]); n != maxLen {
			t.Errorf("request %d: prompt + output %d tokens, want %d", i, n, maxLen)
		}
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: tokens differ from the roomy cache's", i)
		}
	}
	if e.Stats().Preemptions == 0 {
		t.Error("the tiny cache caused no preemption")
	}
	if u := tiny.cache.UsedBytes(); u != 0 {
		t.Errorf("cache holds %d bytes after all finished", u)
	}
}
