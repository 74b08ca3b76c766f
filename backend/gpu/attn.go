package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// WriteWindow implements backend.Backend.
func (b *Backend) WriteWindow(s backend.KVStore, layer int, kv backend.Tensor, bt *backend.Batch) error {
	kt, err := backend.As[*Tensor](backend.CheckWriteWindow(s, layer, kv, bt), "write window", kv)
	if err != nil {
		return err
	}
	k, err := b.store(s)
	if err != nil {
		return err
	}
	if err := k.checkSeqs(bt, layer, false); err != nil {
		return err
	}
	kl := &k.layers[layer]
	l := kl.spec
	db, err := b.deviceBatch(bt)
	if err != nil {
		return err
	}
	if k.spec.Compact {
		return cuda.WriteWindowKV8(b.s, kl.win.Ptr, kt.ptr, db.Seqs, db.Seq, db.Rows, kl.ring, l.HeadDim, l.HeadDim-l.RopeDim, kl.eb)
	}
	return cuda.WriteWindowF32(b.s, kl.win.Ptr, kt.ptr, db.Seqs, db.Seq, db.Rows, kl.ring, l.HeadDim)
}

// Compress implements backend.Backend: one CTA per row, those that complete
// an entry pool it (reading the pre-step state), then the post-step state per
// sequence.
func (b *Backend) Compress(s backend.KVStore, A, Z backend.Tensor, a backend.CompressArgs, bt *backend.Batch) error {
	t, err := backend.Tensors[*Tensor](backend.CheckCompress(s, A, Z, a, bt), "compress", A, Z)
	if err != nil {
		return err
	}
	k, err := b.store(s)
	if err != nil {
		return err
	}
	if err := k.checkSeqs(bt, a.Layer, true); err != nil {
		return err
	}
	at, zt, kl := t[0], t[1], &k.layers[a.Layer]
	r, dc, c := a.Ratio, a.Dim, coff(a.Ratio)
	ape, okA := a.APE.(*mat)
	nw, okN := a.Norm.(*vec)
	if !okA || !okN {
		return fmt.Errorf("compress layer %d: ape %T, norm %T", a.Layer, a.APE, a.Norm)
	}
	rt, err := b.ropeFreqs(a.Rope)
	if err != nil {
		return fmt.Errorf("compress layer %d: %w", a.Layer, err)
	}
	st, dst, kind, eb := kl.comp, kl.kv, 0, kl.eb
	if a.Kind == backend.CompressIndex {
		st, dst, kind, eb = kl.idx, kl.ik, 1, kl.kb
	}
	if !k.spec.Compact {
		eb = 0
	} else if kind == 0 && rt.dim != kl.spec.RopeDim {
		return fmt.Errorf("compress layer %d: rope dims %d, the compact store's entries have %d", a.Layer, rt.dim, kl.spec.RopeDim)
	}
	db, err := b.deviceBatch(bt)
	if err != nil {
		return err
	}
	sh := cuda.CompressShape{R: r, Dc: dc, C: c, Per: kl.per, RopeDim: rt.dim, Kind: kind, Bytes: eb, Rows: kl.rows, Eps: a.NormEps}
	if err := cuda.CompressF32(b.s, dst.Ptr, at.ptr, zt.ptr, ape.buf.Ptr, st.a.Ptr, st.z.Ptr, nw.buf.Ptr, rt.f32.Ptr, rt.f64.Ptr,
		db.Seqs, db.Blocks, db.Pos, db.Seq, db.Rows, sh, b.faithful()); err != nil {
		return fmt.Errorf("compress layer %d: %w", a.Layer, err)
	}
	return cuda.CompressStateF32(b.s, st.a.Ptr, st.z.Ptr, at.ptr, zt.ptr, ape.buf.Ptr, db.Seqs, db.NSeq, sh)
}

// IndexerTopK implements backend.Backend.
func (b *Backend) IndexerTopK(s backend.KVStore, q, w backend.Tensor, a backend.IndexerArgs, bt *backend.Batch, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckIndexerTopK(s, q, w, a, bt, out), "indexer", q, w, out)
	if err != nil {
		return err
	}
	k, err := b.store(s)
	if err != nil {
		return err
	}
	if err := k.checkSeqs(bt, a.Layer, true); err != nil {
		return err
	}
	qt, wt, ot, kl, n := t[0], t[1], t[2], &k.layers[a.Layer], bt.Rows()
	db, err := b.deviceBatch(bt)
	if err != nil {
		return err
	}
	ld := db.MaxEnd / a.Ratio
	sc, err := b.scratch(4 * n * ld)
	if err != nil {
		return fmt.Errorf("indexer layer %d: %w", a.Layer, err)
	}
	defer sc.Free()
	kb := 0
	if k.spec.Compact {
		kb = kl.kb
	}
	if err := cuda.IndexerScoresF32(b.s, sc.Ptr, qt.ptr, wt.ptr, kl.ik.Ptr, db.Seqs, db.Pos, db.Seq, db.Blocks, n, ld, a.Heads, a.HeadDim, a.Ratio, kl.per, kb, b.faithful()); err != nil {
		return fmt.Errorf("indexer layer %d: %w", a.Layer, err)
	}
	if a.Trace {
		if err := b.traceScores(sc, qt, bt, ld, a.Ratio); err != nil {
			return err
		}
	}
	return cuda.IndexerTopKF32(b.s, ot.ptr, sc.Ptr, db.Pos, n, ld, a.TopK, a.Ratio)
}

