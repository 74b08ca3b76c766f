package model

import (
	"errors"
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/kvcache"
)

// MTPItem asks for next-next-token logits of rows at positions Start, Start+1, …
// of Seq (spec §7.2): Hidden (or In) holds the main model's final residual
// streams at positions Start+r (as in Output.Hidden), Next[r] is the token at
// position Start+r+1.
// The MTP block keeps its own sliding window in the sequence's state slot, so
// positions must be fed in order without gaps (as a drafting loop does).
type MTPItem struct {
	Seq   *kvcache.Sequence
	Start int
	// Hidden is the input streams on the host, flattened rows×(hc·d); In
	// names them on the device instead (Hidden is then unused).
	Hidden    []float32
	In        HiddenRef
	Next      []int32
	AllLogits bool
	// WantHidden also returns the block's output streams of the last row
	// on the host (Output.Hidden); KeepNext keeps them on the device
	// (Output.Kept, row Output.KeptRow[i]): the hidden state a chained
	// draft feeds back in.
	WantHidden, KeepNext bool
	// Draw asks for the last row's token drawn on the device where the
	// model CanDraw (Output.IDs; its logits then stay there), as
	// BatchItem.Draw.
	Draw *backend.Draw
	// Draft marks chained drafts (their hidden state is the block's own
	// output); Ahead allows positions beyond the main model's cache (the
	// rows a speculative step computed and then rolled back). Draft implies
	// Ahead.
	Draft, Ahead bool
}

// HasMTP reports whether the checkpoint has an MTP block.
func (m *Model) HasMTP() bool { return m.mtp != nil }

