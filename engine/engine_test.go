package engine

import (
	"context"
	"testing"

	"github.com/megamoe/megamoe/internal/testctx"
	"github.com/megamoe/megamoe/kvcache"
)

// toyModel is a deterministic stand-in for the forward pass: the next-token
// logits depend on the whole prefix, so a recompute after preemption must
// reproduce the same tokens. It checks that tokens continue at Seq.Len().
type toyModel struct {
	t     *testing.T
	cache *kvcache.Manager
	hist  map[int64][]int32
	vocab int
}

func (m *toyModel) Vocab() int              { return m.vocab }
func (m *toyModel) Cache() *kvcache.Manager { return m.cache }
func (m *toyModel) FreeSequence(s *kvcache.Sequence) {
	delete(m.hist, s.ID)
	m.cache.Free(s)
}
func (m *toyModel) Forward(items []ForwardItem) ([][]float32, error) {
	out := make([][]float32, len(items))
	for i, it := range items {
		if len(m.hist[it.Seq.ID]) != it.Seq.Len() {
			m.t.Errorf("seq %d: history %d, Len %d", it.Seq.ID, len(m.hist[it.Seq.ID]), it.Seq.Len())
		}
		if err := m.cache.Reserve(it.Seq, it.Seq.Len()+len(it.Tokens)); err != nil {
			return nil, err
		}
		var rows []float32
		for _, tok := range it.Tokens {
			m.hist[it.Seq.ID] = append(m.hist[it.Seq.ID], tok)
			if it.AllLogits {
				rows = append(rows, m.logits(m.hist[it.Seq.ID])...)
			}
		}
		if !it.AllLogits {
			rows = m.logits(m.hist[it.Seq.ID])
		}
		m.cache.Advance(it.Seq, len(it.Tokens))
		out[i] = rows
	}
	return out, nil
}
func (m *toyModel) logits(prefix []int32) []float32 {
	var h uint32 = 2166136261
	for _, t := range prefix {
		h = (h ^ uint32(t)) * 16777619
	}
	row := make([]float32, m.vocab)
	for j := range row {
		row[j] = float32((h>>uint(j%16))&7) * 0.5
	}
	row[h%uint32(m.vocab)] += 10
	return row
}

func newToy(t *testing.T, capacityTokens int) *toyModel {
	lay := kvcache.Layout{BlockTokens: 8, StateBytes: 1000, BlockBytes: 16}
	mgr := kvcache.NewManager(lay, int64(capacityTokens))
	return &toyModel{t: t, cache: mgr, hist: map[int64][]int32{}, vocab: 50}
}

func collect(t *testing.T, st *Stream) ([]int32, FinishReason) {
	t.Helper()
	ctx := testctx.New(t)
	var toks []int32
	for {
		select {
		case <-st.Ready():
		case <-ctx.Done():
			t.Fatalf("stream unfinished after %d tokens: %v", len(toks), context.Cause(ctx))
		}
		for {
			ev, ok := st.Next()
			if !ok {
				break
			}
			for _, tk := range ev.Tokens {
				toks = append(toks, tk.ID)
			}
			if ev.Finish != FinishNone {
				return toks, ev.Finish
			}
		}
	}
}

func runEngine(t *testing.T, m Model, cfg Config, reqs []*Request) ([][]int32, *Engine) {
	e, err := New(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	var streams []*Stream
	for _, r := range reqs {
		st, err := e.Submit(r)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	out := make([][]int32, len(reqs))
	for i, st := range streams {
		toks, fin := collect(t, st)
		if fin != FinishLength && fin != FinishStop {
			t.Fatalf("request %d finished %q", i, fin)
		}
		out[i] = toks
	}
	return out, e
}

// Outputs are the same with a roomy cache and with one so small that
// sequences are preempted and recomputed; the cache is empty afterwards.
func TestPreemptionReproducesOutput(t *testing.T) {
	var reqs []*Request
	for i := range 6 {
		p := make([]int32, 20+i*7)
		for j := range p {
			p[j] = int32((i*13 + j) % 50)
		}
		reqs = append(reqs, &Request{Prompt: p, MaxTokens: 12, Params: SamplingParams{Temperature: 0.8, Seed: seed(uint64(i))}})
	}
	big := newToy(t, 1<<20)
	want, _ := runEngine(t, big, Config{MaxModelLen: 4096, MaxBatchTokens: 16}, reqs)
	small := newToy(t, 2*1000+12*16) // two states, 12 blocks: decode growth preempts
	got, e := runEngine(t, small, Config{MaxModelLen: 512, MaxBatchTokens: 16}, reqs)
	for i := range want {
		if len(want[i]) != 12 || len(got[i]) != 12 {
			t.Fatalf("request %d: %d / %d tokens", i, len(want[i]), len(got[i]))
		}
		for j := range want[i] {
			if want[i][j] != got[i][j] {
				t.Fatalf("request %d token %d: %d vs %d", i, j, want[i][j], got[i][j])
			}
		}
	}
	if u := small.cache.UsedBytes(); u != 0 {
		t.Fatalf("cache holds %d bytes after all finished", u)
	}
	if e.Stats().Preemptions == 0 {
		t.Fatal("the small cache caused no preemption")
	}
}

func TestQueueFullAndCancel(t *testing.T) {
	m := newToy(t, 1<<20)
	e, err := New(m, Config{MaxModelLen: 4096, MaxQueue: 2})
	if err != nil {
		t.Fatal(err)
	}
	req := func() *Request { return &Request{Prompt: []int32{1, 2, 3}, MaxTokens: 1000} }
	a, _ := e.Submit(req())
	if _, err := e.Submit(req()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Submit(req()); err != ErrQueueFull {
		t.Fatalf("third submit: %v, want ErrQueueFull", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	a.Cancel()
	if _, fin := collect(t, a); fin != FinishCancelled {
		t.Fatalf("cancelled stream finished %q", fin)
	}
	cancel()
	<-done
	if u := m.cache.UsedBytes(); u != 0 {
		t.Fatalf("cache holds %d bytes after shutdown", u)
	}
}
