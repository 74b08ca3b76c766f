package model

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/kvcache"
)

// Speculative decoding keeps a second (spare) state slot per sequence: the
// MTP block's state before chained drafts (Snapshot with mtpOnly), and the
// main layers' state after the kept rows of a Forward with BatchItem.Keep
// (written layer by layer during that step). Restore copies it back.
// Compressed entries and indexer keys live in blocks and are not copied: an
// entry that a rejected token completed is never read (attention reads the
// entries complete at each row's position) and is rewritten when the
// sequence gets there again.

// Snapshot copies the state slot of s into its spare slot: every layer, or
// with mtpOnly the MTP block's. The spare is reserved (and filled whole) on
// first use.
func (m *Model) Snapshot(s *kvcache.Sequence, mtpOnly bool) error {
	return m.Snapshots([]*kvcache.Sequence{s}, mtpOnly)
}

// Snapshots is Snapshot of every sequence of ss, in one backend call. When
// a spare cannot be reserved, the sequences before it are snapshot (their
// new spares filled whole) and the error names the first one without.
func (m *Model) Snapshots(ss []*kvcache.Sequence, mtpOnly bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.store.Spec().Layers)
	cs := make([]backend.SlotCopy, 0, len(ss))
	var rerr error
	for _, s := range ss {
		a := backend.SlotCopy{Dst: s.Spare(), Src: s.Slot(), From: 0, To: n}
		if s.Spare() >= 0 && mtpOnly {
			a.From = m.cfg.Layers
		}
		if s.Spare() < 0 {
			if rerr = m.cache.ReserveSpare(s); rerr != nil {
				rerr = fmt.Errorf("model snapshot: sequence %d: %w", s.ID, rerr)
				break
			}
			a.Dst = s.Spare()
		}
		cs = append(cs, a)
	}
	if err := m.be.CopySlot(m.store, cs...); err != nil {
		return fmt.Errorf("model snapshot: %w", err)
	}
	return rerr
}

// Rollback is one sequence's Restore: back to N processed tokens, or with
// MTPOnly only the MTP block's state.
type Rollback struct {
	Seq     *kvcache.Sequence
	N       int
	MTPOnly bool
}

// Restore copies the spare slot of s back and rewinds s to n processed
// tokens (at most its length); with mtpOnly only the MTP block's state is
// restored and the length stays.
func (m *Model) Restore(s *kvcache.Sequence, n int, mtpOnly bool) error {
	return m.Restores([]Rollback{{Seq: s, N: n, MTPOnly: mtpOnly}})
}

// Restores is Restore of every rollback of rs (distinct sequences), in one
// backend call.
func (m *Model) Restores(rs []Rollback) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cs := make([]backend.SlotCopy, len(rs))
	for i, r := range rs {
		if r.Seq.Spare() < 0 {
			return fmt.Errorf("model restore: sequence %d has no snapshot", r.Seq.ID)
		}
		cs[i] = backend.SlotCopy{Dst: r.Seq.Slot(), Src: r.Seq.Spare(), From: 0, To: len(m.store.Spec().Layers)}
		if r.MTPOnly {
			cs[i].From = m.cfg.Layers
		}
	}
	if err := m.be.CopySlot(m.store, cs...); err != nil {
		return fmt.Errorf("model restore: %w", err)
	}
	for _, r := range rs {
		if r.MTPOnly {
			continue
		}
		if err := m.cache.Rewind(r.Seq, r.N); err != nil {
			return fmt.Errorf("model restore: %w", err)
		}
	}
	return nil
}