// ForwardMTP runs the MTP block: X0[k] = e_proj·enorm(embed[next]) +
// h_proj·hnorm(X[k]), one Block, then its own hc_head / norm and the shared head.
// Output.Logits rows are distributions for the token at position i+2.
// The pass is one step for backend.RecordStep (Batch.Name "mtp"): its input
// streams are first copied into a staging tensor the model keeps.
func (m *Model) ForwardMTP(items []MTPItem) (*Output, error) {
	if m.mtp == nil {
		return nil, errors.New("model: checkpoint has no MTP block")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, be := m.cfg, m.be
	w := c.HcDim()
	bi := make([]BatchItem, len(items))
	for i, it := range items {
		if it.Seq == nil || it.Seq.Slot() < 0 {
			return nil, fmt.Errorf("model mtp: item %d: sequence has no cache state (run Forward first)", i)
		}
		if it.In.H != nil {
			if err := it.In.check(); err != nil {
				return nil, fmt.Errorf("model mtp: item %d: input: %w", i, err)
			}
			if it.In.Rows != len(it.Next) || it.In.H.t.Cols() != w {
				return nil, fmt.Errorf("model mtp: item %d: %d hidden rows of width %d for %d next tokens of width %d", i, it.In.Rows, it.In.H.t.Cols(), len(it.Next), w)
			}
		} else if len(it.Hidden) != len(it.Next)*w {
			return nil, fmt.Errorf("model mtp: item %d: %d hidden values for %d next tokens of width %d", i, len(it.Hidden), len(it.Next), w)
		}
		if it.Start < 0 || !it.Draft && !it.Ahead && it.Start+len(it.Next) > it.Seq.Len() {
			return nil, fmt.Errorf("model mtp: item %d: positions %d..%d beyond the %d processed tokens", i, it.Start, it.Start+len(it.Next)-1, it.Seq.Len())
		}
		bi[i] = BatchItem{Seq: it.Seq, Tokens: it.Next, AllLogits: it.AllLogits, Draw: it.Draw}
	}
	bt, ids, err := m.prepare(bi, true)
	if err != nil {
		return nil, err
	}
	bt.Name = "mtp"
	for _, it := range items {
		if it.AllLogits {
			bt.Name = "mtp all" // the head's rows are not the last ones
		}
	}
	for i, it := range items { // positions are the MTP's own, not Seq.Len()
		sq := &bt.Seqs[i]
		sq.Start = it.Start
		for r := range sq.Rows {
			bt.Pos[sq.Row0+r] = int32(it.Start + r)
		}
	}
	if m.tr != nil {
		m.tr.batch = bt
	}
	var rows []int
	for i, it := range items {
		sq := bt.Seqs[i]
		if it.AllLogits {
			for r := range sq.Rows {
				rows = append(rows, sq.Row0+r)
			}
		} else {
			rows = append(rows, sq.Row0+sq.Rows-1)
		}
	}
	n := len(ids)
	x, err := m.mtpInput(items, n)
	if err != nil {
		return nil, err
	}
	outs, err := be.RecordStep(bt, ids, func() ([]backend.Tensor, error) { return m.mtpForward(x, ids, bt, rows) })
	if err != nil {
		return nil, err
	}
	if len(outs) != 2 {
		for _, t := range outs {
			be.Free(t)
		}
		return nil, fmt.Errorf("model mtp: step returned %d outputs", len(outs))
	}
	lg, xm := outs[0], outs[1]
	defer be.Free(xm)
	out := &Output{Logits: make([][]float32, len(items)), Vocab: c.Vocab, HiddenDim: w}
	if out.IDs, _, err = m.drawTokens(lg, bi); err != nil {
		be.Free(lg)
		return nil, err
	}
	if allDrawn(bi, out.IDs) {
		be.Free(lg)
	} else {
		logits, err := m.downloadLogits(lg, len(rows), "mtp ")
		if err != nil {
			return nil, err
		}
		k := 0
		for i, it := range items {
			cnt := 1
			if it.AllLogits {
				cnt = len(it.Next)
			}
			if keepsLogits(bi[i], out.IDs, i) {
				out.Logits[i] = logits[k*c.Vocab : (k+cnt)*c.Vocab : (k+cnt)*c.Vocab]
			}
			k += cnt
		}
	}
	if err := m.mtpHidden(xm, bt, items, out); err != nil {
		return nil, err
	}
	if err := m.mtpKeep(xm, bt, items, out); err != nil {
		return nil, err
	}
	return out, nil
}

// mtpForward is the MTP pass over the input streams x: the logits of rows
// and the block's output streams.
func (m *Model) mtpForward(x backend.Tensor, ids []int32, bt *backend.Batch, rows []int) (outs []backend.Tensor, err error) {
	c, be, p := m.cfg, m.be, m.mtp
	n, w := len(ids), c.HcDim()
	m.tr.at(c.Layers, "mtp", nil)
	e := be.Empty(n, c.Dim, backend.F32)
	en := be.Empty(n, c.Dim, backend.F32)
	ep := be.Empty(n, c.Dim, backend.F32)
	xh := be.Empty(n, w, backend.F32)
	x0 := be.Empty(n, w, backend.F32) // h_proj's output, viewed as streams
	defer func() {
		for _, t := range []backend.Tensor{e, en, ep, xh} {
			be.Free(t)
		}
		if err != nil {
			be.Free(x0)
		}
	}()
	if err := be.Embed(m.embed, ids, 1, e); err != nil {
		return nil, fmt.Errorf("model mtp embed: %w", err)
	}
	if err := be.RMSNorm(e, p.eNorm, m.eps, en); err != nil {
		return nil, fmt.Errorf("model mtp enorm: %w", err)
	}
	if err := be.Linear(en, p.eProj, ep); err != nil {
		return nil, fmt.Errorf("model mtp e_proj: %w", err)
	}
	if err := be.RMSNorm(x, p.hNorm, m.eps, xh); err != nil {
		return nil, fmt.Errorf("model mtp hnorm: %w", err)
	}
	xv, err := be.View(xh, n*c.HcMult, c.Dim)
	if err != nil {
		return nil, err
	}
	hp, err := be.View(x0, n*c.HcMult, c.Dim)
	if err != nil {
		return nil, err
	}
	if err := be.Linear(xv, p.hProj, hp); err != nil {
		return nil, fmt.Errorf("model mtp h_proj: %w", err)
	}
	if err := be.AddStreams(x0, ep); err != nil {
		return nil, fmt.Errorf("model mtp: %w", err)
	}
	xm, err := m.runBlock(&p.block, x0, ids, bt, "mtp ")
	if err != nil {
		return nil, err
	}
	lg, err := m.headLogits(xm, rows, p.hcHead, p.norm, "mtp ")
	if err != nil {
		return nil, err
	}
	return []backend.Tensor{lg, xm}, nil
}

// mtpKeep keeps the last row's output streams of the items that ask on the
// device (Output.Kept).
func (m *Model) mtpKeep(xm backend.Tensor, bt *backend.Batch, items []MTPItem, out *Output) error {
	var rows []int
	out.KeptRow = make([]int, len(items))
	for i, it := range items {
		out.KeptRow[i] = -1
		if it.KeepNext {
			out.KeptRow[i] = len(rows)
			rows = append(rows, bt.Seqs[i].Row0+bt.Seqs[i].Rows-1)
		}
	}
	if len(rows) == 0 {
		out.KeptRow = nil
		return nil
	}
	h, err := m.keepRows(xm, rows)
	if err != nil {
		return fmt.Errorf("model mtp: %w", err)
	}
	out.Kept = h
	return nil
}

// mtpHidden downloads the last row's output streams of the items that ask.
func (m *Model) mtpHidden(xm backend.Tensor, bt *backend.Batch, items []MTPItem, out *Output) error {
	var rows []int
	for i, it := range items {
		if it.WantHidden {
			rows = append(rows, bt.Seqs[i].Row0+bt.Seqs[i].Rows-1)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	w := m.cfg.HcDim()
	xs := m.be.Empty(len(rows), w, backend.F32)
	defer m.be.Free(xs)
	if err := m.be.GatherRows(xm, rows, xs); err != nil {
		return fmt.Errorf("model mtp hidden: %w", err)
	}
	flat := make([]float32, len(rows)*w)
	if err := m.be.Download(xs, flat); err != nil {
		return fmt.Errorf("model mtp hidden: %w", err)
	}
	out.Hidden = make([][]float32, len(items))
	k := 0
	for i, it := range items {
		if it.WantHidden {
			out.Hidden[i] = flat[k*w : (k+1)*w : (k+1)*w]
			k++
		}
	}
	return nil
}
