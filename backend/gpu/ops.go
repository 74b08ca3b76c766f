package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// Embed implements backend.Backend.
func (b *Backend) Embed(e backend.Embedding, ids []int32, streams int, out backend.Tensor) error {
	em, ok := e.(*embedding)
	if !ok || em == nil {
		return fmt.Errorf("embed: table %T", e)
	}
	ot, err := f32(out, len(ids), streams*em.dim, "embed output")
	if err != nil {
		return err
	}
	for _, id := range ids {
		if id < 0 || int(id) >= em.vocab {
			return fmt.Errorf("embed: token id %d outside vocab %d", id, em.vocab)
		}
	}
	p := b.recordedIDs(ids)
	if p == 0 {
		dev, err := b.upload(cuda.Bytes(ids))
		if err != nil {
			return fmt.Errorf("embed: %w", err)
		}
		defer dev.Free()
		p = dev.Ptr
	}
	return cuda.EmbedF32(b.s, ot.ptr, em.buf.Ptr, em.bf16, p, len(ids), em.dim, streams)
}

// RMSNorm implements backend.Backend.
func (b *Backend) RMSNorm(x backend.Tensor, w backend.Vec, eps float32, out backend.Tensor) error {
	xt, wv, ot, err := normArgs(x, w, out)
	if err != nil {
		return err
	}
	d := wv.Len()
	return cuda.RMSNormF32(b.s, ot.ptr, xt.ptr, wv.buf.Ptr, xt.rows*xt.cols/d, d, eps, b.faithful())
}

func normArgs(x backend.Tensor, w backend.Vec, out backend.Tensor) (*Tensor, *vec, *Tensor, error) {
	wv, ok := w.(*vec)
	if !ok || wv == nil {
		return nil, nil, nil, fmt.Errorf("rmsnorm: weight %T", w)
	}
	d := wv.Len()
	xt, err := f32(x, -1, -1, "rmsnorm input")
	if err != nil {
		return nil, nil, nil, err
	}
	if d == 0 || xt.cols%d != 0 {
		return nil, nil, nil, fmt.Errorf("rmsnorm: width %d not a multiple of weight %d", xt.cols, d)
	}
	ot, err := f32(out, xt.rows, xt.cols, "rmsnorm output")
	if err != nil {
		return nil, nil, nil, err
	}
	return xt, wv, ot, nil
}

// AddStreams implements backend.Backend.
func (b *Backend) AddStreams(x, e backend.Tensor) error {
	et, err := f32(e, -1, -1, "add streams term")
	if err != nil {
		return err
	}
	xt, err := f32(x, et.rows, -1, "add streams")
	if err != nil {
		return err
	}
	if et.cols == 0 || xt.cols%et.cols != 0 {
		return fmt.Errorf("add streams: width %d vs %d", xt.cols, et.cols)
	}
	return cuda.AddStreamsF32(b.s, xt.ptr, et.ptr, xt.rows, xt.cols, et.cols, b.faithful())
}

// Scale implements backend.Backend.
func (b *Backend) Scale(x backend.Tensor, s float32) error {
	xt, err := f32(x, -1, -1, "scale")
	if err != nil {
		return err
	}
	return cuda.ScaleF32(b.s, xt.ptr, s, int64(xt.rows*xt.cols), b.faithful())
}

// SwiGLU implements backend.Backend.
func (b *Backend) SwiGLU(g, u backend.Tensor, limit float32, out backend.Tensor) error {
	gt, ut, ot, err := swigluArgs(g, u, out)
	if err != nil {
		return err
	}
	return cuda.SwiGLUF32(b.s, ot.ptr, gt.ptr, ut.ptr, int64(gt.rows*gt.cols), limit, b.faithful())
}

func swigluArgs(g, u, out backend.Tensor) (*Tensor, *Tensor, *Tensor, error) {
	gt, err := f32(g, -1, -1, "swiglu gate")
	if err != nil {
		return nil, nil, nil, err
	}
	ut, err := f32(u, gt.rows, gt.cols, "swiglu up")
	if err != nil {
		return nil, nil, nil, err
	}
	ot, err := f32(out, gt.rows, gt.cols, "swiglu output")
	if err != nil {
		return nil, nil, nil, err
	}
	return gt, ut, ot, nil
}

