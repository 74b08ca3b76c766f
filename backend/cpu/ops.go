package cpu

import (
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/num"
)

func sqrt64(x float64) float64 { return math.Sqrt(x) }

func sigmoid32(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

func exp32(x float32) float32 { return float32(math.Exp(float64(x))) }

// Embed implements backend.Backend.
func (b *Backend) Embed(e backend.Embedding, ids []int32, streams int, out backend.Tensor) error {
	em, t, err := backend.Args[*embedding, *Tensor](backend.CheckEmbed(e, ids, streams, out), "embed", e, out)
	if err != nil {
		return err
	}
	ot := t[0]
	for r, id := range ids {
		row := ot.Row(r)
		em.row(int(id), row[:em.dim])
		for s := 1; s < streams; s++ {
			copy(row[s*em.dim:(s+1)*em.dim], row[:em.dim])
		}
	}
	return nil
}

// rmsnorm normalises x into y with weight w (fp32 compute, optional bf16 out).
func rmsnorm(x, w, y []float32, eps float32, round bool) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	mean := float32(ss / float64(len(x)))
	r := float32(1 / math.Sqrt(float64(mean+eps)))
	for i, v := range x {
		o := w[i] * float32(v*r)
		if round {
			o = num.RoundBF16(o)
		}
		y[i] = o
	}
}

// RMSNorm implements backend.Backend.
func (b *Backend) RMSNorm(x backend.Tensor, w backend.Vec, eps float32, out backend.Tensor) error {
	wv, t, err := backend.Args[*vec, *Tensor](backend.CheckRMSNorm(x, w, out), "rmsnorm", w, x, out)
	if err != nil {
		return err
	}
	xt, ot, d := t[0], t[1], len(wv.v)
	segs := xt.rows * xt.cols / d
	round := b.faithful()
	b.parallel(segs, func(lo, hi int) {
		for s := lo; s < hi; s++ {
			rmsnorm(xt.F[s*d:(s+1)*d], wv.v, ot.F[s*d:(s+1)*d], eps, round)
		}
	})
	return nil
}

// HeadNorm implements backend.Backend: q_h / sqrt(mean(q_h²)+eps), in faithful
// mode with every step rounded to bf16 (spec §5.3).
func (b *Backend) HeadNorm(x backend.Tensor, headDim int, eps float32) error {
	xt, err := backend.As[*Tensor](backend.CheckHeadNorm(x, headDim), "head norm", x)
	if err != nil {
		return err
	}
	segs := len(xt.F) / headDim
	f := b.faithful()
	b.parallel(segs, func(lo, hi int) {
		for s := lo; s < hi; s++ {
			q := xt.F[s*headDim : (s+1)*headDim]
			var acc float32
			var acc64 float64
			for _, v := range q {
				if f {
					acc += num.RoundBF16(v * v)
				} else {
					acc64 += float64(v) * float64(v)
				}
			}
			if f {
				mean := num.RoundBF16(acc / float32(headDim))
				ms := num.RoundBF16(mean + eps)
				rs := num.RoundBF16(float32(1 / math.Sqrt(float64(ms))))
				for i, v := range q {
					q[i] = num.RoundBF16(v * rs)
				}
			} else {
				rs := float32(1 / math.Sqrt(acc64/float64(headDim)+float64(eps)))
				for i, v := range q {
					q[i] = v * rs
				}
			}
		}
	})
	return nil
}

// hcMix computes the projected, rsqrt-scaled mixing values m (spec §4.2 steps 1–2).
func hcMix(x []float32, h *hc, normEps float32, m []float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	r := float32(1 / math.Sqrt(float64(float32(ss/float64(len(x)))+normEps)))
	for i := range h.mix {
		m[i] = float32(dot(h.fn[i*h.width:(i+1)*h.width], x) * r)
	}
}

// sinkhorn makes c (n×n, row-major) doubly stochastic as the reference kernel does.
func sinkhorn(c []float32, n, iters int, eps float32) {
	for j := range n {
		row := c[j*n : (j+1)*n]
		mx := row[0]
		for _, v := range row[1:] {
			mx = max(mx, v)
		}
		var s float32
		for k := range row {
			row[k] = exp32(row[k] - mx)
			s += row[k]
		}
		for k := range row {
			row[k] = row[k]/s + eps
		}
	}
	col := func() {
		for k := range n {
			var s float32
			for j := range n {
				s += c[j*n+k]
			}
			s += eps
			for j := range n {
				c[j*n+k] /= s
			}
		}
	}
	col()
	for range iters - 1 {
		for j := range n {
			var s float32
			for k := range n {
				s += c[j*n+k]
			}
			s += eps
			for k := range n {
				c[j*n+k] /= s
			}
		}
		col()
	}
}

