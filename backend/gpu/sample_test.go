package gpu

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
	"github.com/megamoe/megamoe/model"
)

// drawWant is cpuref's draw of every row of x [len(d), vocab] under d (its
// masked tokens as -inf), with the margin by which each outcome could flip.
func drawWant(x []float32, vocab int, d []backend.Draw) ([]int32, []float64) {
	n := len(d)
	x = slices.Clone(x)
	for i, p := range d {
		cpuref.SampleMask(x[i*vocab:(i+1)*vocab], p.Mask)
	}
	temp, topP, minP, u := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	topK := make([]int32, n)
	for i, p := range d {
		temp[i], topK[i], topP[i], minP[i], u[i] = p.Temp, p.TopK, p.TopP, p.MinP, cuda.Uniform32(float64(p.U))
	}
	return cpuref.SampleDrawMargin(x, n, vocab, temp, topK, topP, minP, u)
}

// randDraws cycles through greedy, nucleus, top-k, min-p and plain draws.
func randDraws(r *rand.Rand, n int) []backend.Draw {
	kinds := []backend.Draw{{}, {Temp: 0.7, TopP: 0.95}, {Temp: 1, TopK: 50}, {Temp: 1.5, MinP: 0.02}, {Temp: 1}, {Temp: 0.8, TopK: 40, TopP: 0.9, MinP: 0.05}}
	d := make([]backend.Draw, n)
	for i := range d {
		d[i] = kinds[i%len(kinds)]
		d[i].U = r.Float32()
	}
	d[n-1].U = 1 // the backend keeps it below 1
	return d
}

// TestSampleDrawOp: the backend's draw (parameters packed into one upload)
// gives cpuref's token on every row, except where cpuref's own margin says
// the two integer-mass draws may round apart.
func TestSampleDrawOp(t *testing.T) {
	g := openGPU(t, Options{})
	r := rand.New(rand.NewPCG(rand.Uint64(), 9))
	for _, tc := range []struct{ rows, vocab int }{{1, 129280}, {7, 129280}, {33, 1000}, {2, 3}} {
		x := make([]float32, tc.rows*tc.vocab)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 3)
		}
		lt := g.Empty(tc.rows, tc.vocab, backend.F32)
		must(t, g.Upload(lt, x))
		d := randDraws(r, tc.rows)
		ids := make([]int32, tc.rows)
		for i := range ids {
			ids[i] = -7 // poison
		}
		must(t, g.SampleDraw(lt, d, ids))
		want, margin := drawWant(x, tc.vocab, d)
		for i := range ids {
			if ids[i] != want[i] && margin[i] >= 1e-5 {
				t.Errorf("%d×%d row %d (%+v): drew %d, want %d (margin %.3g)", tc.rows, tc.vocab, i, d[i], ids[i], want[i], margin[i])
			}
		}
		if err := g.SampleDraw(lt, d[:tc.rows-1], ids[:tc.rows-1]); tc.rows > 1 && err == nil {
			t.Errorf("%d×%d: %d draws for %d rows accepted", tc.rows, tc.vocab, tc.rows-1, tc.rows)
		}
		if err := g.SampleDraw(lt, d, ids[:0]); err == nil {
			t.Errorf("%d×%d: no room for the ids accepted", tc.rows, tc.vocab)
		}
		g.Free(lt)
	}
}

