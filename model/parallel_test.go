package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
)

// tpCheckpoint generates the small architecture with 4 heads in 4 output
// groups of rank 128, so that it splits over 2 and 4 ranks with whole FP8
// scale blocks (the embedded small model's 3 groups of 64 do not).
func tpCheckpoint(t *testing.T, format string) *checkpoint.Weights {
	return loadGenerated(t, checkpoint.GenSpec{Format: format, Seed: 5, Preset: "small-tp"})
}

// stepper is what the test drives: a Model or a Parallel.
type stepper interface {
	Forward(*Batch) (*Output, error)
	Cache() *kvcache.Manager
	FreeSequence(*kvcache.Sequence)
}

// runSchedule prefills two sequences in chunks (the second joins while the
// first decodes), then decodes both greedily; it returns every logits row
// and the greedy tokens.
func runSchedule(t *testing.T, m stepper, vocab int) ([][]float32, []int32) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 8))
	prompt := func(n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(r.IntN(vocab))
		}
		return p
	}
	a, b := m.Cache().NewSequence(), m.Cache().NewSequence()
	defer m.FreeSequence(a)
	defer m.FreeSequence(b)
	pa, pb := prompt(37), prompt(21)
	var rows [][]float32
	var toks []int32
	step := func(items ...BatchItem) *Output {
		o, err := m.Forward(&Batch{Items: items})
		if err != nil {
			t.Fatal(err)
		}
		for i := range items {
			rows = append(rows, o.Rows(i)...)
		}
		return o
	}
	step(BatchItem{Seq: a, Tokens: pa[:20], AllLogits: true})
	o := step(BatchItem{Seq: a, Tokens: pa[20:], AllLogits: true})
	na := argmax(o.Last(0))
	o = step(BatchItem{Seq: a, Tokens: []int32{na}}, BatchItem{Seq: b, Tokens: pb, AllLogits: true})
	na, nb := argmax(o.Last(0)), argmax(o.Last(1))
	for range 6 {
		toks = append(toks, na, nb)
		o = step(BatchItem{Seq: a, Tokens: []int32{na}}, BatchItem{Seq: b, Tokens: []int32{nb}})
		na, nb = argmax(o.Last(0)), argmax(o.Last(1))
	}
	return rows, toks
}

func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// TestParallelMatchesSingle: the small architecture split over 2 and 4 ranks
// (tensor-parallel heads and head vocabulary, expert-parallel MoE, CPU
// backends exchanging through parallel.Local) computes the single-rank
// model's logits: in exact numerics every row within 1e-5 and every greedy
// token equal, for the official (MXFP4) and the NVFP4 checkpoint. Faithful
// numerics round each rank's wo_b partial to bf16 before the sum, as the
// reference's tensor parallelism does, so there the check is finiteness.
func TestParallelMatchesSingle(t *testing.T) {
	for _, format := range []string{checkpoint.GenOfficial, checkpoint.GenNVFP4} {
		w := tpCheckpoint(t, format)
		for _, numerics := range []string{"exact", "faithful"} {
			if numerics == "faithful" && testing.Short() {
				continue // its check is only finiteness
			}
			opts := Options{Numerics: numerics, CacheBytes: 16 << 20, Threads: 2}
			single, err := New(w, nil, opts)
			if err != nil {
				t.Fatal(err)
			}
			want, wantToks := runSchedule(t, single, w.Config.Vocab)
			for _, n := range []int{2, 4} {
				t.Run(fmt.Sprintf("%s/%s/%d", format, numerics, n), func(t *testing.T) {
					bes := make([]backend.Backend, n)
					for r := range bes {
						bes[r] = cpu.New(cpu.Options{Threads: 1})
					}
					p, err := NewParallel(w, bes, opts)
					if err != nil {
						t.Fatal(err)
					}
					if got := p.Rank(n - 1).Config().Heads; got != w.Config.Heads/n {
						t.Fatalf("rank config heads %d, want %d", got, w.Config.Heads/n)
					}
					got, gotToks := runSchedule(t, p, w.Config.Vocab)
					if len(got) != len(want) {
						t.Fatalf("%d logits rows, single rank %d", len(got), len(want))
					}
					worst := 0.0
					for i := range want {
						var n2, d2 float64
						for j := range want[i] {
							if f := float64(got[i][j]); math.IsNaN(f) || math.IsInf(f, 0) {
								t.Fatalf("row %d: non-finite logit %g", i, f)
							}
							d := float64(got[i][j] - want[i][j])
							n2, d2 = n2+d*d, d2+float64(want[i][j])*float64(want[i][j])
						}
						worst = max(worst, math.Sqrt(n2/max(d2, 1e-30)))
					}
					t.Logf("%d rows, worst relative logits difference %.3g; greedy %v vs %v", len(want), worst, gotToks, wantToks)
					if numerics == "exact" {
						if worst > 1e-5 {
							t.Errorf("worst row differs by %.3g from the single rank (limit 1e-5)", worst)
						}
						if !slices.Equal(gotToks, wantToks) {
							t.Errorf("greedy tokens %v, single rank %v", gotToks, wantToks)
						}
					}
				})
			}
		}
	}
}

