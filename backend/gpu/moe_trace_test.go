package gpu

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/num"
)

// The expert tracer (ExpertsArgs.Trace) must name the same first non-finite
// stage on both backends. An input that leaves fp32 right at the edge makes
// that stage depend on summation order (w1 on one backend, w3 on the other),
// so each case is built with margins instead: one loud input row, every
// stage before the target at least 2^24 inside the fp32 range (room for any
// order in which a quantised GEMM applies its scales), and one output of the
// target stage a sum of same-signed terms of at least 8·MaxFloat32, which no
// order or rounding can keep finite. Both backends must name that stage.

const (
	traceRow    = 5 // the loud input row
	traceMargin = 8 // a sure overflow is ≥ traceMargin·MaxFloat32
)

var traceStages = []string{"w1", "w3", "swiglu", "w2"}

// traceCases edit the first expert of the loud row (j: a row of w1/w3, i: of
// w2) so that traceStages[k] is the first stage that can overflow.
var traceCases = []func(e *checkpoint.Expert, j, i int){
	func(e *checkpoint.Expert, j, _ int) { setCodes(&e.W1, j, 7); amplify(&e.W1, j) },
	func(e *checkpoint.Expert, j, _ int) { setCodes(&e.W3, j, 7); amplify(&e.W3, j) },
	func(e *checkpoint.Expert, j, _ int) { setCodes(&e.W1, j, 7); setCodes(&e.W3, j, 7) },
	func(e *checkpoint.Expert, j, i int) { // h is zero but at j, y_i is that one term
		for r := range e.W1.Out {
			setCodes(&e.W1, r, 0)
			setCodes(&e.W3, r, 0)
		}
		setCodes(&e.W1, j, 7)
		setCodes(&e.W3, j, 7)
		setCodes(&e.W2, i, 7)
		amplify(&e.W2, i)
	},
}

// setCodes sets every e2m1 code of row r to c (7 is +6, 0 is +0).
func setCodes(l *checkpoint.Linear, r int, c byte) {
	row := l.Weight.Data[r*l.In/2 : (r+1)*l.In/2]
	for k := range row {
		row[k] = c | c<<4
	}
}

// amplify makes row r's scales far larger than any random weight's:
// 2^33 (MXFP4), or 448 under a global 2^23 (NVFP4).
func amplify(l *checkpoint.Linear, r int) {
	per := len(l.Scale.Data) / l.Out
	sc, v := l.Scale.Data[r*per:(r+1)*per], byte(127+33)
	if l.Format == checkpoint.FormatNVFP4 {
		v, l.Scale2 = 0x7e, 1<<23
	}
	for k := range sc {
		sc[k] = v
	}
}

func dequantFP4(l *checkpoint.Linear) []float32 {
	w := make([]float32, l.Out*l.In)
	if l.Format == checkpoint.FormatNVFP4 {
		num.DequantNVFP4(l.Weight.Data, l.Scale.Data, l.Scale2, l.Out, l.In, w)
	} else {
		num.DequantMXFP4(l.Weight.Data, l.Scale.Data, l.Out, l.In, w)
	}
	return w
}

// span accumulates one output's terms in float64.
type span struct {
	sum, abs float64
	pos, neg bool
}

func (s *span) add(v float64) {
	s.sum += v
	s.abs += math.Abs(v)
	s.pos, s.neg = s.pos || v > 0, s.neg || v < 0
}

func (s span) oneSigned() bool { return !(s.pos && s.neg) }

// stageBound is a stage's largest Σ|term| over its outputs and whether one
// of them surely overflows.
type stageBound struct {
	abs  float64
	sure bool
}

