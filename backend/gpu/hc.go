package gpu

import (
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// checkHC validates an hc site against x like the CPU's and returns d.
func checkHC(x backend.Tensor, h backend.HC, a backend.HcArgs, what string) (*Tensor, *hc, int, error) {
	hh, ok := h.(*hc)
	if !ok || hh == nil {
		return nil, nil, 0, fmt.Errorf("%s: params %T", what, h)
	}
	xt, err := f32(x, -1, hh.width, what+" input")
	if err != nil {
		return nil, nil, 0, err
	}
	if a.Streams <= 0 || hh.width%a.Streams != 0 {
		return nil, nil, 0, fmt.Errorf("%s: width %d vs %d streams", what, hh.width, a.Streams)
	}
	return xt, hh, hh.width / a.Streams, nil
}

// HcPre implements backend.Backend (spec §4.2): one block per row.
func (b *Backend) HcPre(x backend.Tensor, h backend.HC, a backend.HcArgs, out, mix backend.Tensor) error {
	hh, t, err := backend.Args[*hc, *Tensor](backend.CheckHcPre(x, h, a, out, mix), "hc pre", h, x, out, mix)
	if err != nil {
		return err
	}
	xt, ot, mt, n, d := t[0], t[1], t[2], a.Streams, x.Cols()/a.Streams
	sc := [3]float32{hh.scale[0], hh.scale[1], hh.scale[2]}
	if err := cuda.HcPreF32(b.s, ot.ptr, mt.ptr, xt.ptr, hh.fn.Ptr, hh.base.Ptr, xt.rows, n, d, sc, a.Sinkhorn, a.Eps, a.NormEps, b.faithful()); err != nil {
		return fmt.Errorf("hc pre: %w", err)
	}
	return nil
}

// HcPreNorm is HcPre then RMSNorm: where hc pre takes its split
// path, the norm runs inside its final kernel (one launch fewer) and out is
// left holding the split's partials; elsewhere HcPre, then RMSNorm.
func (b *Backend) HcPreNorm(x backend.Tensor, h backend.HC, a backend.HcArgs, norm backend.Vec, eps float32, out, normed, mix backend.Tensor) error {
	_, err := b.hcPreNorm(x, h, a, norm, eps, out, normed, mix, nil)
	return err
}

// HcPreNormQuant is HcPreNorm whose fused final
// kernel also writes the FP8 quantisation that a linear of next would apply
// to normed (RMSNormQuant's handle); otherwise HcPreNorm, returning normed.
func (b *Backend) HcPreNormQuant(x backend.Tensor, h backend.HC, a backend.HcArgs, norm backend.Vec, eps float32, out, normed, mix backend.Tensor, next []backend.Linear) (backend.Tensor, error) {
	return b.hcPreNorm(x, h, a, norm, eps, out, normed, mix, next)
}

func (b *Backend) hcPreNorm(x backend.Tensor, h backend.HC, a backend.HcArgs, norm backend.Vec, eps float32, out, normed, mix backend.Tensor, next []backend.Linear) (backend.Tensor, error) {
	xt, hh, d, err := checkHC(x, h, a, "hc pre norm")
	if err != nil {
		return nil, err
	}
	n := a.Streams
	wv, ok := norm.(*vec)
	if hh.mix != (2+n)*n || len(hh.scale) != 3 || !ok || wv == nil || wv.Len() != d {
		return normed, b.hcPreThenNorm(x, h, a, norm, eps, out, normed, mix)
	}
	ot, err := f32(out, xt.rows, d, "hc pre norm output")
	if err != nil {
		return nil, err
	}
	yt, err := f32(normed, xt.rows, d, "hc pre norm normed")
	if err != nil {
		return nil, err
	}
	mt, err := f32(mix, xt.rows, n+n*n, "hc pre norm mix")
	if err != nil {
		return nil, err
	}
	// The handle's quantisation (RMSNormQuant's layout) where a linear of
	// next quantises a d-wide input; nil: normed alone.
	var h8 *Tensor
	var q, qs cuda.DevicePtr
	if xt.rows > 0 && d%128 == 0 && b.takesQuant(d, next) {
		if h8, err = b.quantHandle(yt); err != nil {
			return nil, fmt.Errorf("hc pre norm quant: %w", err)
		}
		q, qs = fp8Layout(h8.q8.Ptr, xt.rows, d)
	}
	sc := [3]float32{hh.scale[0], hh.scale[1], hh.scale[2]}
	fused, err := cuda.HcPreNormF32(b.s, yt.ptr, ot.ptr, mt.ptr, xt.ptr, hh.fn.Ptr, hh.base.Ptr, wv.buf.Ptr, q, qs, xt.rows, n, d, sc, a.Sinkhorn, a.Eps, a.NormEps, eps, b.faithful())
	if err == nil && fused && h8 != nil {
		return h8, nil
	}
	if h8 != nil {
		b.Free(h8)
	}
	if err != nil {
		return nil, fmt.Errorf("hc pre norm: %w", err)
	}
	if !fused {
		return normed, b.hcPreThenNorm(x, h, a, norm, eps, out, normed, mix)
	}
	return normed, nil
}

// hcPreThenNorm is HcPreNorm as the two separate ops.
func (b *Backend) hcPreThenNorm(x backend.Tensor, h backend.HC, a backend.HcArgs, norm backend.Vec, eps float32, out, normed, mix backend.Tensor) error {
	if err := b.HcPre(x, h, a, out, mix); err != nil {
		return err
	}
	return b.RMSNorm(out, norm, eps, normed)
}

// HcHead implements backend.Backend (spec §4.3).
func (b *Backend) HcHead(x backend.Tensor, h backend.HC, a backend.HcArgs, out backend.Tensor) error {
	hh, t, err := backend.Args[*hc, *Tensor](backend.CheckHcHead(x, h, a, out), "hc head", h, x, out)
	if err != nil {
		return err
	}
	xt, ot, n, d := t[0], t[1], a.Streams, x.Cols()/a.Streams
	if err := cuda.HcHeadF32(b.s, ot.ptr, xt.ptr, hh.fn.Ptr, hh.base.Ptr, xt.rows, n, d, hh.scale[0], a.Eps, a.NormEps, b.faithful()); err != nil {
		return fmt.Errorf("hc head: %w", err)
	}
	return nil
}

// HeadNorm implements backend.Backend: weightless per-head RMS norm in place
// (bf16 at every step in faithful mode, spec §5.3).
func (b *Backend) HeadNorm(x backend.Tensor, headDim int, eps float32) error {
	xt, err := backend.As[*Tensor](backend.CheckHeadNorm(x, headDim), "head norm", x)
	if err != nil {
		return err
	}
	return cuda.HeadNormF32(b.s, xt.ptr, xt.rows*xt.cols/headDim, headDim, eps, b.faithful())
}

// RopeHadamardFP4 implements backend.Backend: the indexer's q epilogue in one
// launch instead of two, the same bits (the kernels share their device code).
func (b *Backend) RopeHadamardFP4(x backend.Tensor, a backend.RopeArgs, bt *backend.Batch) error {
	xt, err := backend.As[*Tensor](backend.CheckRopeHadamardFP4(x, a, bt), "rope hadamard", x)
	if err != nil {
		return err
	}
	if b.split {
		if err := b.Rope(x, a, bt); err != nil {
			return err
		}
		return b.HadamardFP4(x, a.HeadDim)
	}
	tab, err := b.ropeFreqs(a.Freqs)
	if err != nil {
		return fmt.Errorf("rope hadamard: %w", err)
	}
	db, err := b.deviceBatch(bt)
	if err != nil {
		return fmt.Errorf("rope hadamard: %w", err)
	}
	sc := float32(1 / math.Sqrt(float64(a.HeadDim))) // HadamardFP4's scale
	return cuda.RopeHadamardFP4F32(b.s, xt.ptr, db.Pos, tab.f32.Ptr, tab.f64.Ptr, xt.rows, xt.cols/a.HeadDim, a.HeadDim,
		tab.dim, sc, a.Inverse, b.faithful())
}

// HadamardFP4 implements backend.Backend: Walsh–Hadamard per head, then bf16 +
// FP4 (blocks of 32) simulation in faithful mode, in place.
func (b *Backend) HadamardFP4(x backend.Tensor, headDim int) error {
	xt, err := backend.As[*Tensor](backend.CheckHadamardFP4(x, headDim), "hadamard", x)
	if err != nil {
		return err
	}
	sc := float32(1 / math.Sqrt(float64(headDim))) // the CPU's scale, bit for bit
	return cuda.HadamardFP4F32(b.s, xt.ptr, xt.rows*xt.cols/headDim, headDim, sc, b.faithful())
}
