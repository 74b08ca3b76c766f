package kvcache

import "fmt"

// Speculative decoding writes draft tokens into the cache and keeps only the
// accepted ones: the sequence's state slot is snapshot into a second (spare)
// slot before the drafts run, restored from it afterwards, and Rewind and
// Shrink undo the length and the blocks of the rejected tokens.

// Spare is the snapshot slot, -1 before ReserveSpare.
func (s *Sequence) Spare() int { return s.spare }

// ReserveSpare gives s a snapshot slot (once; it is freed with s). On
// ErrCacheFull nothing changes.
func (m *Manager) ReserveSpare(s *Sequence) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.freed {
		return fmt.Errorf("kvcache: sequence %d was freed", s.ID)
	}
	if s.slot < 0 {
		return fmt.Errorf("kvcache: sequence %d has no state slot to snapshot", s.ID)
	}
	if s.spare >= 0 {
		return nil
	}
	if !m.slotFree() {
		return fmt.Errorf("snapshot slot for sequence %d: all %d slots in use: %w", s.ID, m.slotLimit, ErrCacheFull)
	}
	if !m.makeRoom(m.layout.StateBytes) { // may evict cached prefix blocks
		return fmt.Errorf("snapshot slot for sequence %d (%d of %d bytes used): %w", s.ID, m.used-m.pc.evictable, m.capacity, ErrCacheFull)
	}
	s.spare = m.takeSlot()
	m.used += m.layout.StateBytes
	return nil
}

// Rewind sets the processed length of s back to n (rejected draft tokens).
func (m *Manager) Rewind(s *Sequence, n int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n < 0 || n > s.len {
		return fmt.Errorf("kvcache: rewind sequence %d of %d tokens to %d", s.ID, s.len, n)
	}
	s.len = n
	return nil
}

// Shrink frees the blocks of s beyond those that tokens positions need.
func (m *Manager) Shrink(s *Sequence, tokens int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	keep := m.blocksFor(max(tokens, s.len))
	if keep >= len(s.blocks) {
		return
	}
	for i := len(s.blocks) - 1; i >= keep; i-- {
		m.releaseBlock(s.blocks[i])
	}
	s.blocks = s.blocks[:keep:keep]
}