// Combine implements backend.Backend.
func (b *Backend) Combine(acc, shared, out backend.Tensor) error {
	at, err := f32(acc, -1, -1, "combine acc")
	if err != nil {
		return err
	}
	st, err := f32(shared, at.rows, at.cols, "combine shared")
	if err != nil {
		return err
	}
	ot, err := f32(out, at.rows, at.cols, "combine output")
	if err != nil {
		return err
	}
	return cuda.AddF32(b.s, ot.ptr, at.ptr, st.ptr, int64(at.rows*at.cols), b.faithful())
}

// GatherRows implements backend.Backend (device-to-device row copies).
func (b *Backend) GatherRows(x backend.Tensor, rows []int, out backend.Tensor) error {
	xt, err := f32(x, -1, -1, "gather")
	if err != nil {
		return err
	}
	ot, err := f32(out, len(rows), xt.cols, "gather output")
	if err != nil {
		return err
	}
	for i, r := range rows {
		if r < 0 || r >= xt.rows {
			return fmt.Errorf("gather: row %d of %d", r, xt.rows)
		}
		if err := b.s.CopyDtoD(ot.Row(i), xt.Row(r), 4*xt.cols); err != nil {
			return fmt.Errorf("gather: %w", err)
		}
	}
	return nil
}

// HcPost implements backend.Backend.
func (b *Backend) HcPost(o, x, mix backend.Tensor, a backend.HcArgs, out backend.Tensor) error {
	n := a.Streams
	xt, err := f32(x, -1, -1, "hc post residual")
	if err != nil {
		return err
	}
	if n <= 0 || xt.cols%n != 0 {
		return fmt.Errorf("hc post: width %d vs %d streams", xt.cols, n)
	}
	d := xt.cols / n
	ot, err := f32(o, xt.rows, d, "hc post sub-layer output")
	if err != nil {
		return err
	}
	mt, err := f32(mix, xt.rows, n+n*n, "hc post mix")
	if err != nil {
		return err
	}
	yt, err := f32(out, xt.rows, xt.cols, "hc post output")
	if err != nil {
		return err
	}
	return cuda.HcPostF32(b.s, yt.ptr, xt.ptr, ot.ptr, mt.ptr, xt.rows, n, d, b.faithful())
}

// Rope implements backend.Backend.
func (b *Backend) Rope(x backend.Tensor, a backend.RopeArgs, bt *backend.Batch) error {
	xt, err := f32(x, bt.Rows(), -1, "rope")
	if err != nil {
		return err
	}
	if a.Freqs == nil || a.HeadDim <= 0 || xt.cols%a.HeadDim != 0 || a.Freqs.Dim() > a.HeadDim {
		return fmt.Errorf("rope: width %d, head dim %d", xt.cols, a.HeadDim)
	}
	tab, err := b.ropeFreqs(a.Freqs)
	if err != nil {
		return err
	}
	db, err := b.deviceBatch(bt)
	if err != nil {
		return fmt.Errorf("rope: %w", err)
	}
	return cuda.RopeF32(b.s, xt.ptr, db.Pos, tab.f32.Ptr, tab.f64.Ptr, xt.rows, xt.cols/a.HeadDim, a.HeadDim, tab.dim, a.Inverse, b.faithful())
}

// KVQuant implements backend.Backend (FP8 simulation in place, faithful only).
func (b *Backend) KVQuant(x backend.Tensor, nope, block int) error {
	xt, err := f32(x, -1, -1, "kv quant")
	if err != nil {
		return err
	}
	if nope > xt.cols || block <= 0 || nope%block != 0 || block%32 != 0 {
		return fmt.Errorf("kv quant: nope %d of %d, block %d (the GPU needs nope %% block == 0, block %% 32 == 0)", nope, xt.cols, block)
	}
	if !b.faithful() {
		return nil
	}
	return cuda.QuantFP8F32(b.s, 0, 0, xt.ptr, xt.ptr, xt.rows, xt.cols, nope, block)
}
