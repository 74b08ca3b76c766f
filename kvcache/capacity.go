package kvcache

// MaxTokens is the longest length n such that seqs sequences of n tokens each
// fit in the capacity together (0 when not even their fixed state fits). A
// length that fits is one Reserve can always grant on an otherwise empty cache.
func (m *Manager) MaxTokens(seqs int) int {
	if seqs <= 0 {
		return 0
	}
	per := m.capacity / int64(seqs)
	if per < m.layout.StateBytes {
		return 0
	}
	if m.layout.BlockBytes == 0 {
		return maxTokens // nothing grows with length
	}
	blocks := (per - m.layout.StateBytes) / m.layout.BlockBytes
	return int(min(blocks*int64(m.layout.BlockTokens), int64(maxTokens)))
}

// maxTokens bounds MaxTokens where no block limits the length.
const maxTokens = 1 << 40

// LimitSlots caps the state slots (sequences holding cache at once) at n,
// so that a store that preallocates every slot's state (the GPU's) does not
// set aside one per sequence the capacity could hold. Call it before the
// first Reserve; n <= 0 lifts the cap.
func (m *Manager) LimitSlots(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.slotLimit = max(n, 0)
}
