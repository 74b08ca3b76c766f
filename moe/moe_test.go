package moe

import (
	"encoding/binary"
	"math"
	"sort"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
)

// dense recovers W [out, in] exactly by applying the linear to the identity.
func dense(t *testing.T, be backend.Backend, l backend.Linear) [][]float64 {
	t.Helper()
	in, out := l.In(), l.Out()
	eye := make([]float32, in*in)
	for i := range in {
		eye[i*in+i] = 1
	}
	x := be.Alloc(in, in, backend.F32)
	be.Upload(x, eye)
	y := be.Alloc(in, out, backend.F32)
	if err := be.LinearF32(x, l, y); err != nil {
		t.Fatal(err)
	}
	v := make([]float32, in*out)
	be.Download(y, v)
	w := make([][]float64, out)
	for o := range out {
		w[o] = make([]float64, in)
		for k := range in {
			w[o][k] = float64(v[k*out+o])
		}
	}
	return w
}

func mv(w [][]float64, x []float64) []float64 {
	y := make([]float64, len(w))
	for o, row := range w {
		for k, v := range row {
			y[o] += v * x[k]
		}
	}
	return y
}

// TestMoEVsFloat64: exact-mode MoE (bias-routed layer and hash layer) equals a
// float64 composition of router, clamped SwiGLU experts and shared expert.
func TestMoEVsFloat64(t *testing.T) {
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 2)
	be := cpu.New(cpu.Options{Threads: 2})
	be.SetNumerics(backend.Exact)
	for _, li := range []int{0, 2} { // hash layer, score layer
		l, err := Prepare(be, c, &w.Layers[li], nil)
		if err != nil {
			t.Fatal(err)
		}
		const n = 5
		xs := make([]float32, n*c.Dim)
		for i := range xs {
			xs[i] = float32(3 * math.Sin(float64(i)*0.37))
		}
		ids := []int32{3, 77, 200, 5, 511}
		f := be.Alloc(n, c.Dim, backend.F32)
		be.Upload(f, xs)
		out, err := l.Forward(be, f, ids)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, n*c.Dim)
		be.Download(out, got)
		gate := dense(t, be, l.Gate)
		ex := w.Layers[li].FFN.Experts
		swiglu := func(g, u float64) float64 {
			u = math.Max(-10, math.Min(10, u))
			g = math.Min(g, 10)
			return g / (1 + math.Exp(-g)) * u
		}
		ffn := func(w1, w2, w3 [][]float64, x []float64, wt float64) []float64 {
			g, u := mv(w1, x), mv(w3, x)
			h := make([]float64, len(g))
			for i := range h {
				h[i] = wt * swiglu(g[i], u[i])
			}
			return mv(w2, h)
		}
		for r := range n {
			x := make([]float64, c.Dim)
			for i := range x {
				x[i] = float64(xs[r*c.Dim+i])
			}
			lg := mv(gate, x)
			s := make([]float64, len(lg))
			for e, z := range lg {
				s[e] = math.Sqrt(math.Log1p(math.Exp(z)))
			}
			var sel []int
			if li < c.HashLayers {
				tab := w.Layers[li].FFN.Tid2Eid.Data
				for k := range c.TopK {
					sel = append(sel, int(binary.LittleEndian.Uint64(tab[8*(int(ids[r])*c.TopK+k):])))
				}
			} else {
				bias, _ := w.Layers[li].FFN.Bias.Float32s()
				order := make([]int, len(s))
				for i := range order {
					order[i] = i
				}
				sort.SliceStable(order, func(a, b int) bool { return s[order[a]]+float64(bias[order[a]]) > s[order[b]]+float64(bias[order[b]]) })
				sel = order[:c.TopK]
			}
			var sum float64
			for _, e := range sel {
				sum += s[e]
			}
			y := make([]float64, c.Dim)
			for _, e := range sel {
				w1l, _ := be.PrepareLinear(&ex[e].W1)
				w2l, _ := be.PrepareLinear(&ex[e].W2)
				w3l, _ := be.PrepareLinear(&ex[e].W3)
				o := ffn(dense(t, be, w1l), dense(t, be, w2l), dense(t, be, w3l), x, s[e]/sum*c.RouteScale)
				for i := range y {
					y[i] += o[i]
				}
			}
			sh := ffn(dense(t, be, l.SW1), dense(t, be, l.SW2), dense(t, be, l.SW3), x, 1)
			var num, den float64
			for i := range y {
				y[i] += sh[i]
				num = math.Max(num, math.Abs(float64(got[r*c.Dim+i])-y[i]))
				den = math.Max(den, math.Abs(y[i]))
			}
			if num/den > 1e-5 {
				t.Errorf("layer %d row %d: rel err %.3g", li, r, num/den)
			}
		}
	}
}

// genWeights draws the weights of c as the small-checkpoint generator does
// (checkpoint.GenWeights, official formats).
func genWeights(t testing.TB, c *checkpoint.Config, seed uint64) *checkpoint.Weights {
	t.Helper()
	w, err := checkpoint.GenWeights(c, checkpoint.GenOfficial, seed)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
