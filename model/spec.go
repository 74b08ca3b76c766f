package model

import (
	"fmt"

	"github.com/megamoe/megamoe/kvcache"
)

// Speculative decoding rolls back by position: every rolling state is a
// ring indexed by absolute position with Options.Drafts slack rows
// (backend.KVSpec.Slack), so a verification's rows (the last token and the
// drafts) run every stateful op once, and a rejection only rewinds the
// sequence's length. The rows rejected tokens wrote (ring rows, compressed
// entries, indexer keys, the drafters' rings) are never read, since each
// row reads the positions up to its own, and are overwritten when the
// sequence gets there.

// Drafts is the most drafts per step the cache has slack for
// (Options.Drafts).
func (m *Model) Drafts() int { return m.store.Spec().Slack }

// Rewind sets s back to n processed tokens (at most its length): the
// rejected drafts of a verification.
func (m *Model) Rewind(s *kvcache.Sequence, n int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.cache.Rewind(s, n); err != nil {
		return fmt.Errorf("model rewind: %w", err)
	}
	return nil
}
