package kvcache

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"errors"
)

// Hash names a full block of tokens by its content and its whole prefix: the
// chain hash of the parent's hash and the block's tokens, rooted in the
// manager's seed (what else shapes the state: model, numerics, store) and the
// request's cache salt.
type Hash [sha256.Size]byte

// SlotCopy is a pending CopySlot of the backend store: the state of slot Src
// into slot Dst, or with Block a CopyBlock of block Src into block Dst. The
// model runs them, in order, before its next step's ops and before any slot
// reset (Manager.TakeCopies).
type SlotCopy struct {
	Src, Dst int
	Block    bool
}

// cachedBlock is a full block of committed tokens known by its hash. Shared
// by reference count; evictable (in the LRU) at zero references. snap is
// the state slot holding a copy of the sequence state at the block's end
// (-1 if none): a hit must end on a block that has one. Snapshots are always
// evictable: a restore is a copy queued before anything can reuse the slot.
type cachedBlock struct {
	hash    Hash
	block   int32
	refs    int
	snap    int
	blockEl *list.Element // in lru while refs == 0
	snapEl  *list.Element // in lru while snap >= 0
}

// lruItem is a block (snap false), the snapshot of a block, or a partial
// block with its snapshot (p set) in the LRU.
type lruItem struct {
	b    *cachedBlock
	snap bool
	p    *partialBlock
}

// prefixCache is the Manager's content-addressed state (guarded by its mu).
type prefixCache struct {
	seed      Hash // set when the model allows prefix caching
	allowed   bool
	on        bool
	byHash    map[Hash]*cachedBlock
	byBlock   map[int32]*cachedBlock
	partials  map[Hash][]*partialBlock // by the chain hash before them
	lru       *list.List               // front: evicted first
	evictable int64                    // bytes of unreferenced blocks and of snapshots
	copies    []SlotCopy
}

// AllowPrefixCaching is called by the model that owns the manager: seed
// names what changes the computed state besides the tokens (model, numerics,
// store). Managers never allowed refuse EnablePrefixCaching (a model split
// over ranks, whose other ranks would not follow the hits).
func (m *Manager) AllowPrefixCaching(seed string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pc.seed = sha256.Sum256([]byte("megamoe prefix cache v1\x00" + seed))
	m.pc.allowed = true
}

// EnablePrefixCaching turns on the reuse of cached blocks (Match, Commit).
func (m *Manager) EnablePrefixCaching() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !m.pc.allowed:
		return errors.New("kvcache: this model does not support prefix caching")
	case m.layout.BlockBytes == 0:
		return errors.New("kvcache: prefix caching needs compressed layers (blocks)")
	}
	m.pc.on = true
	m.pc.byHash = map[Hash]*cachedBlock{}
	m.pc.byBlock = map[int32]*cachedBlock{}
	m.pc.partials = map[Hash][]*partialBlock{}
	m.pc.lru = list.New()
	return nil
}

// PrefixCaching reports whether prefix caching is on.
func (m *Manager) PrefixCaching() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pc.on
}

// CachedBytes is the storage held only by the prefix cache (unreferenced
// blocks and snapshots), reclaimed on demand by Reserve.
func (m *Manager) CachedBytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pc.evictable
}

// TakeCopies returns and clears the pending slot copies.
func (m *Manager) TakeCopies() []SlotCopy {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.pc.copies
	m.pc.copies = nil
	return c
}

func chainHash(parent Hash, tokens []int32) Hash {
	buf := make([]byte, len(parent)+4*len(tokens))
	copy(buf, parent[:])
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[len(parent)+4*i:], uint32(t))
	}
	return sha256.Sum256(buf)
}

func (m *Manager) root(salt string) Hash {
	if salt == "" {
		return m.pc.seed
	}
	return sha256.Sum256(append(m.pc.seed[:], salt...))
}

// Match looks up the longest cached prefix of tokens that leaves at least
// one token to compute and ends on a block boundary with a state snapshot or
// at the end of a kept partial block (Keep), and gives s its full blocks
// (shared), a slot restored from the snapshot and, for a partial block, a
// copy of it (queued copies). It returns the number of tokens s now holds (s.Len()).
// salt isolates tenants: blocks are only found under the same salt. s must
// be new (no slot, no blocks); with prefix caching off it returns 0.
func (m *Manager) Match(s *Sequence, tokens []int32, salt string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pc.on || s == nil || s.freed || s.slot >= 0 || len(s.blocks) > 0 {
		return 0
	}
	bt := m.layout.BlockTokens
	s.prefix = true
	h := m.root(salt)
	s.root = h
	var path []*cachedBlock
	best := 0
	var part *partialBlock // the longest partial hit, after path[:partAt]
	partAt := 0
	consider := func(parent Hash, full int) {
		if p := m.longestPartial(parent, tokens, full); p != nil && (part == nil || full*bt+len(p.tokens) > partAt*bt+len(part.tokens)) {
			part, partAt = p, full
		}
	}
	consider(h, 0)
	for i := 0; (i+1)*bt < len(tokens); i++ {
		h = chainHash(h, tokens[i*bt:(i+1)*bt])
		b := m.pc.byHash[h]
		if b == nil {
			break
		}
		s.hashes = append(s.hashes, h)
		path = append(path, b)
		if b.snap >= 0 {
			best = len(path)
		}
		consider(h, len(path))
	}
	if part != nil && partAt*bt+len(part.tokens) > best*bt {
		s.hashes = s.hashes[:partAt]
		if !m.matchPartial(s, path[:partAt], part) {
			s.hashes = nil
			return 0
		}
		return s.len
	}
	s.hashes = s.hashes[:best]
	if best == 0 {
		return 0
	}
	path = path[:best]
	for _, b := range path {
		m.ref(b)
	}
	src := path[best-1].snap
	m.pc.lru.MoveToBack(path[best-1].snapEl)
	if !m.slotFree() || !m.makeRoom(m.layout.StateBytes) {
		for _, b := range path {
			m.unref(b)
		}
		s.hashes = nil
		return 0
	}
	s.slot = m.takeSlot()
	m.used += m.layout.StateBytes
	// The source may have been evicted by makeRoom: its bytes stay intact
	// until a later queued copy or reset, which runs after this one.
	m.pc.copies = append(m.pc.copies, SlotCopy{Src: src, Dst: s.slot})
	for _, b := range path {
		s.blocks = append(s.blocks, b.block)
	}
	s.committed = best
	s.len = best * bt
	return s.len
}

