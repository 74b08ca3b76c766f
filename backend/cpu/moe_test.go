package cpu

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/safetensors"
)

func bf16Linear(name string, out, in int, v []float32) *checkpoint.Linear {
	b := make([]byte, 2*len(v))
	num.EncodeBF16(v, b)
	return &checkpoint.Linear{Name: name, Format: checkpoint.FormatBF16, Out: out, In: in,
		Weight: safetensors.Tensor{Name: name, DType: safetensors.BF16, Shape: []int{out, in}, Data: b}}
}

func TestRouter(t *testing.T) {
	const E, d, K = 6, 4, 2
	b := newB(backend.Exact)
	// Gate rows: expert e has logit e·x0 - so scores grow with e for x0 > 0.
	gv := make([]float32, E*d)
	for e := range E {
		gv[e*d] = float32(e) * 0.5
	}
	gate, err := b.PrepareLinear(bf16Linear("gate", E, d, gv))
	if err != nil {
		t.Fatal(err)
	}
	f := NewTensor(2, d, []float32{1, 0, 0, 0, 1, 0, 0, 0})
	sp := func(z float64) float64 { return math.Sqrt(math.Log1p(math.Exp(z))) }
	// Bias equalises experts 1 and 4 with the top (5): s+bias ties → lower id wins.
	bias := make([]float32, E)
	bias[1] = float32(sp(2.5) - sp(0.5))
	bias[4] = float32(sp(2.5) - sp(2))
	w := b.Alloc(2, K, backend.F32).(*Tensor)
	ids := b.Alloc(2, K, backend.I32).(*Tensor)
	if err := b.Router(f, gate, backend.RouterArgs{TopK: K, Scale: 1.5, Bias: NewVec(bias)}, w, ids); err != nil {
		t.Fatal(err)
	}
	// s+bias: e1 = e4 = e5 = sp(2.5) (up to fp32); ties keep the lower id: {1, 4}.
	t.Logf("ids %v weights %v", ids.I, w.F)
	if ids.I[0] != 1 || ids.I[1] != 4 {
		t.Errorf("biased ties: ids %v, want [1 4]", ids.I[:2])
	}
	s1, s4 := sp(0.5), sp(2)
	if math.Abs(float64(w.F[0])-1.5*s1/(s1+s4)) > 1e-5 || math.Abs(float64(w.F[1])-1.5*s4/(s1+s4)) > 1e-5 {
		t.Errorf("weights %v: unbiased scores renormalised ×1.5 expected", w.F[:2])
	}
	// Hash routing: ids from tid2eid[token], weights from the gate scores.
	tb := make([]byte, 8*3*K)
	for i, v := range []int64{5, 0, 2, 3, 1, 4} {
		binary.LittleEndian.PutUint64(tb[8*i:], uint64(v))
	}
	tab, err := b.PrepareIDTable("tid2eid", safetensors.Tensor{DType: safetensors.I64, Shape: []int{3, K}, Data: tb}, 3, K)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Router(f, gate, backend.RouterArgs{TopK: K, Scale: 1, Tid2Eid: tab, IDs: []int32{2, 0}}, w, ids); err != nil {
		t.Fatal(err)
	}
	if ids.I[0] != 1 || ids.I[1] != 4 || ids.I[2] != 5 || ids.I[3] != 0 {
		t.Errorf("hash ids %v, want [1 4 5 0]", ids.I)
	}
	s5, s0 := sp(2.5), sp(0)
	if math.Abs(float64(w.F[2])-s5/(s5+s0)) > 1e-5 {
		t.Errorf("hash weights %v", w.F)
	}
	if err := b.Router(f, gate, backend.RouterArgs{TopK: K, Scale: 1, Tid2Eid: tab, IDs: []int32{3, 0}}, w, ids); err == nil {
		t.Error("token id outside tid2eid accepted")
	}
}