// traceScores reports the first row with a non-finite score, like the CPU.
func (b *Backend) traceScores(sc *cuda.Buffer, qt *Tensor, bt *backend.Batch, ld, ratio int) error {
	n := bt.Rows()
	host := make([]float32, n*ld)
	if len(host) > 0 {
		if err := b.s.CopyDtoH(cuda.Bytes(host), sc.Ptr); err != nil {
			return fmt.Errorf("indexer trace: %w", err)
		}
		if err := b.sync(); err != nil {
			return fmt.Errorf("indexer trace: %w", err)
		}
	}
	for row := range n {
		avail := (int(bt.Pos[row]) + 1) / ratio
		if st := backend.SliceStats(host[row*ld : row*ld+avail]); st.FirstBad >= 0 {
			qr := make([]float32, qt.cols)
			if err := b.s.CopyDtoH(cuda.Bytes(qr), qt.Row(row)); err != nil {
				return fmt.Errorf("indexer trace: %w", err)
			}
			if err := b.sync(); err != nil {
				return fmt.Errorf("indexer trace: %w", err)
			}
			return &backend.OpNonFinite{Component: "indexer scores", Row: row, Stats: st, In: backend.SliceStats(qr)}
		}
	}
	return nil
}

// SparseAttention implements backend.Backend.
func (b *Backend) SparseAttention(s backend.KVStore, q, kv, sel backend.Tensor, a backend.AttnArgs, bt *backend.Batch, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckSparseAttention(s, q, kv, sel, a, bt, out), "attention", q, kv, out)
	if err != nil {
		return err
	}
	k, err := b.store(s)
	if err != nil {
		return err
	}
	if err := k.checkSeqs(bt, a.Layer, true); err != nil {
		return err
	}
	qt, kt, ot, kl := t[0], t[1], t[2], &k.layers[a.Layer]
	n, D, H := bt.Rows(), a.HeadDim, a.Heads
	selPtr, selCols := kt.ptr, 0
	if a.Ratio == 4 {
		st, err := gt(sel)
		if err != nil {
			return fmt.Errorf("attention selection: %w", err)
		}
		selPtr, selCols = st.ptr, st.cols
	}
	sink, ok := a.Sink.(*vec)
	if !ok {
		return fmt.Errorf("attention layer %d: sink %T", a.Layer, a.Sink)
	}
	db, err := b.deviceBatch(bt)
	if err != nil {
		return err
	}
	ent := kl.win.Ptr
	if kl.kv != nil {
		ent = kl.kv.Ptr
	}
	sh := cuda.AttnShape{Rows: n, Heads: H, D: D, Window: a.Window, Ring: kl.ring, Ratio: a.Ratio, Per: max(kl.per, 1), SelCols: selCols, Scale: a.Scale}
	if k.spec.Compact {
		sh.Nope, sh.EntryBytes = D-kl.spec.RopeDim, kl.eb
	}
	// The most keys a row reads, and the most that can hold an entry (a
	// recorded step: at its capacity), steer the split.
	sh.MaxKeys = a.Window + selCols
	sh.LiveKeys = min(a.Window, db.MaxEnd)
	switch a.Ratio {
	case 4:
		sh.LiveKeys += min(selCols, db.MaxEnd/4)
	case 128:
		sh.MaxKeys = a.Window + db.MaxEnd/128
		sh.LiveKeys += db.MaxEnd / 128
	}
	var part cuda.DevicePtr
	if nb := cuda.AttnScratchBytes(b.s, sh); nb > 0 {
		sc, err := b.scratch(nb)
		if err != nil {
			return fmt.Errorf("attention layer %d: %w", a.Layer, err)
		}
		defer sc.Free()
		part = sc.Ptr
	}
	return cuda.SparseAttnF32(b.s, ot.ptr, qt.ptr, kt.ptr, kl.win.Ptr, ent, selPtr, sink.buf.Ptr, db.Seqs, db.Pos, db.Seq, db.Blocks, part, sh, b.faithful())
}
