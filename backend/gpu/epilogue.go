package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// The attention's q and kv epilogues, one launch each instead of two and
// three; the kernels share their device code with the separate ops' kernels
// (cuda/kernels/rowops.cuh), so the results are the same bits.

// SetSplitFused runs RopeHadamardFP4 and ExpertsCombinePost as their
// separate ops (on) or in one launch each (off, the default) for the steps
// that follow, so that tools can time both in one process. Recorded steps
// keep what they captured: see DropGraphs.
func (b *Backend) SetSplitFused(on bool) error {
	if err := b.Join(); err != nil {
		return err
	}
	b.split = on
	return nil
}

// HeadNormRope implements backend.Backend.
func (b *Backend) HeadNormRope(x backend.Tensor, eps float32, a backend.RopeArgs, bt *backend.Batch) error {
	xt, err := f32(x, bt.Rows(), -1, "head norm rope")
	if err != nil {
		return err
	}
	if a.Freqs == nil || a.HeadDim <= 0 || xt.cols%a.HeadDim != 0 || a.Freqs.Dim() > a.HeadDim {
		return fmt.Errorf("head norm rope: width %d, head dim %d", xt.cols, a.HeadDim)
	}
	tab, err := b.ropeFreqs(a.Freqs)
	if err != nil {
		return fmt.Errorf("head norm rope: %w", err)
	}
	db, err := b.deviceBatch(bt)
	if err != nil {
		return fmt.Errorf("head norm rope: %w", err)
	}
	return cuda.HeadNormRopeF32(b.s, xt.ptr, db.Pos, tab.f32.Ptr, tab.f64.Ptr, xt.rows, xt.cols/a.HeadDim, a.HeadDim,
		tab.dim, eps, a.Inverse, b.faithful())
}

// NormRopeKVQuant implements backend.Backend for one head a row (the
// width of x, w and a.HeadDim alike).
func (b *Backend) NormRopeKVQuant(x backend.Tensor, w backend.Vec, eps float32, a backend.RopeArgs, nope, block int, bt *backend.Batch, out backend.Tensor) error {
	wv, ok := w.(*vec)
	if !ok || wv == nil {
		return fmt.Errorf("norm rope kv quant: weight %T", w)
	}
	xt, err := f32(x, bt.Rows(), wv.Len(), "norm rope kv quant input")
	if err != nil {
		return err
	}
	ot, err := f32(out, xt.rows, xt.cols, "norm rope kv quant output")
	if err != nil {
		return err
	}
	if a.Freqs == nil || a.HeadDim != xt.cols || a.Freqs.Dim() > a.HeadDim {
		return fmt.Errorf("norm rope kv quant: width %d, head dim %d", xt.cols, a.HeadDim)
	}
	if nope < 0 || nope+a.Freqs.Dim() > xt.cols || block <= 0 || nope%block != 0 || block%32 != 0 {
		return fmt.Errorf("norm rope kv quant: nope %d of %d, block %d (the GPU needs nope + rope dims <= width, nope %% block == 0, block %% 32 == 0)",
			nope, xt.cols, block)
	}
	tab, err := b.ropeFreqs(a.Freqs)
	if err != nil {
		return fmt.Errorf("norm rope kv quant: %w", err)
	}
	db, err := b.deviceBatch(bt)
	if err != nil {
		return fmt.Errorf("norm rope kv quant: %w", err)
	}
	return cuda.RMSNormRopeKVQuantF32(b.s, ot.ptr, xt.ptr, wv.buf.Ptr, db.Pos, tab.f32.Ptr, tab.f64.Ptr, xt.rows, xt.cols,
		tab.dim, nope, block, eps, a.Inverse, b.faithful())
}
