package cpu

import (
	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/num"
)

// quantFP8 simulates the reference act_quant on x in blocks of `block` values:
// power-of-two scale 2^ceil(log2(amax/448)) (amax ≥ 1e-4), e4m3 round-to-nearest-even,
// written back as q·s (exact in bf16). Spec §3.3.
func quantFP8(x []float32, block int) {
	const inv448 = float32(1.0 / 448.0)
	for b0 := 0; b0 < len(x); b0 += block {
		blk := x[b0:min(b0+block, len(x))]
		var amax float32
		for _, v := range blk {
			if v < 0 {
				v = -v
			}
			if v > amax || v != v {
				amax = v
			}
		}
		amax = max(amax, 1e-4)
		e := num.CeilLog2(float32(amax * inv448))
		s := num.Pow2F32(e)
		for i, v := range blk {
			q := v / s
			q = min(max(q, -448), 448)
			blk[i] = num.E4M3Table[num.F32ToE4M3(q)] * s
		}
	}
}

// quantFP4 simulates fp4_act_quant (block 32, amax ≥ 6·2^-126, e2m1 ties-to-even).
func quantFP4(x []float32, block int) {
	const inv6 = float32(1.0 / 6.0)
	floor := float32(6) * num.Pow2F32(-126)
	for b0 := 0; b0 < len(x); b0 += block {
		blk := x[b0:min(b0+block, len(x))]
		var amax float32
		for _, v := range blk {
			if v < 0 {
				v = -v
			}
			if v > amax || v != v {
				amax = v
			}
		}
		amax = max(amax, floor)
		s := num.Pow2F32(num.CeilLog2(float32(amax * inv6)))
		for i, v := range blk {
			q := min(max(v/s, -6), 6)
			blk[i] = num.E2M1Table[num.F32ToE2M1(q)] * s
		}
	}
}

// hadamard applies the Sylvester Walsh–Hadamard transform scaled by n^-1/2 (fp32).
func hadamard(x []float32) {
	n := len(x)
	for h := 1; h < n; h *= 2 {
		for i := 0; i < n; i += 2 * h {
			for j := i; j < i+h; j++ {
				a, c := x[j], x[j+h]
				x[j], x[j+h] = a+c, a-c
			}
		}
	}
	s := float32(1 / sqrt64(float64(n)))
	for i := range x {
		x[i] *= s
	}
}

// dot is an fp32 dot product with four partial sums (deterministic order).
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// matmul computes out[r, o] = W[o]·x[r] for n rows of width in, writing columns
// [col0, col0+out) of rows of width ldo. Parallel over output columns; rows of
// lazily dequantised weights are expanded once per worker chunk.
func (b *Backend) matmul(x []float32, n int, l *linear, out []float32, ldo, col0 int, round bool) {
	in := l.in
	b.parallel(l.out, func(lo, hi int) {
		var scratch []float32
		if l.dense == nil {
			scratch = make([]float32, in)
		}
		for o := lo; o < hi; o++ {
			w := l.row(o, scratch)
			for r := range n {
				v := dot(x[r*in:(r+1)*in], w)
				if round {
					v = num.RoundBF16(v)
				}
				out[r*ldo+col0+o] = v
			}
		}
	})
}

// quantRows returns x (n rows of width in) FP8-quantised per 128 in faithful mode.
func (b *Backend) quantRows(x []float32, n, in int) []float32 {
	if !b.faithful() {
		return x
	}
	q := make([]float32, len(x))
	copy(q, x)
	b.parallel(n, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			quantFP8(q[r*in:(r+1)*in], 128)
		}
	})
	return q
}

// Linear implements backend.Backend.
func (b *Backend) Linear(x backend.Tensor, w backend.Linear, out backend.Tensor) error {
	l, t, err := backend.Args[*linear, *Tensor](backend.CheckLinear(x, w, out), "linear", w, x, out)
	if err != nil {
		return err
	}
	xt, ot := t[0], t[1]
	xs := xt.F
	if l.quant {
		xs = b.quantRows(xs, xt.rows, l.in)
	}
	b.matmul(xs, xt.rows, l, ot.F, l.out, 0, b.faithful())
	return nil
}

// LinearF32 implements backend.Backend.
func (b *Backend) LinearF32(x backend.Tensor, w backend.Linear, out backend.Tensor) error {
	l, t, err := backend.Args[*linear, *Tensor](backend.CheckLinearF32(x, w, out), "linear-f32", w, x, out)
	if err != nil {
		return err
	}
	xt, ot := t[0], t[1]
	b.matmul(xt.F, xt.rows, l, ot.F, l.out, 0, false)
	return nil
}

// GroupedOutProj implements backend.Backend.
func (b *Backend) GroupedOutProj(x backend.Tensor, w backend.Linear, groups int, out backend.Tensor) error {
	l, t, err := backend.Args[*linear, *Tensor](backend.CheckGroupedOutProj(x, w, groups, out), "grouped out proj", w, x, out)
	if err != nil {
		return err
	}
	xt, ot := t[0], t[1]
	R, K, n := l.out/groups, l.in, xt.rows
	round := b.faithful()
	b.parallel(l.out, func(lo, hi int) {
		var scratch []float32
		if l.dense == nil {
			scratch = make([]float32, K)
		}
		for o := lo; o < hi; o++ {
			g := o / R
			wr := l.row(o, scratch)
			for r := range n {
				v := dot(xt.F[r*groups*K+g*K:r*groups*K+(g+1)*K], wr)
				if round {
					v = num.RoundBF16(v)
				}
				ot.F[r*l.out+o] = v
			}
		}
	})
	return nil
}

// Scale implements backend.Backend.
func (b *Backend) Scale(x backend.Tensor, s float32) error {
	xt, err := backend.As[*Tensor](backend.CheckScale(x), "scale", x)
	if err != nil {
		return err
	}
	for i, v := range xt.F {
		xt.F[i] = b.rb(v * s)
	}
	return nil
}

// GatherRows implements backend.Backend.
func (b *Backend) GatherRows(x backend.Tensor, rows []int, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckGatherRows(x, rows, out), "gather", x, out)
	if err != nil {
		return err
	}
	for i, r := range rows {
		copy(t[1].Row(i), t[0].Row(r))
	}
	return nil
}
