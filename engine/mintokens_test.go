package engine

import (
	"context"
	"math"
	"testing"

	"github.com/megamoe/megamoe/internal/testctx"
)

// TestMinTokens checks that the stop tokens cannot end a sequence before
// MinTokens tokens, on a toy model whose most likely token is always the stop
// (logit bias): greedy and sampled, with and without a duplicate stop id.
func TestMinTokens(t *testing.T) {
	const stop = 7
	cases := []struct {
		name      string
		min, max  int
		temp      float64
		stops     []int32
		wantLen   int
		wantStop  bool
		wantFirst int // tokens before the stop that are not the stop
	}{
		{"no min: stops at once", 0, 10, 0, []int32{stop}, 1, true, 0},
		{"min 4 greedy", 4, 10, 0, []int32{stop}, 5, true, 4},
		{"min 4 sampled", 4, 10, 1, []int32{stop}, 5, true, 4},
		{"stop listed twice", 3, 10, 0, []int32{stop, 9, stop}, 4, true, 3},
		{"min equals max", 6, 6, 0, []int32{stop}, 6, false, 6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := &Request{Prompt: []int32{1, 2, 3}, MaxTokens: c.max, MinTokens: c.min, StopTokens: c.stops,
				Params: SamplingParams{Temperature: c.temp, Seed: seed(5), LogitBias: map[int32]float32{stop: 50}}}
			out, _ := runEngine(t, newToy(t, 1<<20), Config{MaxModelLen: 4096}, []*Request{req})
			got := out[0]
			if len(got) != c.wantLen {
				t.Fatalf("tokens %v, want %d", got, c.wantLen)
			}
			for i, id := range got[:c.wantFirst] {
				if id == stop {
					t.Fatalf("stop token at %d of %v (min %d)", i, got, c.min)
				}
			}
			if ended := got[len(got)-1] == stop; ended != c.wantStop {
				t.Fatalf("tokens %v: ends with the stop %v, want %v", got, ended, c.wantStop)
			}
		})
	}
}

// TestMinTokensInvalid checks that Submit rejects MinTokens outside [0, MaxTokens].
func TestMinTokensInvalid(t *testing.T) {
	e, err := New(newToy(t, 1<<20), Config{MaxModelLen: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for _, min := range []int{-1, 5} {
		if _, err := e.Submit(&Request{Prompt: []int32{1}, MaxTokens: 4, MinTokens: min}); err == nil {
			t.Errorf("min tokens %d accepted with max tokens 4", min)
		}
	}
}

// TestPromptLogprobs checks the prompt logprobs, ranks and alternatives
// against the toy model's rows computed directly, with the prompt split over
// several chunks, and that each step's tokens carry their time.
func TestPromptLogprobs(t *testing.T) {
	m := newToy(t, 1<<20)
	prompt := make([]int32, 23)
	for i := range prompt {
		prompt[i] = int32((i * 17) % m.vocab)
	}
	e, err := New(m, Config{MaxModelLen: 4096, MaxBatchTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	st, err := e.Submit(&Request{Prompt: prompt, MaxTokens: 3, PromptLogprobs: true, PromptTopLogprobs: 3})
	if err != nil {
		t.Fatal(err)
	}
	var got []Token
	steps, toks := 0, 0
	wait := testctx.New(t)
	for fin := false; !fin; {
		select {
		case <-st.Ready():
		case <-wait.Done():
			t.Fatal("stream unfinished")
		}
		for ev, ok := st.Next(); ok; ev, ok = st.Next() {
			if len(ev.Prompt) > 0 && toks > 0 {
				t.Fatal("prompt logprobs after a generated token")
			}
			got = append(got, ev.Prompt...)
			steps += len(ev.Steps)
			toks += len(ev.Tokens)
			fin = fin || ev.Finish != FinishNone
		}
	}
	if toks != 3 || steps != 3 {
		t.Errorf("%d tokens in %d step stamps, want 3 and 3", toks, steps)
	}
	if len(got) != len(prompt)-1 {
		t.Fatalf("%d prompt logprobs for a prompt of %d", len(got), len(prompt))
	}
	for i, tk := range got {
		row := m.logits(prompt[:i+1])
		lse := logsumexp(row)
		want := float32(float64(row[prompt[i+1]]) - lse)
		rank := 0
		for _, v := range row {
			if v >= row[prompt[i+1]] {
				rank++
			}
		}
		if tk.ID != prompt[i+1] || math.Abs(float64(tk.Logprob-want)) > 1e-5 || tk.Rank != rank || len(tk.Top) != 3 {
			t.Fatalf("position %d: %+v, want id %d logprob %v rank %d and 3 alternatives", i+1, tk, prompt[i+1], want, rank)
		}
		if top := tk.Top[0]; top.ID != Argmax(row) || math.Abs(float64(top.Logprob)-(float64(row[top.ID])-lse)) > 1e-5 {
			t.Fatalf("position %d: top %+v, want id %d", i+1, top, Argmax(row))
		}
	}
}

// TestSuppressStops checks the sampler's mask of held stop tokens: the stop
// is not drawn while held unless nothing else is allowed, and is drawn again
// once MinTokens tokens were accepted.
func TestSuppressStops(t *testing.T) {
	const vocab, stop = 40, 3
	only := func(ids ...int) []uint32 { // a grammar mask allowing ids
		m := make([]uint32, (vocab+31)/32)
		for _, id := range ids {
			m[id/32] |= 1 << (id % 32)
		}
		return m
	}
	cases := []struct {
		name     string
		accepted int
		mask     []uint32
		want     int32
	}{
		{"held", 0, nil, 0},
		{"held, grammar allows others", 1, only(stop, 5), 5},
		{"held, grammar allows only the stop", 1, only(stop), stop},
		{"released", 2, nil, stop},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			logits := make([]float32, vocab)
			logits[stop] = 10
			s := NewSampler(SamplingParams{}, nil)
			s.holdStops([]int32{stop}, 2)
			for range c.accepted {
				s.Accept(1)
			}
			if got := s.SampleMasked(logits, c.mask).ID; got != c.want {
				t.Fatalf("drew %d, want %d", got, c.want)
			}
			if _, dev := s.DeviceDraw(); dev == s.holding() {
				t.Fatalf("device draw %v while holding %v", dev, s.holding())
			}
		})
	}
}
