package kvcache

import "fmt"

// Speculative decoding writes draft tokens into the cache and keeps only the
// accepted ones: the rolling state is positional (backend.KVSpec.Slack), so
// Rewind and Shrink undo the length and the blocks of the rejected tokens.

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
