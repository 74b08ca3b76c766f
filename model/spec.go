package model

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/kvcache"
)

// Snapshot copies the state slot of s (window rings and compressor pending
// state of every layer, the MTP block's included) into its spare slot, so that
// speculative rows written after it can be undone by Restore. Compressed
// entries and indexer keys live in blocks and are not copied: an entry that a
// rejected token completed is never read (attention reads the entries
// complete at each row's position) and is rewritten when the sequence gets
// there again.
func (m *Model) Snapshot(s *kvcache.Sequence) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.cache.ReserveSpare(s); err != nil {
		return fmt.Errorf("model snapshot: %w", err)
	}
	n := len(m.store.Spec().Layers)
	if err := m.be.CopySlot(m.store, backend.SlotCopy{Dst: s.Spare(), Src: s.Slot(), From: 0, To: n}); err != nil {
		return fmt.Errorf("model snapshot: %w", err)
	}
	return nil
}

// Restore copies the last Snapshot of s back and rewinds s to n processed
// tokens (n at most the length at the snapshot); with mtpOnly only the MTP
// block's state is restored and the length stays.
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
