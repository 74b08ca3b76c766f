package gpu

import (
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/kvcache"
)

// compBufs is one compressor's state of every slot: A and Z, each
// [MaxSlots][c·r][c·Dc] fp32 (ratio 4: rows [0,r) the previous window).
type compBufs struct {
	a, z *cuda.Buffer
	n    int // floats per slot
}

// kvLayer is the device storage of one layer, preallocated from the spec.
// Entries (window and compressed) are eb bytes and index keys kb bytes: fp32
// values, or kvcache.EntryFormat and kvcache.IndexKeyFormat in a compact store.
type kvLayer struct {
	spec      backend.LayerKV
	per       int          // entries per block (0 for ratio 0)
	eb, kb    int          // bytes per entry, per index key
	ring      int          // window ring entries (Window + slack)
	rows      int          // compressor ring rows (c·Ratio + slack)
	win       *cuda.Buffer // [MaxSlots][ring] entries
	kv, ik    *cuda.Buffer // [MaxBlocks][per] entries | index keys
	comp, idx compBufs
}

// newKVLayer returns the geometry of layer l's storage (no buffers yet);
// slack as backend.KVSpec.Slack.
func newKVLayer(l backend.LayerKV, compact bool, blockTokens, slack int) (kvLayer, error) {
	kl := kvLayer{spec: l, eb: 4 * l.HeadDim, kb: 4 * l.IndexDim, ring: l.Window + slack}
	if compact {
		ef, err := kvcache.NewEntryFormat(l.HeadDim, l.RopeDim)
		if err != nil {
			return kvLayer{}, err
		}
		kl.eb = ef.Bytes()
		if l.IndexDim > 0 {
			kf, err := kvcache.NewIndexKeyFormat(l.IndexDim)
			if err != nil {
				return kvLayer{}, err
			}
			kl.kb = kf.Bytes()
		}
	}
	if l.Ratio > 0 {
		c := coff(l.Ratio)
		kl.per = blockTokens / l.Ratio
		kl.rows = c*l.Ratio + slack
		kl.comp.n = kl.rows * c * l.HeadDim
		if l.IndexDim > 0 {
			kl.idx.n = kl.rows * c * l.IndexDim
		}
	}
	return kl, nil
}

// slotBytes is what one state slot takes: window ring and compressor states.
func (kl *kvLayer) slotBytes() int { return kl.ring*kl.eb + 2*4*(kl.comp.n+kl.idx.n) }

// blockBytes is what one block takes: compressed entries and index keys.
func (kl *kvLayer) blockBytes() int {
	if kl.spec.IndexDim > 0 {
		return kl.per * (kl.eb + kl.kb)
	}
	return kl.per * kl.eb
}

type kvStore struct {
	spec   backend.KVSpec
	layers []kvLayer
	ready  []bool // slot reset at least once (the CPU refuses others)
}

func (s *kvStore) Spec() backend.KVSpec { return s.spec }

func coff(ratio int) int { return backend.CompressCoff(ratio) }

// NewKVStore implements backend.Backend.
func (b *Backend) NewKVStore(spec backend.KVSpec) (backend.KVStore, error) {
	if err := backend.CheckKVSpec(spec); err != nil {
		return nil, err
	}
	if spec.Compact && !b.faithful() {
		return nil, fmt.Errorf("kv store: a compact store needs faithful numerics (exact keeps fp32)")
	}
	k := &kvStore{spec: spec, layers: make([]kvLayer, len(spec.Layers)), ready: make([]bool, spec.MaxSlots)}
	b.blockTok = spec.BlockTokens
	alloc := func(bytes int) (*cuda.Buffer, error) {
		n := max(bytes, 16)
		buf, err := b.ctx.AllocExact(n) // sized to the cache, no size-class slack
		if err != nil {
			return nil, err
		}
		if err := b.s.Memset8(buf.Ptr, 0, n); err != nil {
			buf.Free()
			return nil, err
		}
		return buf, nil
	}
	for i, l := range spec.Layers {
		kl, err := newKVLayer(l, spec.Compact, spec.BlockTokens, spec.Slack)
		if err != nil {
			return nil, fmt.Errorf("kv store: layer %d: %w", i, err)
		}
		if kl.win, err = alloc(spec.MaxSlots * kl.ring * kl.eb); err != nil {
			return nil, fmt.Errorf("kv store: layer %d window: %w", i, err)
		}
		if l.Ratio > 0 {
			if kl.kv, err = alloc(spec.MaxBlocks * kl.per * kl.eb); err != nil {
				return nil, fmt.Errorf("kv store: layer %d entries: %w", i, err)
			}
			if kl.comp, err = allocComp(alloc, spec.MaxSlots, kl.comp.n); err != nil {
				return nil, fmt.Errorf("kv store: layer %d state: %w", i, err)
			}
		}
		if l.Ratio > 0 && l.IndexDim > 0 {
			if kl.ik, err = alloc(spec.MaxBlocks * kl.per * kl.kb); err != nil {
				return nil, fmt.Errorf("kv store: layer %d index keys: %w", i, err)
			}
			if kl.idx, err = allocComp(alloc, spec.MaxSlots, kl.idx.n); err != nil {
				return nil, fmt.Errorf("kv store: layer %d index state: %w", i, err)
			}
		}
		k.layers[i] = kl
	}
	return k, nil
}