// TestSampleDrawMasked: rows with an allow mask (structured outputs) next to
// rows without draw cpuref's token of the logits with the masked tokens at
// -inf, always an allowed one; a mask shorter than the vocabulary is refused.
func TestSampleDrawMasked(t *testing.T) {
	g := openGPU(t, Options{})
	r := rand.New(rand.NewPCG(rand.Uint64(), 11))
	for _, tc := range []struct{ rows, vocab int }{{6, 129280}, {12, 1000}} {
		x := make([]float32, tc.rows*tc.vocab)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 3)
		}
		lt := g.Empty(tc.rows, tc.vocab, backend.F32)
		must(t, g.Upload(lt, x))
		d := randDraws(r, tc.rows)
		words := cuda.SampleMaskWords(tc.vocab)
		for i := range d {
			if i%3 == 2 {
				continue // no mask: every token
			}
			m := make([]uint32, words)
			for range 1 + i*i { // from one allowed token up
				id := r.IntN(tc.vocab)
				m[id>>5] |= 1 << (id & 31)
			}
			d[i].Mask = m
		}
		ids := make([]int32, tc.rows)
		for i := range ids {
			ids[i] = -7 // poison
		}
		must(t, g.SampleDraw(lt, d, ids))
		want, margin := drawWant(x, tc.vocab, d)
		for i, id := range ids {
			if m := d[i].Mask; m != nil && (id < 0 || int(id) >= tc.vocab || m[id>>5]>>(id&31)&1 == 0) {
				t.Errorf("%d×%d row %d: drew %d, which its mask disallows", tc.rows, tc.vocab, i, id)
			}
			if id != want[i] && margin[i] >= 1e-5 {
				t.Errorf("%d×%d row %d (%+v): drew %d, want %d (margin %.3g)", tc.rows, tc.vocab, i, d[i], id, want[i], margin[i])
			}
		}
		d[0].Mask = d[0].Mask[:words-1]
		if err := g.SampleDraw(lt, d, ids); err == nil {
			t.Errorf("%d×%d: a mask of %d words accepted", tc.rows, tc.vocab, words-1)
		}
		g.Free(lt)
	}
}

// TestModelDrawsOnGPU: a model on the GPU (CUDA graphs on) draws the token
// that cpuref draws from the logits of the same step without Draw, eager and
// replayed, for three sequences per step.
func TestModelDrawsOnGPU(t *testing.T) {
	g := openGPU(t, Options{Graphs: true})
	dir := filepath.Join(t.TempDir(), "m")
	if err := checkpoint.Generate(dir, checkpoint.GenSpec{Format: checkpoint.GenOfficial, Seed: 2}); err != nil {
		t.Fatal(err)
	}
	w, st, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := model.New(w, g, model.Options{CacheBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !m.CanDraw() {
		t.Fatal("a model on the GPU cannot draw")
	}
	vocab := w.Config.Vocab
	r := rand.New(rand.NewPCG(rand.Uint64(), 10))
	const n = 3
	ds, ps := make([]model.BatchItem, n), make([]model.BatchItem, n)
	for i := range n {
		ds[i].Seq, ps[i].Seq = m.Cache().NewSequence(), m.Cache().NewSequence()
		defer m.FreeSequence(ds[i].Seq)
		defer m.FreeSequence(ps[i].Seq)
		p := make([]int32, 20+7*i)
		for j := range p {
			p[j] = int32(r.IntN(vocab))
		}
		ds[i].Tokens, ps[i].Tokens = p, p
	}
	for step := range 6 {
		d := randDraws(r, n)
		for i := range ds {
			ds[i].Draw = &d[i]
		}
		got, err := m.Forward(&model.Batch{Items: ds})
		if err != nil {
			t.Fatal(err)
		}
		plain, err := m.Forward(&model.Batch{Items: ps})
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, 0, n*vocab)
		for i := range n {
			if got.Logits[i] != nil {
				t.Errorf("step %d item %d: logits came back for a drawn token", step, i)
			}
			x = append(x, plain.Last(i)...)
		}
		want, margin := drawWant(x, vocab, d)
		for i := range n {
			if got.IDs[i] != want[i] && margin[i] >= 1e-5 {
				t.Errorf("step %d item %d (%+v): drew %d, want %d (margin %.3g)", step, i, d[i], got.IDs[i], want[i], margin[i])
			}
			ds[i].Tokens = []int32{got.IDs[i]}
			ps[i].Tokens = ds[i].Tokens
		}
	}
}