// TestParallelErrors: bad splits are refused, a bad step fails on every rank
// without leaving the group stuck, and the next step works.
func TestParallelErrors(t *testing.T) {
	w := tpCheckpoint(t, checkpoint.GenOfficial)
	if _, err := NewParallel(w, make([]backend.Backend, 3), Options{}); err == nil {
		t.Error("3 ranks for 4 heads accepted")
	}
	if _, err := NewParallel(w, nil, Options{}); err == nil {
		t.Error("0 ranks accepted")
	}
	shard, err := checkpoint.Shard(w, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(shard, nil, Options{}); err == nil {
		t.Error("a rank's shard without a communicator accepted")
	}
	p, err := NewParallel(w, make([]backend.Backend, 2), Options{Numerics: "exact", CacheBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s := p.Cache().NewSequence()
	defer p.FreeSequence(s)
	if _, err := p.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: []int32{int32(w.Config.Vocab)}}}}); err == nil {
		t.Error("token outside the vocabulary accepted")
	}
	o, err := p.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: []int32{1, 2, 3}}}})
	if err != nil {
		t.Fatalf("step after a refused one: %v", err)
	}
	if len(o.Last(0)) != w.Config.Vocab {
		t.Errorf("%d logits, want %d", len(o.Last(0)), w.Config.Vocab)
	}
}

// TestParallelMTP: the MTP block split over 2 ranks gives the single-rank
// next-next-token logits (exact numerics), fed with rank 0's hidden streams.
func TestParallelMTP(t *testing.T) {
	w := tpCheckpoint(t, checkpoint.GenOfficial)
	opts := Options{Numerics: "exact", CacheBytes: 16 << 20}
	single, err := New(w, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewParallel(w, make([]backend.Backend, 2), opts)
	if err != nil {
		t.Fatal(err)
	}
	if !p.HasMTP() {
		t.Fatal("no MTP block")
	}
	toks := []int32{9, 8, 7, 300, 301, 5, 77, 12, 13, 900, 4, 2}
	hd := w.Config.HcDim()
	mtp := func(m interface {
		stepper
		ForwardMTP([]MTPItem) (*Output, error)
	}) [][]float32 {
		s := m.Cache().NewSequence()
		defer m.FreeSequence(s)
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks, Hidden: true}}})
		if err != nil {
			t.Fatal(err)
		}
		r, err := m.ForwardMTP([]MTPItem{{Seq: s, Hidden: o.Hidden[0][:(len(toks)-1)*hd], Next: toks[1:], AllLogits: true}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Rows(0)
	}
	want, got := mtp(single), mtp(p)
	if d, at := maxRelDiff(want, got); d > 1e-5 {
		t.Errorf("mtp logits: 2 ranks differ by %.3g at row %d", d, at)
	}
}
