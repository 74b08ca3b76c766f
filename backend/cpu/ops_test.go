package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/rope"
)

func rnd(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 1)) }

func randVec(r *rand.Rand, n int, std float64, bf16 bool) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * std)
		if bf16 {
			v[i] = num.RoundBF16(v[i])
		}
	}
	return v
}

func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i := range got {
		num = math.Max(num, math.Abs(float64(got[i])-want[i]))
		den = math.Max(den, math.Abs(want[i]))
	}
	return num / math.Max(den, 1e-300)
}

func newB(mode backend.Numerics) *Backend {
	b := New(Options{Threads: 2})
	b.SetNumerics(mode)
	return b
}

// hcRef is float64 HcPre + HcPost of spec §4.2 (Sinkhorn with eps everywhere,
// HcPost with the transposed comb).
func hcRef(x []float64, fn, base, scale []float64, o []float64, n, d, iters int, eps, normEps float64) (a, y []float64) {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+normEps)
	mix := (2 + n) * n
	m := make([]float64, mix)
	for i := range mix {
		var s float64
		for k := range n * d {
			s += fn[i*n*d+k] * x[k]
		}
		m[i] = s * r
	}
	sig := func(z float64) float64 { return 1 / (1 + math.Exp(-z)) }
	pre, post := make([]float64, n), make([]float64, n)
	c := make([]float64, n*n)
	for j := range n {
		pre[j] = sig(m[j]*scale[0]+base[j]) + eps
		post[j] = 2 * sig(m[n+j]*scale[1]+base[n+j])
	}
	for i := range n * n {
		c[i] = m[2*n+i]*scale[2] + base[2*n+i]
	}
	for j := range n {
		mx := math.Inf(-1)
		for k := range n {
			mx = math.Max(mx, c[j*n+k])
		}
		var s float64
		for k := range n {
			s += math.Exp(c[j*n+k] - mx)
		}
		for k := range n {
			c[j*n+k] = math.Exp(c[j*n+k]-mx)/s + eps
		}
	}
	colNorm := func() {
		for k := range n {
			var s float64
			for j := range n {
				s += c[j*n+k]
			}
			for j := range n {
				c[j*n+k] /= s + eps
			}
		}
	}
	colNorm()
	for range iters - 1 {
		for j := range n {
			var s float64
			for k := range n {
				s += c[j*n+k]
			}
			for k := range n {
				c[j*n+k] /= s + eps
			}
		}
		colNorm()
	}
	a = make([]float64, d)
	for i := range d {
		for j := range n {
			a[i] += pre[j] * x[j*d+i]
		}
	}
	y = make([]float64, n*d)
	for k := range n {
		for i := range d {
			var s float64
			for j := range n {
				s += c[j*n+k] * x[j*d+i]
			}
			y[k*d+i] = post[k]*o[i] + s
		}
	}
	return a, y
}

func f64(v []float32) []float64 {
	o := make([]float64, len(v))
	for i, x := range v {
		o[i] = float64(x)
	}
	return o
}