// Commit records the tokens s has computed (tokens[:s.Len()] at least):
// its newly full blocks enter the cache under their chain hash, and when s
// ends on a block boundary a snapshot of its state is queued there. Without
// prefix caching, or for a sequence not admitted through Match, it does
// nothing.
func (m *Manager) Commit(s *Sequence, tokens []int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pc.on || s == nil || s.freed || !s.prefix || len(tokens) < s.len {
		return
	}
	bt := m.layout.BlockTokens
	full := min(s.len/bt, len(s.blocks))
	for i := len(s.hashes); i < full; i++ {
		parent := s.root
		if i > 0 {
			parent = s.hashes[i-1]
		}
		s.hashes = append(s.hashes, chainHash(parent, tokens[i*bt:(i+1)*bt]))
	}
	for ; s.committed < full; s.committed++ {
		i := s.committed
		id, h := s.blocks[i], s.hashes[i]
		if m.pc.byBlock[id] != nil || m.pc.byHash[h] != nil {
			continue // shared from a hit, or computed twice: the first copy serves
		}
		b := &cachedBlock{hash: h, block: id, refs: 1, snap: -1}
		m.pc.byHash[h], m.pc.byBlock[id] = b, b
	}
	if s.len == 0 || s.len%bt != 0 || s.len/bt > full {
		return
	}
	b := m.pc.byHash[s.hashes[s.len/bt-1]]
	if b == nil || b.snap >= 0 {
		return
	}
	b.refs++ // keep b while making room
	ok := m.slotFree() && m.makeRoom(m.layout.StateBytes)
	b.refs--
	if !ok {
		return
	}
	b.snap = m.takeSlot()
	m.used += m.layout.StateBytes
	m.pc.evictable += m.layout.StateBytes
	b.snapEl = m.pc.lru.PushBack(lruItem{b: b, snap: true})
	m.pc.copies = append(m.pc.copies, SlotCopy{Src: s.slot, Dst: b.snap})
}

// ref adds a reference to b, taking it out of the LRU.
func (m *Manager) ref(b *cachedBlock) {
	if b.refs == 0 {
		m.pc.lru.Remove(b.blockEl)
		b.blockEl = nil
		m.pc.evictable -= m.layout.BlockBytes
	}
	b.refs++
}

// unref drops a reference; at zero b becomes evictable, most recent last.
func (m *Manager) unref(b *cachedBlock) {
	b.refs--
	if b.refs == 0 {
		b.blockEl = m.pc.lru.PushBack(lruItem{b: b})
		m.pc.evictable += m.layout.BlockBytes
	}
}

// makeRoom evicts least recently used cached storage until bytes more fit;
// false (nothing evicted) when even evicting everything would not do.
func (m *Manager) makeRoom(bytes int64) bool {
	if m.used-m.pc.evictable+bytes > m.capacity {
		return false
	}
	for m.used+bytes > m.capacity {
		m.evictOldest()
	}
	return true
}

func (m *Manager) evictOldest() {
	it := m.pc.lru.Remove(m.pc.lru.Front()).(lruItem)
	if it.p != nil {
		m.evictPartial(it.p)
		return
	}
	b := it.b
	if !it.snap {
		b.blockEl = nil
		delete(m.pc.byHash, b.hash)
		delete(m.pc.byBlock, b.block)
		m.freeBlocks = append(m.freeBlocks, b.block)
		m.used -= m.layout.BlockBytes
		m.pc.evictable -= m.layout.BlockBytes
		if b.snap < 0 {
			return
		}
		m.pc.lru.Remove(b.snapEl)
	}
	b.snapEl = nil
	m.freeSlots = append(m.freeSlots, b.snap)
	b.snap = -1
	m.used -= m.layout.StateBytes
	m.pc.evictable -= m.layout.StateBytes
}

// releaseBlock returns one of a freed sequence's blocks: a cached one loses a
// reference, a private one goes back to the free list.
func (m *Manager) releaseBlock(id int32) {
	if b := m.pc.byBlock[id]; b != nil {
		m.unref(b)
		return
	}
	m.freeBlocks = append(m.freeBlocks, id)
	m.used -= m.layout.BlockBytes
}

// slotFree reports whether takeSlot may hand out a slot under the slot limit
// (LimitSlots), evicting the least recently used snapshots for one if needed.
func (m *Manager) slotFree() bool {
	for len(m.freeSlots) == 0 && m.slotLimit > 0 && m.nextSlot >= m.slotLimit {
		if !m.evictSnapshot() {
			return false
		}
	}
	return true
}

// evictSnapshot evicts the least recently used snapshot (of a block or a
// partial block), if any.
func (m *Manager) evictSnapshot() bool {
	if m.pc.lru == nil {
		return false
	}
	for e := m.pc.lru.Front(); e != nil; e = e.Next() {
		if it := e.Value.(lruItem); it.snap || it.p != nil {
			m.pc.lru.MoveToFront(e)
			m.evictOldest()
			return true
		}
	}
	return false
}