// allocComp allocates a compressor's A and Z of n floats per slot.
func allocComp(alloc func(int) (*cuda.Buffer, error), slots, n int) (compBufs, error) {
	c := compBufs{n: n}
	var err error
	if c.a, err = alloc(4 * slots * n); err != nil {
		return c, err
	}
	c.z, err = alloc(4 * slots * n)
	return c, err
}

func (b *Backend) store(s backend.KVStore) (*kvStore, error) {
	k, ok := s.(*kvStore)
	if !ok || k == nil {
		return nil, fmt.Errorf("gpu: kv store %T", s)
	}
	if k.spec.Compact && !b.faithful() {
		return nil, fmt.Errorf("gpu: compact kv store used in %v numerics (it holds faithful values only)", b.mode)
	}
	return k, nil
}

// ResetSlot implements backend.Backend: A = 0, Z = -inf, ring cleared.
func (b *Backend) ResetSlot(s backend.KVStore, slot int) error {
	if err := backend.CheckResetSlot(s, slot); err != nil {
		return err
	}
	k, err := b.store(s)
	if err != nil {
		return err
	}
	ninf := math.Float32bits(float32(math.Inf(-1)))
	for i := range k.layers {
		kl := &k.layers[i]
		wn := kl.ring * kl.eb
		if err := b.s.Memset8(kl.win.Ptr.Add(slot*wn), 0, wn); err != nil {
			return fmt.Errorf("reset slot %d: %w", slot, err)
		}
		for _, c := range []compBufs{kl.comp, kl.idx} {
			if c.a == nil {
				continue
			}
			if err := b.s.Memset8(c.a.Ptr.Add(4*slot*c.n), 0, 4*c.n); err != nil {
				return fmt.Errorf("reset slot %d: %w", slot, err)
			}
			if err := b.s.Memset32(c.z.Ptr.Add(4*slot*c.n), ninf, c.n); err != nil {
				return fmt.Errorf("reset slot %d: %w", slot, err)
			}
		}
	}
	k.ready[slot] = true
	return nil
}

// CopySlot implements backend.Backend: device-to-device copies of the slot's
// ring and compressor state per layer; copies of the same layers and part
// (a step's snapshots or restores, one per sequence) in one kernel per
// buffer when there are more than two.
func (b *Backend) CopySlot(s backend.KVStore, cs ...backend.SlotCopy) error {
	if err := backend.CheckCopySlots(s, cs); err != nil {
		return err
	}
	k, err := b.store(s)
	if err != nil {
		return err
	}
	type scope struct {
		from, to int
		part     backend.SlotPart
	}
	var order []scope
	groups := map[scope][]backend.SlotCopy{}
	for _, a := range cs {
		if !k.ready[a.Src] {
			return fmt.Errorf("copy slot: slot %d not initialised", a.Src)
		}
		sc := scope{a.From, a.To, a.Part}
		if groups[sc] == nil {
			order = append(order, sc)
		}
		groups[sc] = append(groups[sc], a)
	}
	for _, sc := range order {
		g := groups[sc]
		switch {
		case b.rec != nil && !b.rec.fixed(nil):
			err = fmt.Errorf("copy slots: the slots of a recorded step are neither an input nor fixed by its key")
		case len(g) > 2 && len(g) <= 65535 && b.rec == nil:
			err = b.copySlots(k, g)
		default:
			for _, a := range g {
				if err = b.copySlot(k, a); err != nil {
					break
				}
			}
		}
		if err != nil {
			return err
		}
	}
	for _, a := range cs {
		k.ready[a.Dst] = k.ready[a.Dst] || a.Part == backend.SlotAll && a.From == 0 && a.To == len(k.layers)
	}
	return nil
}

// slotRegion is one buffer of per-slot state and its bytes per slot.
type slotRegion struct {
	buf   *cuda.Buffer
	bytes int
}

// slotRegions lists the buffers a copy of layer l's part touches.
func (k *kvStore) slotRegions(l int, part backend.SlotPart) []slotRegion {
	kl := &k.layers[l]
	all := part == backend.SlotAll
	var rs []slotRegion
	if all || part == backend.SlotWindow { // entries of kl.eb bytes (fp32 or compact)
		rs = append(rs, slotRegion{kl.win, kl.ring * kl.eb})
	}
	for j, c := range []compBufs{kl.comp, kl.idx} {
		if c.a == nil || !all && part != []backend.SlotPart{backend.SlotComp, backend.SlotIndexComp}[j] {
			continue
		}
		rs = append(rs, slotRegion{c.a, 4 * c.n}, slotRegion{c.z, 4 * c.n})
	}
	return rs
}

