package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/rope"
)

// rollStore is one kv store under test and the op arguments of its layers.
type rollStore struct {
	b    *Backend
	st   backend.KVStore
	spec backend.KVSpec
}

const (
	rollD, rollRD, rollID, rollH, rollIH, rollW, rollTopK = 64, 32, 32, 2, 2, 8, 6
)

// rollInput is the deterministic input of kind k for position p of layer
// l: the true token's (salt 0) or a rejected draft's (salt > 0).
func rollInput(p, l, k, salt, n int) []float32 {
	r := rand.New(rand.NewPCG(uint64(p), uint64(salt*1000+l*16+k)))
	return randVec(r, n, 1, false)
}

// step runs one step of rows at positions start.. (salts[i] picks row i's
// inputs) through every layer: compressors, indexer, attention, window write,
// and returns the attention outputs and top-k selections row by row.
func (s *rollStore) step(t *testing.T, f *rope.Freqs, start int, salts []int) [][]float32 {
	t.Helper()
	n := len(salts)
	bt := seqBatch(0, []int32{0, 1}, start, n)
	rows := func(l, k, w int) *Tensor {
		v := make([]float32, 0, n*w)
		for i, salt := range salts {
			v = append(v, rollInput(start+i, l, k, salt, w)...)
		}
		return NewTensor(n, w, v)
	}
	out := make([][]float32, n)
	for l, lk := range s.spec.Layers {
		var sel backend.Tensor
		if lk.Ratio > 0 {
			c := coff(lk.Ratio)
			for _, kind := range []backend.CompressKind{backend.CompressKV, backend.CompressIndex} {
				dc := rollD
				if kind == backend.CompressIndex {
					if lk.IndexDim == 0 {
						continue
					}
					dc = rollID
				}
				pr := rand.New(rand.NewPCG(uint64(l), uint64(kind)))
				norm := randVec(pr, dc, 0.1, false)
				for i := range norm {
					norm[i]++
				}
				a := backend.CompressArgs{Layer: l, Kind: kind, Ratio: lk.Ratio, Dim: dc, APE: NewMat(lk.Ratio, c*dc, randVec(pr, lk.Ratio*c*dc, 0.5, false)),
					Norm: NewVec(norm), NormEps: 1e-6, Rope: f}
				if err := s.b.Compress(s.st, rows(l, 2*int(kind), c*dc), rows(l, 2*int(kind)+1, c*dc), a, bt); err != nil {
					t.Fatal(err)
				}
			}
			if lk.IndexDim > 0 {
				o := s.b.Alloc(n, rollTopK, backend.I32)
				ia := backend.IndexerArgs{Layer: l, Heads: rollIH, HeadDim: rollID, TopK: rollTopK, Ratio: lk.Ratio}
				if err := s.b.IndexerTopK(s.st, rows(l, 4, rollIH*rollID), rows(l, 5, rollIH), ia, bt, o); err != nil {
					t.Fatal(err)
				}
				sel = o
				for i := range n {
					for _, j := range o.(*Tensor).I[i*rollTopK : (i+1)*rollTopK] {
						out[i] = append(out[i], float32(j))
					}
				}
			}
		}
		kv := rows(l, 6, rollD)
		o := s.b.Alloc(n, rollH*rollD, backend.F32).(*Tensor)
		aa := backend.AttnArgs{Layer: l, Heads: rollH, HeadDim: rollD, Window: rollW, Ratio: lk.Ratio, Scale: 0.125, Sink: NewVec([]float32{0.3, -0.2})}
		if err := s.b.SparseAttention(s.st, rows(l, 7, rollH*rollD), kv, sel, aa, bt, o); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			out[i] = append(out[i], o.Row(i)...)
		}
		if err := s.b.WriteWindow(s.st, l, kv, bt); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func newRollStore(t *testing.T, mode backend.Numerics, slack int) *rollStore {
	t.Helper()
	spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 2, MaxSlots: 1, Slack: slack, Layers: []backend.LayerKV{
		{Window: rollW, HeadDim: rollD, RopeDim: rollRD},
		{Window: rollW, HeadDim: rollD, RopeDim: rollRD, Ratio: 4, IndexDim: rollID},
		{Window: rollW, HeadDim: rollD, RopeDim: rollRD, Ratio: 128}}}
	s := &rollStore{b: newB(mode), spec: spec}
	var err error
	if s.st, err = s.b.NewKVStore(spec); err != nil {
		t.Fatal(err)
	}
	if err := s.b.ResetSlot(s.st, 0); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPositionalRollback: steps of the last token and N drafts on a store
// with slack N, rewound to the accepted prefix (rejected rows' writes stay
// in the rings and blocks, nothing is copied, accepted drafts are not fed
// again), give every verified row the attention outputs and indexer
// selections of a store without slack fed only the verified rows, bit for
// bit, for every acceptance pattern, across window wraps and compression
// boundaries of ratio 4 and 128.
func TestPositionalRollback(t *testing.T) {
	f, err := rope.New(rollRD, 10000, nil)
	if err != nil {
		t.Fatal(err)
	}
	const prefill, end = 5, 140
	patterns := []struct {
		name   string
		accept func(step, n int) int
	}{
		{"all rejected", func(int, int) int { return 0 }},
		{"all accepted", func(_, n int) int { return n }},
		{"alternating", func(s, n int) int { return n * (s % 2) }},
		{"cycling", func(s, n int) int { return s % (n + 1) }},
	}
	for _, mode := range []backend.Numerics{backend.Exact, backend.Faithful} {
		for n := 1; n <= 3; n++ {
			for _, pt := range patterns {
				t.Run(fmt.Sprintf("%v N=%d %s", mode, n, pt.name), func(t *testing.T) {
					spec, ref := newRollStore(t, mode, n), newRollStore(t, mode, 0)
					pre := make([]int, prefill)
					got, want := spec.step(t, f, 0, pre), ref.step(t, f, 0, pre)
					if !slices.EqualFunc(got, want, slices.Equal) {
						t.Fatal("prefill differs")
					}
					for s, pos := 0, prefill; pos < end; s++ {
						a := pt.accept(s, n)
						salts := make([]int, n+1) // row 0: the last emitted token
						for i := a + 1; i <= n; i++ {
							salts[i] = s + 1 // rejected drafts: inputs no true row has
						}
						got := spec.step(t, f, pos, salts)
						want := ref.step(t, f, pos, salts[:a+1])
						for i := range a + 1 {
							if !slices.Equal(got[i], want[i]) {
								t.Fatalf("step %d (accepted %d): row at position %d differs from the run without drafts", s, a, pos+i)
							}
						}
						pos += a + 1
					}
				})
			}
		}
	}
}
