package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// RMSNormQuant is RMSNorm for NormLinears: where a linear of next takes
// the faithful FP8 tensor-core path from out, rmsnorm_quant_f32 writes out
// and its FP8 quantisation in one launch, and the handle carrying both
// saves those linears' quant_fp8_f32; otherwise it is RMSNorm and returns out.
func (b *Backend) RMSNormQuant(x backend.Tensor, w backend.Vec, eps float32, out backend.Tensor, next []backend.Linear) (backend.Tensor, error) {
	xt, wv, ot, err := normArgs(x, w, out)
	if err != nil {
		return nil, err
	}
	d := wv.Len()
	if d != xt.cols || xt.rows == 0 || !b.takesQuant(d, next) || !cuda.RMSNormQuantFits(ot.ptr, xt.ptr, wv.buf.Ptr, d) {
		return out, b.RMSNorm(x, w, eps, out)
	}
	h, err := b.quantHandle(ot)
	if err != nil {
		return nil, fmt.Errorf("rmsnorm quant: %w", err)
	}
	q, qs := fp8Layout(h.q8.Ptr, xt.rows, d)
	if err := cuda.RMSNormQuantF32(b.s, ot.ptr, q, qs, xt.ptr, wv.buf.Ptr, xt.rows, d, eps, true); err != nil {
		b.Free(h)
		return nil, err
	}
	return h, nil
}

// SwiGLUQuant is SwiGLU for SwiGLULinear as RMSNormQuant is RMSNorm, with
// swiglu_quant_f32 in place of SwiGLU and quant_fp8_f32.
func (b *Backend) SwiGLUQuant(g, u backend.Tensor, limit float32, out backend.Tensor, next []backend.Linear) (backend.Tensor, error) {
	gt, ut, ot, err := swigluArgs(g, u, out)
	if err != nil {
		return nil, err
	}
	if gt.rows == 0 || !b.takesQuant(gt.cols, next) || !cuda.SwiGLUQuantFits(ot.ptr, gt.ptr, ut.ptr, gt.cols) {
		return out, b.SwiGLU(g, u, limit, out)
	}
	h, err := b.quantHandle(ot)
	if err != nil {
		return nil, fmt.Errorf("swiglu quant: %w", err)
	}
	q, qs := fp8Layout(h.q8.Ptr, gt.rows, gt.cols)
	if err := cuda.SwiGLUQuantF32(b.s, ot.ptr, q, qs, gt.ptr, ut.ptr, gt.rows, gt.cols, limit, true); err != nil {
		b.Free(h)
		return nil, err
	}
	return h, nil
}

// takesQuant reports whether a linear of next runs faithful FP8 on tensor
// cores from an input of cols columns (and so would quantise it).
func (b *Backend) takesQuant(cols int, next []backend.Linear) bool {
	if !b.faithful() {
		return false
	}
	for _, w := range next {
		if l, ok := w.(*linear); ok && l != nil && l.in == cols && l.tensorCoreFP8() {
			return true
		}
	}
	return false
}

// quantHandle is a view of t with room for its FP8 quantisation.
func (b *Backend) quantHandle(t *Tensor) (*Tensor, error) {
	buf, err := b.scratch(fp8Bytes(t.rows, t.cols))
	if err != nil {
		return nil, err
	}
	return &Tensor{rows: t.rows, cols: t.cols, dt: t.dt, ptr: t.ptr, q8: buf}, nil
}