func TestHcPrePostVsFloat64(t *testing.T) {
	const n, d, rows = 4, 64, 3
	r := rnd(1)
	fn := randVec(r, (2+n)*n*n*d, 0.05, false)
	base := randVec(r, (2+n)*n, 0.5, false)
	// Strongly asymmetric comb base so that using C instead of Cᵀ is caught.
	for j := range n {
		base[2*n+j*n+(j+1)%n] += 3
	}
	scale := []float32{0.7, 1.3, 0.9}
	h := NewHC((2+n)*n, n*d, fn, base, scale)
	args := backend.HcArgs{Streams: n, Sinkhorn: 20, Eps: 1e-6, NormEps: 1e-6}
	for _, tc := range []struct {
		mode backend.Numerics
		tol  float64
	}{{backend.Exact, 1e-5}, {backend.Faithful, 1e-2}} {
		b := newB(tc.mode)
		xs := randVec(r, rows*n*d, 1, true)
		os := randVec(r, rows*d, 1, true)
		x := NewTensor(rows, n*d, append([]float32(nil), xs...))
		a := b.Alloc(rows, d, backend.F32).(*Tensor)
		mix := b.Alloc(rows, n+n*n, backend.F32).(*Tensor)
		if err := b.HcPre(x, h, args, a, mix); err != nil {
			t.Fatal(err)
		}
		y := b.Alloc(rows, n*d, backend.F32).(*Tensor)
		if err := b.HcPost(NewTensor(rows, d, os), x, mix, args, y); err != nil {
			t.Fatal(err)
		}
		for row := range rows {
			wa, wy := hcRef(f64(xs[row*n*d:(row+1)*n*d]), f64(fn), f64(base), f64(scale), f64(os[row*d:(row+1)*d]), n, d, 20, 1e-6, 1e-6)
			if e := relErr(a.Row(row), wa); e > tc.tol {
				t.Errorf("%v row %d: HcPre rel err %.3g > %g", tc.mode, row, e, tc.tol)
			}
			if e := relErr(y.Row(row), wy); e > tc.tol {
				t.Errorf("%v row %d: HcPost rel err %.3g > %g", tc.mode, row, e, tc.tol)
			}
			// Doubly stochastic (up to eps): columns sum to ~1.
			c := mix.Row(row)[n:]
			for k := range n {
				var s float64
				for j := range n {
					s += float64(c[j*n+k])
				}
				if math.Abs(s-1) > 1e-4 {
					t.Errorf("column %d of comb sums to %g", k, s)
				}
			}
		}
	}
}

func TestRMSNormAndHeadNorm(t *testing.T) {
	r := rnd(2)
	x := randVec(r, 2*128, 3, true)
	w := randVec(r, 64, 1, true)
	b := newB(backend.Exact)
	out := b.Alloc(2, 128, backend.F32).(*Tensor)
	if err := b.RMSNorm(NewTensor(2, 128, x), NewVec(w), 1e-6, out); err != nil {
		t.Fatal(err)
	}
	for s := range 4 { // per 64-wide segment
		var ss float64
		for _, v := range x[s*64 : (s+1)*64] {
			ss += float64(v) * float64(v)
		}
		rr := 1 / math.Sqrt(ss/64+1e-6)
		want := make([]float64, 64)
		for i := range want {
			want[i] = float64(w[i]) * float64(x[s*64+i]) * rr
		}
		if e := relErr(out.F[s*64:(s+1)*64], want); e > 1e-6 {
			t.Errorf("segment %d rel err %g", s, e)
		}
	}
	// Faithful per-head norm: every step bf16 (spec §5.3), compared with a direct recipe.
	bf := newB(backend.Faithful)
	q := append([]float32(nil), x...)
	if err := bf.HeadNorm(NewTensor(1, 256, q), 128, 1e-6); err != nil {
		t.Fatal(err)
	}
	for h := range 2 {
		var acc float32
		for _, v := range x[h*128 : (h+1)*128] {
			acc += num.RoundBF16(v * v)
		}
		rs := num.RoundBF16(float32(1 / math.Sqrt(float64(num.RoundBF16(num.RoundBF16(acc/128)+1e-6)))))
		for i := range 128 {
			if want := num.RoundBF16(x[h*128+i] * rs); q[h*128+i] != want {
				t.Fatalf("head %d dim %d: %g, want %g", h, i, q[h*128+i], want)
			}
		}
	}
}

