package kvcache

import (
	"container/list"
	"slices"
)

// A partial block is the last, incomplete block of a sequence that ended
// (request finished or preempted): its tokens (fewer than a block), the
// block holding their compressed entries and index keys, and the sequence's
// own state slot as the snapshot at its end. Keep hands both over to the
// cache, so it costs no memory the sequence did not hold; both are
// evictable at once (one LRU item). A hit copies them (CopySlot and
// CopyBlock) because the new sequence appends into the block: the cached
// one stays intact for the next hit. The next turn of a chat, whose prompt
// extends the previous request's tokens, hits up to their exact end.
// KeepCopy files one more kind, copies of a running sequence's block and
// slot at a point inside its prompt, which do take memory of their own.
type partialBlock struct {
	parent Hash    // chain hash of the full blocks before it (or the root)
	tokens []int32 // 0 < len < BlockTokens
	block  int32
	snap   int
	el     *list.Element
}

// Keep records the end of a sequence about to be freed, whose computed
// tokens are tokens (s.Len() of them, committed): a partial last block is
// kept with the sequence's slot as its snapshot; a sequence ending on a
// block boundary gives its slot to that block as its snapshot if it has
// none. It does nothing without prefix caching or when the cache already
// holds the same end. Free must follow.
func (m *Manager) Keep(s *Sequence, tokens []int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pc.on || s == nil || s.freed || !s.prefix || s.slot < 0 || s.len == 0 || len(tokens) != s.len {
		return
	}
	bt := m.layout.BlockTokens
	full, n := s.len/bt, s.len%bt
	if len(s.hashes) < full || s.committed < full {
		return // not committed (Commit must run first)
	}
	if n == 0 {
		if b := m.pc.byHash[s.hashes[full-1]]; b != nil && b.snap < 0 {
			m.giveSnap(b, s)
		}
		return
	}
	if len(s.blocks) <= full {
		return
	}
	parent := s.root
	if full > 0 {
		parent = s.hashes[full-1]
	}
	tail := tokens[full*bt:]
	if m.touchPartial(parent, tail) {
		return
	}
	m.addPartial(&partialBlock{parent: parent, tokens: slices.Clone(tail), block: s.blocks[full], snap: s.slot})
	s.blocks = slices.Delete(s.blocks, full, full+1)
	s.slot = -1
}

// KeepCopy keeps the state of s at its current end (tokens, its s.Len()
// computed tokens, committed) while s goes on: a new slot and a new block
// take copies of its slot and of its partial last block (queued copies) and
// are kept as a partial block, evictable as the others. It serves a point
// where a follow-up request stops repeating this one's tokens (a thinking
// chat's next turn renders the generation prefix differently). It does
// nothing on a block boundary (Commit snapshots there), when the cache holds
// the same end, or without room.
func (m *Manager) KeepCopy(s *Sequence, tokens []int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pc.on || s == nil || s.freed || !s.prefix || s.slot < 0 || len(tokens) != s.len {
		return
	}
	bt := m.layout.BlockTokens
	full, n := s.len/bt, s.len%bt
	if n == 0 || len(s.hashes) < full || s.committed < full || len(s.blocks) <= full {
		return
	}
	parent := s.root
	if full > 0 {
		parent = s.hashes[full-1]
	}
	tail := tokens[full*bt:]
	if m.touchPartial(parent, tail) || !m.slotFree() || !m.makeRoom(m.layout.StateBytes+m.layout.BlockBytes) {
		return
	}
	p := &partialBlock{parent: parent, tokens: slices.Clone(tail), block: m.takeBlock(), snap: m.takeSlot()}
	m.used += m.layout.StateBytes + m.layout.BlockBytes
	m.addPartial(p)
	m.pc.copies = append(m.pc.copies, SlotCopy{Src: s.slot, Dst: p.snap}, SlotCopy{Src: int(s.blocks[full]), Dst: int(p.block), Block: true})
}

// touchPartial reports whether the cache holds a partial block of these
// tokens after parent, marking it most recently used.
func (m *Manager) touchPartial(parent Hash, tokens []int32) bool {
	for _, p := range m.pc.partials[parent] {
		if slices.Equal(p.tokens, tokens) {
			m.pc.lru.MoveToBack(p.el)
			return true
		}
	}
	return false
}

// addPartial files p (its block and slot already counted in used) as
// evictable cache.
func (m *Manager) addPartial(p *partialBlock) {
	m.pc.evictable += m.layout.BlockBytes + m.layout.StateBytes
	p.el = m.pc.lru.PushBack(lruItem{p: p})
	m.pc.partials[p.parent] = append(m.pc.partials[p.parent], p)
}

// giveSnap makes the slot of s (about to be freed) b's snapshot.
func (m *Manager) giveSnap(b *cachedBlock, s *Sequence) {
	b.snap = s.slot
	s.slot = -1
	m.pc.evictable += m.layout.StateBytes
	b.snapEl = m.pc.lru.PushBack(lruItem{b: b, snap: true})
}

// longestPartial returns the cached partial block that extends the first
// full blocks of tokens (whose chain hash is parent) the furthest while
// leaving at least one token to compute, or nil.
func (m *Manager) longestPartial(parent Hash, tokens []int32, full int) *partialBlock {
	bt := m.layout.BlockTokens
	rest := tokens[full*bt:]
	var best *partialBlock
	for _, p := range m.pc.partials[parent] {
		if len(p.tokens) < len(rest) && (best == nil || len(p.tokens) > len(best.tokens)) &&
			slices.Equal(p.tokens, rest[:len(p.tokens)]) {
			best = p
		}
	}
	return best
}

// matchPartial gives s (holding nothing yet) the full blocks path and a
// copy of partial p after them: a new slot restored from p's snapshot and a
// new block copied from p's block. False (nothing changed) without room.
func (m *Manager) matchPartial(s *Sequence, path []*cachedBlock, p *partialBlock) bool {
	for _, b := range path {
		m.ref(b)
	}
	m.pc.lru.MoveToBack(p.el)
	if !m.slotFree() || !m.makeRoom(m.layout.StateBytes+m.layout.BlockBytes) {
		for _, b := range path {
			m.unref(b)
		}
		return false
	}
	// p may have been evicted by makeRoom: its bytes stay intact until a
	// later queued copy or write, which run after these copies.
	s.slot = m.takeSlot()
	blk := m.takeBlock()
	m.used += m.layout.StateBytes + m.layout.BlockBytes
	m.pc.copies = append(m.pc.copies, SlotCopy{Src: p.snap, Dst: s.slot}, SlotCopy{Src: int(p.block), Dst: int(blk), Block: true})
	for _, b := range path {
		s.blocks = append(s.blocks, b.block)
	}
	s.blocks = append(s.blocks, blk)
	s.committed = len(path)
	s.len = len(path)*m.layout.BlockTokens + len(p.tokens)
	return true
}

// evictPartial frees partial p's block and slot.
func (m *Manager) evictPartial(p *partialBlock) {
	ps := m.pc.partials[p.parent]
	ps = slices.DeleteFunc(ps, func(x *partialBlock) bool { return x == p })
	if len(ps) == 0 {
		delete(m.pc.partials, p.parent)
	} else {
		m.pc.partials[p.parent] = ps
	}
	p.el = nil
	m.freeBlocks = append(m.freeBlocks, p.block)
	m.freeSlots = append(m.freeSlots, p.snap)
	m.used -= m.layout.BlockBytes + m.layout.StateBytes
	m.pc.evictable -= m.layout.BlockBytes + m.layout.StateBytes
}
