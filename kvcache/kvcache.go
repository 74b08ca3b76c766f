package kvcache

import (
	"errors"
	"fmt"
	"sync"

	"github.com/megamoe/megamoe/checkpoint"
)

// ErrCacheFull is returned by Reserve when the capacity is exhausted.
var ErrCacheFull = errors.New("kv cache full")

// LayerKind is the cache shape of one layer (main layers, then the MTP block).
type LayerKind struct {
	Window   int // window ring entries
	HeadDim  int // KV entry width
	RopeDim  int // rope dims at the end of an entry (bf16 in the compact store)
	Ratio    int // 0, 4, 128
	IndexDim int // indexer key width (ratio 4), else 0
}

// Layout is the byte geometry of the cache of one model.
type Layout struct {
	BlockTokens int   // token positions covered by one block
	Store       Store // how entries and index keys are kept
	EntryBytes  int   // bytes of one KV entry (window slot or compressed entry)
	IndexBytes  int   // bytes of one indexer key (0 if no layer has an indexer)
	StateBytes  int64 // fixed bytes per sequence: window rings + compressor states
	BlockBytes  int64 // bytes of one block over all compressed layers (0 if none)
	Layers      []LayerKind
	// Slack is the rows every rolling state has beyond its window
	// (backend.KVSpec.Slack: the drafts a step writes past a sequence's
	// committed length), counted in StateBytes.
	Slack int
}

// WithSlack is l with n more slack rows in every window ring and
// compressor pending state.
func (l Layout) WithSlack(n int) Layout {
	for _, k := range l.Layers {
		l.StateBytes += int64(n) * int64(l.EntryBytes)
		if k.Ratio > 0 {
			cc := int64(compressCoff(k.Ratio))
			l.StateBytes += 2 * int64(n) * cc * int64(k.HeadDim+k.IndexDim) * 4
		}
	}
	l.Slack += n
	return l
}

// compressCoff is the compressor's c (backend.CompressCoff).
func compressCoff(ratio int) int {
	if ratio == 4 {
		return 2
	}
	return 1
}

// DefaultBlockTokens is a multiple of every compression ratio.
const DefaultBlockTokens = 256

// LayoutFromConfig derives the layout of a checkpoint's layers (incl. MTP)
// for a store kind: StoreF32 keeps 4 bytes per value, StoreCompact keeps
// entries in EntryFormat and index keys in IndexKeyFormat. Compressor pending
// state is fp32 in both.
func LayoutFromConfig(c *checkpoint.Config, blockTokens int, s Store) (Layout, error) {
	if blockTokens <= 0 || blockTokens%128 != 0 {
		return Layout{}, fmt.Errorf("kvcache: block tokens %d must be a positive multiple of 128", blockTokens)
	}
	l := Layout{BlockTokens: blockTokens, Store: s, EntryBytes: c.HeadDim * 4, IndexBytes: c.IndexHeadDim * 4}
	if s == StoreCompact {
		e, err := NewEntryFormat(c.HeadDim, c.RopeDim)
		if err != nil {
			return Layout{}, fmt.Errorf("kvcache: layout: %w", err)
		}
		l.EntryBytes = e.Bytes()
		if c.IndexHeadDim > 0 {
			k, err := NewIndexKeyFormat(c.IndexHeadDim)
			if err != nil {
				return Layout{}, fmt.Errorf("kvcache: layout: %w", err)
			}
			l.IndexBytes = k.Bytes()
		}
	}
	for i := range c.Layers + c.MTPLayers + c.DSparkLayers() {
		r := c.Ratio(i)
		k := LayerKind{Window: c.Window, HeadDim: c.HeadDim, RopeDim: c.RopeDim, Ratio: r}
		if i >= c.Layers && c.HasDSpark() {
			k.Window += c.DSparkBlockSize // a DSpark stage's key range spans its block too (model/dspark.go)
		}
		if r == 4 {
			k.IndexDim = c.IndexHeadDim
		}
		l.Layers = append(l.Layers, k)
		l.StateBytes += int64(k.Window) * int64(l.EntryBytes)
		if r > 0 {
			cc := compressCoff(r)
			// pending state: (A, Z) fp32 for cc·r rows of cc·Dc values.
			l.StateBytes += int64(2*cc*r*cc*k.HeadDim) * 4
			l.BlockBytes += int64(blockTokens/r) * int64(l.EntryBytes)
			if k.IndexDim > 0 {
				l.StateBytes += int64(2*cc*r*cc*k.IndexDim) * 4
				l.BlockBytes += int64(blockTokens/r) * int64(l.IndexBytes)
			}
		}
	}
	return l, nil
}

// Sequence is one sequence's cache handle.
type Sequence struct {
	ID     int64
	len    int
	slot   int
	blocks []int32
	fresh  bool
	freed  bool
	// Prefix cache (Match, Commit): the chain hashes of its full blocks, how
	// many of its blocks were offered to the cache, and its hash root.
	prefix    bool
	root      Hash
	hashes    []Hash
	committed int
}

// Len is the number of tokens processed so far.
func (s *Sequence) Len() int { return s.len }

// Slot is the state slot, -1 before the first Reserve.
func (s *Sequence) Slot() int { return s.slot }