func TestTopKTies(t *testing.T) {
	idx := make([]int32, 3)
	topK([]float32{1, 3, 3, float32(math.NaN()), 2, 3}, idx)
	if idx[0] != 1 || idx[1] != 2 || idx[2] != 5 {
		t.Errorf("topK = %v, want [1 2 5]", idx)
	}
}

// TestLazyEqualsDense: row-by-row dequantisation gives the same linear as the
// pre-dequantised matrix for FP8 blocks (partial edge blocks too).
func TestLazyEqualsDense(t *testing.T) {
	rg := rnd(8)
	const out, in = 130, 200
	codes := make([]byte, out*in)
	for i := range codes {
		c := byte(rg.IntN(256))
		if c&0x7f == 0x7f {
			c = 0
		}
		codes[i] = c
	}
	sc := []byte{120, 121, 122, 119}
	l := &checkpoint.Linear{Name: "w", Format: checkpoint.FormatFP8Block, Out: out, In: in,
		Weight: safetensors.Tensor{DType: safetensors.F8E4M3, Data: codes}, Scale: safetensors.Tensor{DType: safetensors.F8E8M0, Data: sc}}
	x := NewTensor(3, in, randVec(rg, 3*in, 1, true))
	var res [2][]float32
	for i, budget := range []int64{0, -1} {
		b := New(Options{Threads: 2, DenseBudget: budget})
		w, err := b.PrepareLinear(l)
		if err != nil {
			t.Fatal(err)
		}
		if (w.(*linear).dense != nil) != (budget == 0) {
			t.Fatalf("budget %d: dense=%v", budget, w.(*linear).dense != nil)
		}
		o := b.Alloc(3, out, backend.F32).(*Tensor)
		if err := b.Linear(x, w, o); err != nil {
			t.Fatal(err)
		}
		res[i] = o.F
	}
	for i := range res[0] {
		if res[0][i] != res[1][i] {
			t.Fatalf("lazy %g != dense %g at %d", res[1][i], res[0][i], i)
		}
	}
	// Spot check one element against float64.
	var want float64
	xq := append([]float32(nil), x.Row(0)...)
	quantFP8(xq, 128)
	for c := range in {
		want += float64(xq[c]) * float64(num.E4M3ToF32(codes[129*in+c])) * math.Ldexp(1, int(sc[2+c/128])-127)
	}
	if got := float64(res[0][129]); math.Abs(got-want) > 1e-2*math.Abs(want)+1e-6 {
		t.Errorf("row 129: %g want %g", got, want)
	}
}

