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
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.store.Spec().Layers)
	a := backend.SlotCopy{Dst: s.Spare(), Src: s.Slot(), From: 0, To: n}
	if s.Spare() >= 0 && mtpOnly {
		a.From = m.cfg.Layers
	}
	if s.Spare() < 0 {
		if err := m.cache.ReserveSpare(s); err != nil {
			return fmt.Errorf("model snapshot: %w", err)
		}
		a.Dst = s.Spare()
	}
	if err := m.be.CopySlot(m.store, a); err != nil {
		return fmt.Errorf("model snapshot: %w", err)
	}
	return nil
}

// Restore copies the spare slot of s back and rewinds s to n processed
// tokens (at most its length); with mtpOnly only the MTP block's state is
// restored and the length stays.
func (m *Model) Restore(s *kvcache.Sequence, n int, mtpOnly bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.Spare() < 0 {
		return fmt.Errorf("model restore: sequence %d has no snapshot", s.ID)
	}
	a := backend.SlotCopy{Dst: s.Slot(), Src: s.Spare(), From: 0, To: len(m.store.Spec().Layers)}
	if mtpOnly {
		a.From = m.cfg.Layers
	}
	if err := m.be.CopySlot(m.store, a); err != nil {
		return fmt.Errorf("model restore: %w", err)
	}
	if mtpOnly {
		return nil
	}
	if err := m.cache.Rewind(s, n); err != nil {
		return fmt.Errorf("model restore: %w", err)
	}
	return nil
}