// Blocks is the block table (read-only for callers).
func (s *Sequence) Blocks() []int32 { return s.blocks }

// Manager hands out state slots and blocks within a byte capacity.
type Manager struct {
	mu         sync.Mutex
	layout     Layout
	capacity   int64
	used       int64
	freeBlocks []int32
	nextBlock  int32
	freeSlots  []int
	nextSlot   int
	slotLimit  int // 0: as many as the capacity holds
	nextID     int64
	pc         prefixCache
}

// NewManager creates a manager for `layout` holding at most capacityBytes.
func NewManager(layout Layout, capacityBytes int64) *Manager {
	return &Manager{layout: layout, capacity: max(capacityBytes, 0)}
}

// Layout returns the geometry.
func (m *Manager) Layout() Layout { return m.layout }

// MaxBlocks is an upper bound on block ids (for sizing backend storage).
func (m *Manager) MaxBlocks() int {
	if m.layout.BlockBytes == 0 {
		return 0
	}
	return int(m.capacity / m.layout.BlockBytes)
}

// MaxSlots is an upper bound on state slot ids.
func (m *Manager) MaxSlots() int {
	if m.layout.StateBytes == 0 {
		return 0
	}
	n := int(m.capacity / m.layout.StateBytes)
	if m.slotLimit > 0 {
		n = min(n, m.slotLimit)
	}
	return n
}

// NewSequence returns an empty sequence; it holds no memory until Reserve.
func (m *Manager) NewSequence() *Sequence {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextID++
	return &Sequence{ID: m.nextID, slot: -1}
}

func (m *Manager) blocksFor(tokens int) int {
	if m.layout.BlockBytes == 0 || tokens <= 0 {
		return 0
	}
	return (tokens + m.layout.BlockTokens - 1) / m.layout.BlockTokens
}

// BytesFor is the cache size of one sequence of `tokens` tokens.
func (m *Manager) BytesFor(tokens int) int64 {
	return m.layout.StateBytes + int64(m.blocksFor(tokens))*m.layout.BlockBytes
}

// Reserve makes sure s owns storage for newLen tokens. On ErrCacheFull nothing changes.
func (m *Manager) Reserve(s *Sequence, newLen int) error {
	if s == nil {
		return errors.New("kvcache: nil sequence")
	}
	if newLen < 0 {
		return fmt.Errorf("kvcache: reserve %d tokens", newLen)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.freed {
		return fmt.Errorf("kvcache: sequence %d was freed", s.ID)
	}
	needSlot := s.slot < 0
	add := max(m.blocksFor(newLen)-len(s.blocks), 0)
	bytes := int64(add) * m.layout.BlockBytes
	if needSlot {
		bytes += m.layout.StateBytes
	}
	if needSlot && !m.slotFree() {
		return fmt.Errorf("reserve a state slot for sequence %d: all %d in use: %w", s.ID, m.slotLimit, ErrCacheFull)
	}
	if !m.makeRoom(bytes) {
		return fmt.Errorf("reserve %d tokens for sequence %d (%d of %d bytes used, %d more needed): %w",
			newLen, s.ID, m.used-m.pc.evictable, m.capacity, bytes, ErrCacheFull)
	}
	if needSlot {
		s.slot = m.takeSlot()
		s.fresh = true
	}
	for range add {
		s.blocks = append(s.blocks, m.takeBlock())
	}
	m.used += bytes
	return nil
}

func (m *Manager) takeSlot() int {
	if n := len(m.freeSlots); n > 0 {
		id := m.freeSlots[n-1]
		m.freeSlots = m.freeSlots[:n-1]
		return id
	}
	m.nextSlot++
	return m.nextSlot - 1
}

func (m *Manager) takeBlock() int32 {
	if n := len(m.freeBlocks); n > 0 {
		id := m.freeBlocks[n-1]
		m.freeBlocks = m.freeBlocks[:n-1]
		return id
	}
	m.nextBlock++
	return m.nextBlock - 1
}

// TakeFresh reports (once) that s got a new state slot that must be reset.
func (m *Manager) TakeFresh(s *Sequence) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := s.fresh
	s.fresh = false
	return f
}

// Advance records that n more tokens of s were processed.
func (m *Manager) Advance(s *Sequence, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s.len += n
}

// Free returns all storage of s; s cannot be used afterwards.
func (m *Manager) Free(s *Sequence) {
	if s == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.freed {
		return
	}
	if s.slot >= 0 {
		m.freeSlots = append(m.freeSlots, s.slot)
		m.used -= m.layout.StateBytes
	}
	// Last block first: a prefix's tail is evicted before its head.
	for i := len(s.blocks) - 1; i >= 0; i-- {
		m.releaseBlock(s.blocks[i])
	}
	s.blocks, s.slot, s.len, s.freed, s.hashes = nil, -1, 0, true, nil
}

// UsedBytes is the storage currently owned by sequences (the prefix cache's
// unreferenced blocks and snapshots are CachedBytes).
func (m *Manager) UsedBytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used - m.pc.evictable
}

// CapacityBytes is the configured capacity.
func (m *Manager) CapacityBytes() int64 { return m.capacity }