// HcPre implements backend.Backend (spec §4.2).
func (b *Backend) HcPre(x backend.Tensor, h backend.HC, a backend.HcArgs, out, mix backend.Tensor) error {
	hh, t, err := backend.Args[*hc, *Tensor](backend.CheckHcPre(x, h, a, out, mix), "hc pre", h, x, out, mix)
	if err != nil {
		return err
	}
	xt, ot, mt, n, d := t[0], t[1], t[2], a.Streams, x.Cols()/a.Streams
	round := b.faithful()
	b.parallel(xt.rows, func(lo, hi int) {
		m := make([]float32, hh.mix)
		pre := make([]float32, n)
		for r := lo; r < hi; r++ {
			x := xt.Row(r)
			hcMix(x, hh, a.NormEps, m)
			mr := mt.Row(r)
			for j := range n {
				pre[j] = sigmoid32(m[j]*hh.scale[0]+hh.base[j]) + a.Eps
				mr[j] = 2 * sigmoid32(m[n+j]*hh.scale[1]+hh.base[n+j])
			}
			c := mr[n:]
			for i := range n * n {
				c[i] = m[2*n+i]*hh.scale[2] + hh.base[2*n+i]
			}
			sinkhorn(c, n, a.Sinkhorn, a.Eps)
			o := ot.Row(r)
			for i := range d {
				var s float32
				for j := range n {
					s += pre[j] * x[j*d+i]
				}
				if round {
					s = num.RoundBF16(s)
				}
				o[i] = s
			}
		}
	})
	return nil
}

// HcPost implements backend.Backend: X'[k] = post[k]·o + Σ_j C[j][k]·X[j].
func (b *Backend) HcPost(o, x, mix backend.Tensor, a backend.HcArgs, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckHcPost(o, x, mix, a, out), "hc post", o, x, mix, out)
	if err != nil {
		return err
	}
	ot, xt, mt, yt, n, d := t[0], t[1], t[2], t[3], a.Streams, x.Cols()/a.Streams
	round := b.faithful()
	b.parallel(xt.rows, func(lo, hi int) {
		res := make([]float32, xt.cols)
		for r := lo; r < hi; r++ {
			xr, or, mr := xt.Row(r), ot.Row(r), mt.Row(r)
			copy(res, xr) // out may alias x
			post, c := mr[:n], mr[n:]
			yr := yt.Row(r)
			for k := range n {
				for i := range d {
					var s float32
					for j := range n {
						s += c[j*n+k] * res[j*d+i]
					}
					v := post[k]*or[i] + s
					if round {
						v = num.RoundBF16(v)
					}
					yr[k*d+i] = v
				}
			}
		}
	})
	return nil
}

// HcHead implements backend.Backend (spec §4.3).
func (b *Backend) HcHead(x backend.Tensor, h backend.HC, a backend.HcArgs, out backend.Tensor) error {
	hh, t, err := backend.Args[*hc, *Tensor](backend.CheckHcHead(x, h, a, out), "hc head", h, x, out)
	if err != nil {
		return err
	}
	xt, ot, n, d := t[0], t[1], a.Streams, x.Cols()/a.Streams
	round := b.faithful()
	b.parallel(xt.rows, func(lo, hi int) {
		m := make([]float32, n)
		pre := make([]float32, n)
		for r := lo; r < hi; r++ {
			x := xt.Row(r)
			hcMix(x, hh, a.NormEps, m)
			for j := range n {
				pre[j] = sigmoid32(m[j]*hh.scale[0]+hh.base[j]) + a.Eps
			}
			o := ot.Row(r)
			for i := range d {
				var s float32
				for j := range n {
					s += pre[j] * x[j*d+i]
				}
				if round {
					s = num.RoundBF16(s)
				}
				o[i] = s
			}
		}
	})
	return nil
}

// AddStreams implements backend.Backend.
func (b *Backend) AddStreams(x, e backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckAddStreams(x, e), "add streams", x, e)
	if err != nil {
		return err
	}
	xt, et := t[0], t[1]
	d := et.cols
	for r := range xt.rows {
		xr, er := xt.Row(r), et.Row(r)
		for i := range xr {
			xr[i] = b.rb(xr[i] + er[i%d])
		}
	}
	return nil
}