func TestRopeVsFloat64(t *testing.T) {
	f, err := rope.New(64, 160000, &rope.YaRN{Factor: 16, OriginalLen: 65536, BetaFast: 32, BetaSlow: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := rnd(3)
	const heads, hd = 2, 128
	pos := []int32{0, 1, 127, 4095, 70000}
	bt := &backend.Batch{Pos: pos, Seq: make([]int32, len(pos))}
	x0 := randVec(r, len(pos)*heads*hd, 1, true)
	for _, mode := range []backend.Numerics{backend.Exact, backend.Faithful} {
		b := newB(mode)
		x := NewTensor(len(pos), heads*hd, append([]float32(nil), x0...))
		if err := b.Rope(x, backend.RopeArgs{Freqs: f, HeadDim: hd}, bt); err != nil {
			t.Fatal(err)
		}
		tol := 1e-6
		if mode == backend.Faithful {
			tol = 1e-2 // bf16 storage; fp32 angle error pos·2^-24 (70000 → 4e-3 rad)
		}
		for ri, p := range pos {
			want := f64(x0[ri*heads*hd : (ri+1)*heads*hd])
			for h := range heads {
				for k := range 32 {
					i := h*hd + 64 + 2*k
					th := float64(p) * f.F64[k]
					a, c := want[i], want[i+1]
					want[i], want[i+1] = a*math.Cos(th)-c*math.Sin(th), a*math.Sin(th)+c*math.Cos(th)
				}
			}
			if e := relErr(x.Row(ri), want); e > tol {
				t.Errorf("%v pos %d: rel err %.3g > %g", mode, p, e, tol)
			}
		}
		// inverse undoes the rotation
		if err := b.Rope(x, backend.RopeArgs{Freqs: f, HeadDim: hd, Inverse: true}, bt); err != nil {
			t.Fatal(err)
		}
		if e := relErr(x.F, f64(x0)); e > 2*tol {
			t.Errorf("%v: inverse rel err %.3g", mode, e)
		}
	}
}

func TestSwiGLUClamp(t *testing.T) {
	b := newB(backend.Exact)
	cases := []struct{ g, u, want float64 }{
		{1, 2, 2 * 1 / (1 + math.Exp(-1))},
		{15, 1, 10 / (1 + math.Exp(-10))},         // gate clamped to 10 from above
		{-15, 1, -15 / (1 + math.Exp(15))},        // gate not clamped from below
		{2, 50, 10 * 2 / (1 + math.Exp(-2))},      // up clamped to +10
		{2, -50, -10 * 2 / (1 + math.Exp(-2))},    // up clamped to -10
		{12, -12, -10 * 10 / (1 + math.Exp(-10))}, // both
	}
	g, u := NewTensor(1, len(cases), nil), NewTensor(1, len(cases), nil)
	for _, c := range cases {
		g.F = append(g.F, float32(c.g))
		u.F = append(u.F, float32(c.u))
	}
	out := b.Alloc(1, len(cases), backend.F32).(*Tensor)
	if err := b.SwiGLU(g, u, 10, out); err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		if math.Abs(float64(out.F[i])-c.want) > 1e-5*math.Max(1, math.Abs(c.want)) {
			t.Errorf("swiglu(%g, %g) = %g, want %g", c.g, c.u, out.F[i], c.want)
		}
	}
}

func TestQuantFP8FP4(t *testing.T) {
	// amax 448 → scale 1, values are e4m3-rounded.
	x := []float32{448, 1.0625, -3.3, 0.001}
	quantFP8(x, 4)
	want := []float32{448, 1, -3.25, num.E4M3ToF32(num.F32ToE4M3(0.001))}
	for i := range x {
		if x[i] != want[i] {
			t.Errorf("fp8 %d: %g want %g", i, x[i], want[i])
		}
	}
	// amax 12 → scale 2^ceil(log2(2)) = 2; 2.5/2=1.25 → 1 (ties to even) → 2; 5/2 = 2.5 → 2 → 4.
	y := []float32{12, 2.5, 5, -7}
	quantFP4(y, 4)
	wy := []float32{12, 2, 4, -8}
	for i := range y {
		if y[i] != wy[i] {
			t.Errorf("fp4 %d: %g want %g", i, y[i], wy[i])
		}
	}
	// zero block: amax floor keeps it finite and zero.
	z := make([]float32, 32)
	quantFP8(z, 32)
	quantFP4(z, 32)
	for _, v := range z {
		if v != 0 {
			t.Fatal("zero block changed")
		}
	}
}

func TestHadamardOrthogonal(t *testing.T) {
	r := rnd(4)
	x := randVec(r, 128, 1, false)
	y := append([]float32(nil), x...)
	hadamard(y)
	// H/√n is symmetric and orthogonal: applying twice is the identity.
	hadamard(y)
	if e := relErr(y, f64(x)); e > 1e-5 {
		t.Fatalf("H·H ≠ I: %g", e)
	}
	// First row of H is all ones: y[0] = Σx/√n.
	z := append([]float32(nil), x...)
	hadamard(z)
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	if math.Abs(float64(z[0])-s/math.Sqrt(128)) > 1e-4 {
		t.Fatalf("y[0] = %g want %g", z[0], s/math.Sqrt(128))
	}
}