// TestExpertsPartial: the experts split in two halves (Offset, Partial) add
// up to the whole set's output; without Partial a pair routed outside the
// local range is an error.
func TestExpertsPartial(t *testing.T) {
	rg := rnd(11)
	const E, K, n, dim, inter = 4, 2, 5, 8, 4
	ex := make([]checkpoint.Expert, E)
	for e := range ex {
		ex[e] = checkpoint.Expert{
			W1: *bf16Linear("w1", inter, dim, randVec(rg, inter*dim, 1, true)),
			W2: *bf16Linear("w2", dim, inter, randVec(rg, dim*inter, 1, true)),
			W3: *bf16Linear("w3", inter, dim, randVec(rg, inter*dim, 1, true)),
		}
	}
	b := New(Options{Threads: 2})
	b.SetNumerics(backend.Exact)
	x := NewTensor(n, dim, randVec(rg, n*dim, 1, true))
	ids := &Tensor{rows: n, cols: K, dt: backend.I32, I: []int32{0, 3, 1, 2, 2, 3, 0, 1, 3, 2}}
	w := NewTensor(n, K, randVec(rg, n*K, 1, false))
	run := func(lo, hi int, partial bool) ([]float32, error) {
		pe, err := b.PrepareExperts("moe", ex[lo:hi], dim, inter)
		if err != nil {
			t.Fatal(err)
		}
		acc := b.Alloc(n, dim, backend.F32).(*Tensor)
		err = b.Experts(x, pe, w, ids, backend.ExpertsArgs{Offset: lo, Partial: partial}, acc)
		return acc.F, err
	}
	whole, err := run(0, E, false)
	if err != nil {
		t.Fatal(err)
	}
	lo, err := run(0, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	hi, err := run(2, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	for i := range whole {
		if d := math.Abs(float64(whole[i] - (lo[i] + hi[i]))); d > 1e-5*(1+math.Abs(float64(whole[i]))) {
			t.Fatalf("[%d]: whole %g, halves %g + %g", i, whole[i], lo[i], hi[i])
		}
	}
	if _, err := run(2, 4, false); err == nil {
		t.Error("ids outside [2, 4) accepted without Partial")
	}
}

// TestExpertsTrace: each case overflows exactly one stage of expert 1 by a
// wide margin (a same-signed sum ≥ 8·MaxFloat32, every earlier stage far
// inside the range), so the tracer must name that stage whatever the
// summation order; expert 0 sees only ordinary rows and must stay silent.
func TestExpertsTrace(t *testing.T) {
	const E, K, n, d, I = 3, 2, 3, 8, 4
	fill := func(v []float32, x float32) []float32 {
		for i := range v {
			v[i] = x
		}
		return v
	}
	type expert struct{ w1, w3, w2 []float32 }
	for _, c := range []struct {
		stage string // "" for no overflow
		loud  float64
		edit  func(e *expert)
	}{
		{"", 1, func(*expert) {}},
		{"w1", 0x1p110, func(e *expert) { fill(e.w1[:d], 0x1p20) }},
		{"w3", 0x1p110, func(e *expert) { fill(e.w3[:d], 0x1p20) }},
		{"swiglu", 0x1p64, func(e *expert) { fill(e.w1[:d], 1); fill(e.w3[:d], 1) }},
		{"w2", 0x1p56, func(e *expert) { // h is zero but h_0 = 2^117; y_0 = h_0·2^20
			fill(e.w1, 0)
			fill(e.w3, 0)
			fill(e.w1[:d], 1)
			fill(e.w3[:d], 1)
			fill(e.w2[:I], 0x1p20)
		}},
	} {
		for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
			rg := rnd(21)
			ex := make([]checkpoint.Expert, E)
			for i := range ex {
				e := expert{randVec(rg, I*d, 1, true), randVec(rg, I*d, 1, true), randVec(rg, d*I, 1, true)}
				if i == 1 {
					c.edit(&e)
				}
				ex[i] = checkpoint.Expert{W1: *bf16Linear("w1", I, d, e.w1), W3: *bf16Linear("w3", I, d, e.w3), W2: *bf16Linear("w2", d, I, e.w2)}
			}
			b := newB(mode)
			pe, err := b.PrepareExperts("moe", ex, d, I)
			if err != nil {
				t.Fatal(err)
			}
			xv := randVec(rg, n*d, 1, true)
			fill(xv[d:2*d], float32(c.loud)) // row 1, expert 1's only row
			ids := &Tensor{rows: n, cols: K, dt: backend.I32, I: []int32{0, 2, 1, 2, 2, 0}}
			w := NewTensor(n, K, []float32{0.5, 0.5, 0.5, 0.5, 0.5, 0.5})
			acc := b.Alloc(n, d, backend.F32).(*Tensor)
			err = b.Experts(NewTensor(n, d, xv), pe, w, ids, backend.ExpertsArgs{Trace: true}, acc)
			var nf *backend.OpNonFinite
			switch {
			case c.stage == "" && err != nil:
				t.Errorf("%v, no overflow: %v", mode, err)
			case c.stage == "":
			case !errors.As(err, &nf):
				t.Errorf("%v %s: err %v, want *OpNonFinite", mode, c.stage, err)
			case nf.Component != "expert 1 "+c.stage || nf.Row != 1:
				t.Errorf("%v %s: %q row %d, want %q row 1", mode, c.stage, nf.Component, nf.Row, "expert 1 "+c.stage)
			}
		}
	}
}
