package engine

import (
	"errors"
	"fmt"

	"github.com/megamoe/megamoe/model"
)

// The drafters' inputs on the device: a verification keeps its final
// streams there, or DSpark's captured features (model.BatchItem.KeepHidden),
// and the next MTP catch-up or DSpark context gathers its rows from them
// (model.MTPItem.In, model.DSparkItem.In); a chained MTP draft reads the
// previous pass's output streams the same way (KeepNext). Only token ids
// (and the logits rows a host sample needs) come back.

// streamKeeper is a Speculator that keeps the drafter's input rows on its
// device (model.Model).
type streamKeeper interface {
	// ForwardKept is ForwardVerify with the rows' final streams kept on
	// the device instead of returned.
	ForwardKept(items []ForwardItem) (verifyOut, error)
	// ForwardMTPKept is ForwardMTPDraw with the KeepNext streams kept on
	// the device.
	ForwardMTPKept(items []model.MTPItem) (mtpOut, error)
	FreeHidden(h *model.Hidden)
	DownloadHidden(r model.HiddenRef) ([]float32, error)
}

// verifyOut is a verifying pass's output: per item its logits and its
// drawn rows (nil where none), and either the rows' streams on the host
// (hidden) or kept on the device (kept, item i from row keptRow[i]).
type verifyOut struct {
	logits, hidden [][]float32
	rows           [][]int32
	kept           *model.Hidden
	keptRow        []int
}

// mtpOut is an MTP pass's output: per item its logits, its drawn draft (ids,
// nil where none was drawn), and its output streams on the host (hidden) or
// kept on the device (kept, item i at row keptRow[i]).
type mtpOut struct {
	logits, hidden [][]float32
	ids            []int32
	kept           *model.Hidden
	keptRow        []int
}

// next is item j's output streams as the next pass's input.
func (o *mtpOut) next(j int) ([]float32, model.HiddenRef) {
	if o.kept != nil {
		return nil, model.HiddenRef{H: o.kept, Row0: o.keptRow[j], Rows: 1}
	}
	return o.hidden[j], model.HiddenRef{}
}

// newStreamKeeper returns m's streamKeeper, else nil (host streams: models
// that cannot keep them, test doubles).
func newStreamKeeper(m Speculator) streamKeeper {
	k, ok := m.(streamKeeper)
	if !ok {
		return nil
	}
	if a, isA := m.(modelAdapter); isA && !a.keeps() {
		return nil
	}
	return k
}

// keeps reports whether the adapted model keeps streams on its device.
func (a modelAdapter) keeps() bool {
	_, ok := a.m.(keeper)
	return ok
}

// keeper is the part of *model.Model behind streamKeeper.
type keeper interface {
	FreeHidden(h *model.Hidden)
	DownloadHidden(r model.HiddenRef) ([]float32, error)
}

var errNoKeep = errors.New("engine: this model does not keep streams on its device")

// ForwardKept implements streamKeeper.
func (a modelAdapter) ForwardKept(items []ForwardItem) (verifyOut, error) {
	b := &model.Batch{Items: make([]model.BatchItem, len(items))}
	for i, it := range items {
		b.Items[i] = model.BatchItem{Seq: it.Seq, Tokens: it.Tokens, AllLogits: it.AllLogits, KeepHidden: true, DrawRows: it.DrawRows}
	}
	out, err := a.m.Forward(b)
	if err != nil {
		return verifyOut{}, err
	}
	if out.Kept == nil || len(out.KeptRow) != len(items) {
		a.FreeHidden(out.Kept)
		return verifyOut{}, fmt.Errorf("engine: the verification kept no streams for %d items", len(items))
	}
	return verifyOut{logits: out.Logits, rows: out.RowIDs, kept: out.Kept, keptRow: out.KeptRow}, nil
}

// ForwardMTPKept implements streamKeeper.
func (a modelAdapter) ForwardMTPKept(items []model.MTPItem) (mtpOut, error) {
	sp, err := a.spec()
	if err != nil {
		return mtpOut{}, err
	}
	out, err := sp.ForwardMTP(items)
	if err != nil {
		return mtpOut{}, err
	}
	if len(out.Logits) != len(items) || out.IDs != nil && len(out.IDs) != len(items) || out.Kept != nil && len(out.KeptRow) != len(items) {
		a.FreeHidden(out.Kept)
		return mtpOut{}, fmt.Errorf("engine: mtp returned %d rows, %d ids and %d kept rows for %d items", len(out.Logits), len(out.IDs), len(out.KeptRow), len(items))
	}
	return mtpOut{logits: out.Logits, ids: out.IDs, kept: out.Kept, keptRow: out.KeptRow}, nil
}

// FreeHidden implements streamKeeper.
func (a modelAdapter) FreeHidden(h *model.Hidden) {
	if k, ok := a.m.(keeper); ok {
		k.FreeHidden(h)
	}
}

// DownloadHidden implements streamKeeper.
func (a modelAdapter) DownloadHidden(r model.HiddenRef) ([]float32, error) {
	k, ok := a.m.(keeper)
	if !ok {
		return nil, errNoKeep
	}
	return k.DownloadHidden(r)
}

// pending is how many rows st holds for the drafter to catch up on.
func (st *specState) pending(w int) int { return len(st.hidden)/w + st.dev.Rows }

// toHost moves st's device rows to the host (before their tensor is freed,
// or to append rows of another tensor).
func (sp *speculator) toHost(st *specState) error {
	if st.dev.H == nil {
		return nil
	}
	h, err := sp.keep.DownloadHidden(st.dev)
	if err != nil {
		return err
	}
	st.hidden, st.dev = append(st.hidden, h...), model.HiddenRef{}
	return nil
}

// queue appends the verified rows [from, to) of item i's streams to st.
func (sp *speculator) queue(st *specState, out *verifyOut, i, from, to int) error {
	w := sp.m.HiddenDim()
	if out.kept == nil {
		st.hidden = append(st.hidden, out.hidden[i][from*w:to*w]...)
		return nil
	}
	r := model.HiddenRef{H: out.kept, Row0: out.keptRow[i] + from, Rows: to - from}
	if st.pending(w) == 0 {
		st.dev = r
		return nil
	}
	// Rows still queued from another step: both go through the host (a
	// sequence that skipped its catch-up).
	if err := sp.toHost(st); err != nil {
		return err
	}
	h, err := sp.keep.DownloadHidden(r)
	if err != nil {
		return err
	}
	st.hidden = append(st.hidden, h...)
	return nil
}

// retain makes kept the verification streams the drafting states users
// refer to: rows still queued from the previous one go to the host, and it
// is freed.
func (sp *speculator) retain(kept *model.Hidden, users []*specState) error {
	var err error
	if sp.kept != nil && sp.kept != kept {
		for _, st := range sp.users {
			if st.dev.H == sp.kept {
				if e := sp.toHost(st); e != nil && err == nil {
					err = e
				}
			}
		}
		sp.keep.FreeHidden(sp.kept)
	}
	sp.kept, sp.users = kept, users
	return err
}