// Rope implements backend.Backend: interleaved pairs on the last rope dims of
// every head (spec §5.2), fp32 recipe in faithful mode, float64 in exact mode.
func (b *Backend) Rope(x backend.Tensor, a backend.RopeArgs, bt *backend.Batch) error {
	xt, err := backend.As[*Tensor](backend.CheckRope(x, a, bt), "rope", x)
	if err != nil {
		return err
	}
	heads := xt.cols / a.HeadDim
	b.parallel(xt.rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			ropeRow(xt.Row(r), heads, a.HeadDim, int(bt.Pos[r]), a.Freqs, a.Inverse, b.faithful())
		}
	})
	return nil
}

// ropeRow rotates the rope part of each head of row.
func ropeRow(row []float32, heads, headDim, pos int, f interface {
	Dim() int
	CosSin32(int, int) (float32, float32)
	CosSin64(int, int) (float64, float64)
}, inverse, faithful bool) {
	rd := f.Dim()
	for p := range rd / 2 {
		if faithful {
			c, s := f.CosSin32(pos, p)
			if inverse {
				s = -s
			}
			for h := range heads {
				i := h*headDim + headDim - rd + 2*p
				x0, x1 := row[i], row[i+1]
				row[i] = num.RoundBF16(float32(x0*c) - float32(x1*s))
				row[i+1] = num.RoundBF16(float32(x0*s) + float32(x1*c))
			}
		} else {
			c, s := f.CosSin64(pos, p)
			if inverse {
				s = -s
			}
			for h := range heads {
				i := h*headDim + headDim - rd + 2*p
				x0, x1 := float64(row[i]), float64(row[i+1])
				row[i] = float32(x0*c - x1*s)
				row[i+1] = float32(x0*s + x1*c)
			}
		}
	}
}

// KVQuant implements backend.Backend (FP8 simulation, faithful mode only).
func (b *Backend) KVQuant(x backend.Tensor, nope, block int) error {
	xt, err := backend.As[*Tensor](backend.CheckKVQuant(x, nope, block), "kv quant", x)
	if err != nil {
		return err
	}
	if !b.faithful() {
		return nil
	}
	b.parallel(xt.rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			quantFP8(xt.Row(r)[:nope], block)
		}
	})
	return nil
}

// hadamardFP4 rotates one head and simulates FP4 in faithful mode.
func hadamardFP4(h []float32, faithful bool) {
	hadamard(h)
	if faithful {
		num.RoundBF16Slice(h)
		quantFP4(h, 32)
	}
}

// HadamardFP4 implements backend.Backend.
func (b *Backend) HadamardFP4(x backend.Tensor, headDim int) error {
	xt, err := backend.As[*Tensor](backend.CheckHadamardFP4(x, headDim), "hadamard", x)
	if err != nil {
		return err
	}
	segs := len(xt.F) / headDim
	b.parallel(segs, func(lo, hi int) {
		for s := lo; s < hi; s++ {
			hadamardFP4(xt.F[s*headDim:(s+1)*headDim], b.faithful())
		}
	})
	return nil
}

// swiglu is the clamped SwiGLU of spec §6.2 in fp32, times the routing weight.
func swiglu(g, u, w float32, limit float32) float32 {
	if limit > 0 {
		u = min(max(u, -limit), limit)
		g = min(g, limit)
	}
	return w * (g * sigmoid32(g) * u)
}

// SwiGLU implements backend.Backend.
func (b *Backend) SwiGLU(g, u backend.Tensor, limit float32, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckSwiGLU(g, u, out), "swiglu", g, u, out)
	if err != nil {
		return err
	}
	gt, ut, ot := t[0], t[1], t[2]
	for i := range gt.F {
		ot.F[i] = b.rb(swiglu(gt.F[i], ut.F[i], 1, limit))
	}
	return nil
}

// Combine implements backend.Backend.
func (b *Backend) Combine(acc, shared, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckCombine(acc, shared, out), "combine", acc, shared, out)
	if err != nil {
		return err
	}
	at, st, ot := t[0], t[1], t[2]
	for i := range at.F {
		ot.F[i] = b.rb(at.F[i] + st.F[i])
	}
	return nil
}
