package gpu

import (
	"fmt"
	"slices"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// Embed implements backend.Backend.
func (b *Backend) Embed(e backend.Embedding, ids []int32, streams int, out backend.Tensor) error {
	em, t, err := backend.Args[*embedding, *Tensor](backend.CheckEmbed(e, ids, streams, out), "embed", e, out)
	if err != nil {
		return err
	}
	ot := t[0]
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

// normArgs checks RMSNorm's arguments and returns their gpu handles.
func normArgs(x backend.Tensor, w backend.Vec, out backend.Tensor) (*Tensor, *vec, *Tensor, error) {
	wv, t, err := backend.Args[*vec, *Tensor](backend.CheckRMSNorm(x, w, out), "rmsnorm", w, x, out)
	if err != nil {
		return nil, nil, nil, err
	}
	return t[0], wv, t[1], nil
}

// AddStreams implements backend.Backend.
func (b *Backend) AddStreams(x, e backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckAddStreams(x, e), "add streams", x, e)
	if err != nil {
		return err
	}
	xt, et := t[0], t[1]
	return cuda.AddStreamsF32(b.s, xt.ptr, et.ptr, xt.rows, xt.cols, et.cols, b.faithful())
}

// Scale implements backend.Backend.
func (b *Backend) Scale(x backend.Tensor, s float32) error {
	xt, err := backend.As[*Tensor](backend.CheckScale(x), "scale", x)
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

// swigluArgs checks SwiGLU's arguments and returns their gpu handles.
func swigluArgs(g, u, out backend.Tensor) (*Tensor, *Tensor, *Tensor, error) {
	t, err := backend.Tensors[*Tensor](backend.CheckSwiGLU(g, u, out), "swiglu", g, u, out)
	if err != nil {
		return nil, nil, nil, err
	}
	return t[0], t[1], t[2], nil
}

// Combine implements backend.Backend.
func (b *Backend) Combine(acc, shared, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckCombine(acc, shared, out), "combine", acc, shared, out)
	if err != nil {
		return err
	}
	at, st, ot := t[0], t[1], t[2]
	return cuda.AddF32(b.s, ot.ptr, at.ptr, st.ptr, int64(at.rows*at.cols), b.faithful())
}

// GatherRows implements backend.Backend (device-to-device row copies).
func (b *Backend) GatherRows(x backend.Tensor, rows []int, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckGatherRows(x, rows, out), "gather", x, out)
	if err != nil {
		return err
	}
	xt, ot := t[0], t[1]
	if c := b.rec; c != nil && len(rows) > 0 {
		// Rows that vary between steps of one key: an input of the recording.
		idx := int32s(rows)
		if p := c.list(listLast, idx); p != 0 {
			return cuda.CopyRowsU32(b.s, ot.ptr, xt.ptr, 0, p, len(rows), int64(xt.cols))
		}
		if !c.fixed(rows) {
			return fmt.Errorf("gather: rows %v of a recorded step are neither an input nor fixed by its key", rows)
		}
	}
	runs := 1
	for i := 1; i < len(rows); i++ {
		if rows[i] != rows[i-1]+1 {
			runs++
		}
	}
	// Many runs (rows of several sequences): one
	// kernel over an index list (uploaded once per step: the list repeats in
	// every layer). Else one copy per run; a recorded step always copies.
	if runs > 2 && b.rec == nil && len(rows) <= 65535 {
		idx := make([]int32, len(rows))
		for i, r := range rows {
			idx[i] = int32(r)
		}
		p, err := b.indexList(idx)
		if err != nil {
			return fmt.Errorf("gather: %w", err)
		}
		return cuda.CopyRowsU32(b.s, ot.ptr, xt.ptr, 0, p, len(rows), int64(xt.cols))
	}
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j] == rows[j-1]+1 {
			j++
		}
		if err := b.s.CopyDtoD(ot.Row(i), xt.Row(rows[i]), 4*xt.cols*(j-i)); err != nil {
			return fmt.Errorf("gather: %w", err)
		}
		i = j
	}
	return nil
}

// HcPost implements backend.Backend.
func (b *Backend) HcPost(o, x, mix backend.Tensor, a backend.HcArgs, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckHcPost(o, x, mix, a, out), "hc post", out, x, o, mix)
	if err != nil {
		return err
	}
	return cuda.HcPostF32(b.s, t[0].ptr, t[1].ptr, t[2].ptr, t[3].ptr, x.Rows(), a.Streams, x.Cols()/a.Streams, b.faithful())
}

// Rope implements backend.Backend.
func (b *Backend) Rope(x backend.Tensor, a backend.RopeArgs, bt *backend.Batch) error {
	xt, err := backend.As[*Tensor](backend.CheckRope(x, a, bt), "rope", x)
	if err != nil {
		return err
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
	xt, err := backend.As[*Tensor](backend.CheckKVQuant(x, nope, block), "kv quant", x)
	if err != nil {
		return err
	}
	if nope%block != 0 || block%32 != 0 {
		return fmt.Errorf("kv quant: nope %d of %d, block %d (the GPU needs nope %% block == 0, block %% 32 == 0)", nope, xt.cols, block)
	}
	if !b.faithful() {
		return nil
	}
	return cuda.QuantFP8F32(b.s, 0, 0, xt.ptr, xt.ptr, xt.rows, xt.cols, nope, block)
}

// indexLists is how many index lists indexList keeps on the device.
const indexLists = 8

// indexList returns a device copy of idx, uploading it unless one of the
// last indexLists lists is the same.
func (b *Backend) indexList(idx []int32) (cuda.DevicePtr, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, c := range b.idxLists {
		if slices.Equal(c.host, idx) { // most recent first
			copy(b.idxLists[1:i+1], b.idxLists[:i])
			b.idxLists[0] = c
			return c.buf.Ptr, nil
		}
	}
	if n := len(b.idxLists); n == indexLists {
		b.idxLists[n-1].buf.Free() // reused in stream order (cuda.Pool)
		b.idxLists = b.idxLists[:n-1]
	}
	buf, err := b.upload(cuda.Bytes(idx))
	if err != nil {
		return 0, err
	}
	b.idxLists = slices.Insert(b.idxLists, 0, &devIndex{host: idx, buf: buf})
	return buf.Ptr, nil
}

// devIndex is an index list on the device.
type devIndex struct {
	host []int32
	buf  *cuda.Buffer
}