// copySlot copies one slot's state, a copy per buffer.
func (b *Backend) copySlot(k *kvStore, a backend.SlotCopy) error {
	for i := a.From; i < a.To; i++ {
		for _, r := range k.slotRegions(i, a.Part) {
			if err := b.s.CopyDtoD(r.buf.Ptr.Add(a.Dst*r.bytes), r.buf.Ptr.Add(a.Src*r.bytes), r.bytes); err != nil {
				return fmt.Errorf("copy slot %d <- %d: %w", a.Dst, a.Src, err)
			}
		}
	}
	return nil
}

// slotLists returns the destination and source slots of cs.
func slotLists(cs []backend.SlotCopy) (dst, src []int32) {
	dst, src = make([]int32, len(cs)), make([]int32, len(cs))
	for i, a := range cs {
		dst[i], src[i] = int32(a.Dst), int32(a.Src)
	}
	return dst, src
}

// copySlots copies the state of independent copies of the same layers and
// part: one kernel per buffer over the slot lists.
func (b *Backend) copySlots(k *kvStore, cs []backend.SlotCopy) error {
	dst, src := slotLists(cs)
	dp, err := b.indexList(dst)
	if err != nil {
		return fmt.Errorf("copy slots: %w", err)
	}
	sp, err := b.indexList(src)
	if err != nil {
		return fmt.Errorf("copy slots: %w", err)
	}
	return b.copySlotsAt(k, cs, dp, sp)
}

// copySlotsAt is copySlots over slot lists on the device at dp and sp.
func (b *Backend) copySlotsAt(k *kvStore, cs []backend.SlotCopy, dp, sp cuda.DevicePtr) error {
	for i := cs[0].From; i < cs[0].To; i++ {
		for _, r := range k.slotRegions(i, cs[0].Part) {
			if r.bytes%4 != 0 && b.rec != nil {
				return fmt.Errorf("copy slots: a state region of %d bytes cannot take its slots from a recording's inputs", r.bytes)
			}
			if r.bytes%4 != 0 {
				for _, a := range cs {
					if err := b.s.CopyDtoD(r.buf.Ptr.Add(a.Dst*r.bytes), r.buf.Ptr.Add(a.Src*r.bytes), r.bytes); err != nil {
						return fmt.Errorf("copy slot %d <- %d: %w", a.Dst, a.Src, err)
					}
				}
				continue
			}
			if err := cuda.CopyRowsU32(b.s, r.buf.Ptr, r.buf.Ptr, dp, sp, len(cs), int64(r.bytes/4)); err != nil {
				return fmt.Errorf("copy slots: %w", err)
			}
		}
	}
	return nil
}

// CopyBlock implements backend.Backend: device-to-device copies of the
// block's entries and index keys per compressed layer.
func (b *Backend) CopyBlock(s backend.KVStore, dst, src int32) error {
	if err := backend.CheckCopyBlock(s, dst, src); err != nil {
		return err
	}
	if dst == src {
		return nil
	}
	k, err := b.store(s)
	if err != nil {
		return err
	}
	for i := range k.layers {
		kl := &k.layers[i]
		for _, c := range []struct {
			buf   *cuda.Buffer
			bytes int
		}{{kl.kv, kl.per * kl.eb}, {kl.ik, kl.per * kl.kb}} {
			if c.buf == nil || c.bytes == 0 {
				continue
			}
			if err := b.s.CopyDtoD(c.buf.Ptr.Add(int(dst)*c.bytes), c.buf.Ptr.Add(int(src)*c.bytes), c.bytes); err != nil {
				return fmt.Errorf("copy block %d <- %d: %w", dst, src, err)
			}
		}
	}
	return nil
}

// checkSeqs validates the slots of bt and (with blocks) that its block tables
// cover the entries (end/ratio of them) the step may touch in layer l.
func (k *kvStore) checkSeqs(bt *backend.Batch, layer int, blocks bool) error {
	if layer < 0 || layer >= len(k.layers) {
		return fmt.Errorf("kv store: layer %d of %d", layer, len(k.layers))
	}
	kl := &k.layers[layer]
	for i := range bt.Seqs {
		sq := &bt.Seqs[i]
		if sq.Slot < 0 || sq.Slot >= len(k.ready) || !k.ready[sq.Slot] {
			return fmt.Errorf("kv store: slot %d not initialised", sq.Slot)
		}
		if kl.spec.Ratio == 0 || !blocks {
			continue
		}
		n := (sq.Start + sq.Rows) / kl.spec.Ratio
		if n == 0 {
			continue
		}
		if bi := (n - 1) / kl.per; bi >= len(sq.Blocks) {
			return fmt.Errorf("kv store: entry %d of layer %d beyond %d reserved blocks", n-1, layer, len(sq.Blocks))
		}
		for _, id := range sq.Blocks[:(n-1)/kl.per+1] {
			if id < 0 || int(id) >= k.spec.MaxBlocks {
				return fmt.Errorf("kv store: block %d of %d", id, k.spec.MaxBlocks)
			}
		}
	}
	return nil
}