// traceModel bounds the stages of one expert (weights w1, w3 [I][d], w2
// [d][I]) over its (row, routing weight) pairs with the loud row set to a.
func traceModel(w1, w3, w2 []float32, x []float32, rows []int, wr []float64, d int, a float64) [4]stageBound {
	I := len(w1) / d
	var st [4]stageBound
	note := func(k int, s span, sure bool) {
		st[k].abs = max(st[k].abs, s.abs)
		st[k].sure = st[k].sure || sure && math.Abs(s.sum) >= traceMargin*math.MaxFloat32
	}
	h, hb, hok := make([]float64, I), make([]float64, I), make([]bool, I)
	for p, r := range rows {
		xr := func(k int) float64 { return float64(x[r*d+k]) }
		if r == traceRow {
			xr = func(int) float64 { return a }
		}
		for j := range I {
			var g, u span
			for k := range d {
				g.add(xr(k) * float64(w1[j*d+k]))
				u.add(xr(k) * float64(w3[j*d+k]))
			}
			note(0, g, g.oneSigned())
			note(1, u, u.oneSigned())
			// |silu(g)| ≤ |g|; the sign of h is known where both sums are one-signed.
			h[j] = wr[p] * g.sum / (1 + math.Exp(-g.sum)) * u.sum
			hb[j], hok[j] = wr[p]*g.abs*u.abs, g.oneSigned() && u.oneSigned()
			note(2, span{sum: h[j], abs: hb[j]}, hok[j])
		}
		for i := range d {
			var y span
			ok := true
			for j := range I {
				y.add(h[j] * float64(w2[i*I+j]))
				ok = ok && hok[j]
			}
			y.abs = 0
			for j := range I {
				y.abs += hb[j] * math.Abs(float64(w2[i*I+j]))
			}
			note(3, y, ok && y.oneSigned())
		}
	}
	return st
}

// loudInput picks the least power of two for the loud row that surely
// overflows stage k, and checks that every earlier stage stays 2^24 inside
// the fp32 range there (both grow with the loud row: a binary search).
func loudInput(ex *checkpoint.Expert, x []float32, rows []int, wr []float64, d, k int) (float64, bool) {
	w1, w3, w2 := dequantFP4(&ex.W1), dequantFP4(&ex.W3), dequantFP4(&ex.W2)
	model := func(m int) [4]stageBound { return traceModel(w1, w3, w2, x, rows, wr, d, math.Ldexp(1, m)) }
	m := sort.Search(128, func(m int) bool { return model(m)[k].sure })
	if m == 128 {
		return 0, false
	}
	st := model(m)
	for _, s := range st[:k] {
		if s.abs > math.Ldexp(math.MaxFloat32, -24) {
			return 0, false
		}
	}
	return math.Ldexp(1, m), true
}

// testExpertsTrace runs every trace case on format f with E experts, top-K.
func testExpertsTrace(t *testing.T, p *opcheck.Pair, f checkpoint.Format, E, K int) {
	const n, dim, inter = 8, 256, 128
	for k, edit := range traceCases {
		tag := fmt.Sprintf("trace %v E=%d K=%d %s", f, E, K, traceStages[k])
		idv, wv := opcheck.Routing(p, n, E, K)
		e := int32(E) // the loud row's first expert: the tracer reports it first
		for _, id := range idv[traceRow*K : (traceRow+1)*K] {
			e = min(e, id)
		}
		ex := opcheck.RandExperts(p, f, E, dim, inter)
		edit(&ex[e], p.Rng.IntN(inter), p.Rng.IntN(dim))
		xv := make([]float32, n*dim)
		for i := range xv {
			xv[i] = num.RoundBF16(float32(p.Rng.NormFloat64()))
		}
		var rows []int
		var wr []float64
		for i, id := range idv {
			if id == e {
				rows, wr = append(rows, i/K), append(wr, float64(wv[i]))
			}
		}
		a, ok := loudInput(&ex[e], xv, rows, wr, dim, k)
		if !ok {
			t.Fatalf("%s: no loud row overflows only %s", tag, traceStages[k])
		}
		for i := traceRow * dim; i < (traceRow+1)*dim; i++ {
			xv[i] = float32(a)
		}
		ce, err := p.C.PrepareExperts("moe", ex, dim, inter)
		must(t, err)
		ge, err := p.G.PrepareExperts("moe", ex, dim, inter)
		must(t, err)
		x, ids, w := p.From(n, dim, xv), p.IDs(n, K, idv), p.From(n, K, wv)
		acc := p.Out(n, dim)
		args := backend.ExpertsArgs{Trace: true}
		cerr := p.C.Experts(x.C, ce, w.C, ids.C, args, acc.C)
		gerr := p.G.Experts(x.G, ge, w.G, ids.G, args, acc.G)
		var cn, gn *backend.OpNonFinite
		if !errors.As(cerr, &cn) || !errors.As(gerr, &gn) {
			t.Fatalf("%s (loud row %g): cpu %v, gpu %v; want *OpNonFinite from both", tag, a, cerr, gerr)
		}
		want := fmt.Sprintf("expert %d %s", e, traceStages[k])
		if cn.Component != want || gn.Component != want || cn.Row != gn.Row {
			t.Errorf("%s (loud row %g): cpu %q row %d, gpu %q row %d; want %q", tag, a, cn.Component, cn.Row, gn.Component, gn.Row, want)
		}
	}
}
