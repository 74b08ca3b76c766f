package cpu

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/num"
)

// compState is the pending state of one compressor: a ring of
// KVSpec.CompRows rows of width c·Dc, position p at row p mod CompRows.
type compState struct{ A, Z []float32 }

type layerState struct {
	win       []float32 // RingLen × HeadDim ring, slot = pos mod RingLen (fp32 store)
	winC      []byte    // the ring as RingLen compact entries (compact store)
	comp, idx compState
}

type slotState struct{ layers []layerState }

type blockLayer struct {
	kv, ik   []float32 // fp32 store
	kvC, ikC []byte    // compact store: EntryFormat entries, IndexKeyFormat keys
}

type blockData struct{ layers []blockLayer }

type kvStore struct {
	spec   backend.KVSpec
	fmts   []layerFormat // per layer for a compact store, nil for fp32
	mu     sync.Mutex
	slots  []*slotState
	blocks []*blockData
}

func (s *kvStore) Spec() backend.KVSpec { return s.spec }

func coff(ratio int) int { return backend.CompressCoff(ratio) }

// NewKVStore implements backend.Backend. Storage is allocated lazily per slot and block id.
func (b *Backend) NewKVStore(spec backend.KVSpec) (backend.KVStore, error) {
	if err := backend.CheckKVSpec(spec); err != nil {
		return nil, err
	}
	fmts, err := compactFormats(spec)
	if err != nil {
		return nil, err
	}
	return &kvStore{spec: spec, fmts: fmts, slots: make([]*slotState, spec.MaxSlots), blocks: make([]*blockData, spec.MaxBlocks)}, nil
}

func store(s backend.KVStore) (*kvStore, error) {
	k, ok := s.(*kvStore)
	if !ok || k == nil {
		return nil, fmt.Errorf("cpu: kv store %T", s)
	}
	return k, nil
}

func newComp(rows, ratio, dim int) compState {
	n := rows * coff(ratio) * dim
	st := compState{A: make([]float32, n), Z: make([]float32, n)}
	return st
}

func (c *compState) reset() {
	clear(c.A)
	for i := range c.Z {
		c.Z[i] = float32(math.Inf(-1))
	}
}

// ResetSlot implements backend.Backend.
func (b *Backend) ResetSlot(s backend.KVStore, slot int) error {
	if err := backend.CheckResetSlot(s, slot); err != nil {
		return err
	}
	k, err := store(s)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	st := k.alloc(slot)
	for i := range st.layers {
		ls := &st.layers[i]
		clear(ls.win)
		clear(ls.winC)
		ls.comp.reset()
		ls.idx.reset()
	}
	return nil
}

// alloc returns slot id, allocating it on first use (k.mu held).
func (k *kvStore) alloc(id int) *slotState {
	st := k.slots[id]
	if st == nil {
		st = &slotState{layers: make([]layerState, len(k.spec.Layers))}
		for i, l := range k.spec.Layers {
			ls := &st.layers[i]
			if k.fmts != nil {
				ls.winC = make([]byte, k.spec.RingLen(i)*k.fmts[i].entry.Bytes())
			} else {
				ls.win = make([]float32, k.spec.RingLen(i)*l.HeadDim)
			}
			if l.Ratio > 0 {
				ls.comp = newComp(k.spec.CompRows(i), l.Ratio, l.HeadDim)
				if l.IndexDim > 0 {
					ls.idx = newComp(k.spec.CompRows(i), l.Ratio, l.IndexDim)
				}
			}
		}
		k.slots[id] = st
	}
	return st
}

// CopySlot implements backend.Backend: one copy after another.
func (b *Backend) CopySlot(s backend.KVStore, cs ...backend.SlotCopy) error {
	if err := backend.CheckCopySlots(s, cs); err != nil {
		return err
	}
	for _, a := range cs {
		if err := b.copySlot(s, a); err != nil {
			return err
		}
	}
	return nil
}

func (b *Backend) copySlot(s backend.KVStore, a backend.SlotCopy) error {
	k, err := store(s)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	src := k.slots[a.Src]
	if src == nil {
		return fmt.Errorf("copy slot: slot %d not initialised", a.Src)
	}
	dst := k.alloc(a.Dst)
	for i := a.From; i < a.To; i++ {
		d, s := &dst.layers[i], &src.layers[i]
		if a.Part == backend.SlotAll || a.Part == backend.SlotWindow {
			copy(d.win, s.win)
			copy(d.winC, s.winC)
		}
		for part, p := range map[backend.SlotPart][2]*compState{backend.SlotComp: {&d.comp, &s.comp}, backend.SlotIndexComp: {&d.idx, &s.idx}} {
			if a.Part == backend.SlotAll || a.Part == part {
				copy(p[0].A, p[1].A)
				copy(p[0].Z, p[1].Z)
			}
		}
	}
	return nil
}

// CopyBlock implements backend.Backend. A source block never written is
// all zeros, as a fresh one reads.
func (b *Backend) CopyBlock(s backend.KVStore, dst, src int32) error {
	if err := backend.CheckCopyBlock(s, dst, src); err != nil {
		return err
	}
	if dst == src {
		return nil
	}
	k, err := store(s)
	if err != nil {
		return err
	}
	from, err := k.block(src)
	if err != nil {
		return fmt.Errorf("copy block: %w", err)
	}
	to, err := k.block(dst)
	if err != nil {
		return fmt.Errorf("copy block: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := range to.layers {
		d, s := &to.layers[i], &from.layers[i]
		copy(d.kv, s.kv)
		copy(d.ik, s.ik)
		copy(d.kvC, s.kvC)
		copy(d.ikC, s.ikC)
	}
	return nil
}

func (k *kvStore) slot(id int) (*slotState, error) {
	if id < 0 || id >= len(k.slots) || k.slots[id] == nil {
		return nil, fmt.Errorf("kv store: slot %d not initialised", id)
	}
	return k.slots[id], nil
}

// block returns (allocating) block id.
func (k *kvStore) block(id int32) (*blockData, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if id < 0 || int(id) >= len(k.blocks) {
		return nil, fmt.Errorf("kv store: block %d of %d", id, len(k.blocks))
	}
	if k.blocks[id] == nil {
		bd := &blockData{layers: make([]blockLayer, len(k.spec.Layers))}
		for i, l := range k.spec.Layers {
			if l.Ratio == 0 {
				continue
			}
			per := k.spec.BlockTokens / l.Ratio
			if k.fmts != nil {
				bd.layers[i].kvC = make([]byte, per*k.fmts[i].entry.Bytes())
				if l.IndexDim > 0 {
					bd.layers[i].ikC = make([]byte, per*k.fmts[i].index.Bytes())
				}
				continue
			}
			bd.layers[i].kv = make([]float32, per*l.HeadDim)
			if l.IndexDim > 0 {
				bd.layers[i].ik = make([]float32, per*l.IndexDim)
			}
		}
		k.blocks[id] = bd
	}
	return k.blocks[id], nil
}

// entry returns compressed entry j of layer (index keys when idx) of a
// sequence in an fp32 store.
func (k *kvStore) entry(sq *backend.SeqInfo, layer, j int, idx bool) ([]float32, error) {
	if k.fmts != nil {
		return nil, fmt.Errorf("kv store: layer %d entry %d: fp32 view of a compact store", layer, j)
	}
	bl, o, err := k.loc(sq, layer, j)
	if err != nil {
		return nil, err
	}
	l := k.spec.Layers[layer]
	if idx {
		return bl.ik[o*l.IndexDim : (o+1)*l.IndexDim], nil
	}
	return bl.kv[o*l.HeadDim : (o+1)*l.HeadDim], nil
}

// Compress implements backend.Backend (spec §5.4): per token, A and Z+ape enter
// the pending state; when a window completes, the entry is pooled (per-channel
// softmax over the slots), rounded to bf16, RMS-normed, roped at the window's
// first position and FP8- or Hadamard+FP4-simulated, then stored.
func (b *Backend) Compress(s backend.KVStore, A, Z backend.Tensor, a backend.CompressArgs, bt *backend.Batch) error {
	t, err := backend.Tensors[*Tensor](backend.CheckCompress(s, A, Z, a, bt), "compress", A, Z)
	if err != nil {
		return err
	}
	k, err := store(s)
	if err != nil {
		return err
	}
	at, zt := t[0], t[1]
	r, dc, c := a.Ratio, a.Dim, coff(a.Ratio)
	w := c * dc
	L := k.spec.CompRows(a.Layer)
	ape, okA := a.APE.(*mat)
	nw, okN := a.Norm.(*vec)
	if !okA || !okN {
		return fmt.Errorf("compress layer %d: ape %T, norm %T", a.Layer, a.APE, a.Norm)
	}
	// Allocate blocks up front (the lazy allocation takes the store lock).
	for si := range bt.Seqs {
		sq := &bt.Seqs[si]
		end := sq.Start + sq.Rows
		if n := end / r; n > 0 {
			if _, _, err := k.loc(sq, a.Layer, n-1); err != nil {
				return fmt.Errorf("compress layer %d: %w", a.Layer, err)
			}
		}
	}
	faithful := b.faithful()
	return b.parallelErr(len(bt.Seqs), func(lo, hi int) error {
		u := make([]float32, dc)
		e := make([]float32, dc)
		for si := lo; si < hi; si++ {
			sq := &bt.Seqs[si]
			slot, err := k.slot(sq.Slot)
			if err != nil {
				return err
			}
			ls := &slot.layers[a.Layer]
			st := &ls.comp
			if a.Kind == backend.CompressIndex {
				st = &ls.idx
			}
			for i := range sq.Rows {
				row := sq.Row0 + i
				t := int(bt.Pos[row])
				wi := t % r
				sr := t % L
				copy(st.A[sr*w:(sr+1)*w], at.Row(row))
				zr := st.Z[sr*w : (sr+1)*w]
				for ch, v := range zt.Row(row) {
					zr[ch] = v + ape.v[wi*w+ch]
				}
				if (t+1)%r != 0 {
					continue
				}
				j := (t+1)/r - 1
				pool(st, t, L, r, dc, c, u)
				if faithful {
					num.RoundBF16Slice(u)
				}
				rmsnorm(u, nw.v, e, a.NormEps, faithful)
				ropeRow(e, 1, dc, j*r, a.Rope, false, faithful)
				if a.Kind == backend.CompressIndex {
					hadamardFP4(e, faithful)
				} else if faithful {
					quantFP8(e[:dc-a.Rope.Dim()], 64)
				}
				if err := k.writeEntry(sq, a.Layer, j, a.Kind == backend.CompressIndex, e); err != nil {
					return fmt.Errorf("compress: %w", err)
				}
			}
		}
		return nil
	})
}

// pool computes the per-channel softmax-weighted sum over the c·r positions
// up to t (the window's last), oldest first, from the ring of L rows. Ratio
// 4: the "a" halves of the previous window's rows, then the "b" halves of
// the current one's. The previous window of the first entry is positions
// below 0, ring rows never written since the reset (z = -inf).
func pool(st *compState, t, L, r, dc, c int, u []float32) {
	w := c * dc
	nslots := c * r
	off := func(s int) int {
		o := ((t-nslots+1+s)%L + L) % L * w
		if c == 2 && s >= r {
			o += dc // "b" half of the current window
		}
		return o
	}
	for ch := range dc {
		mx := float32(math.Inf(-1))
		for s := range nslots {
			mx = max(mx, st.Z[off(s)+ch])
		}
		var den float32
		for s := range nslots {
			den += exp32(st.Z[off(s)+ch] - mx)
		}
		var acc float32
		for s := range nslots {
			p := exp32(st.Z[off(s)+ch]-mx) / den
			acc += st.A[off(s)+ch] * p
		}
		u[ch] = acc
	}
}

// IndexerTopK implements backend.Backend (spec §5.5).
func (b *Backend) IndexerTopK(s backend.KVStore, q, w backend.Tensor, a backend.IndexerArgs, bt *backend.Batch, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckIndexerTopK(s, q, w, a, bt, out), "indexer", q, w, out)
	if err != nil {
		return err
	}
	k, err := store(s)
	if err != nil {
		return err
	}
	qt, wt, ot, n := t[0], t[1], t[2], bt.Rows()
	faithful := b.faithful()
	return b.parallelErr(n, func(lo, hi int) error {
		var scores []float32
		var order []int32
		var kb []float32 // a decoded key (compact store)
		if k.fmts != nil {
			kb = make([]float32, a.HeadDim)
		}
		for row := lo; row < hi; row++ {
			sq := &bt.Seqs[bt.Seq[row]]
			t := int(bt.Pos[row])
			avail := (t + 1) / a.Ratio
			scores = scores[:0]
			qr, wr := qt.Row(row), wt.Row(row)
			for j := range avail {
				key, err := k.readEntry(sq, a.Layer, j, true, kb)
				if err != nil {
					return fmt.Errorf("indexer: %w", err)
				}
				var acc float32
				for h := range a.Heads {
					d := dot(qr[h*a.HeadDim:(h+1)*a.HeadDim], key)
					if faithful {
						d = num.RoundBF16(d)
					}
					d = max(d, 0)
					v := d * wr[h]
					if faithful {
						v = num.RoundBF16(v)
					}
					acc += v
				}
				scores = append(scores, b.rb(acc))
			}
			if a.Trace {
				if st := SliceStats(scores); st.FirstBad >= 0 {
					return &backend.OpNonFinite{Component: "indexer scores", Row: row, Stats: st, In: SliceStats(qr)}
				}
			}
			order = indexTopK(scores, a.TopK, order[:0])
			or := ot.I[row*a.TopK : (row+1)*a.TopK]
			for i := range or {
				if i < len(order) {
					or[i] = order[i]
				} else {
					or[i] = -1
				}
			}
		}
		return nil
	})
}

// indexTopK appends to h the indices of the k best scores, best first: descending
// score, ties to the lower index (project rule, §5.5). A heap of k keeps a step
// at long context O(n log k) instead of sorting every candidate.
func indexTopK(scores []float32, k int, h []int32) []int32 {
	// before: the order of a stable sort by descending score.
	before := func(x, y int32) bool {
		sx, sy := scores[x], scores[y]
		return sx > sy || (!(sx < sy) && x < y)
	}
	// h is a heap with the worst kept index at its root.
	down := func(i int) {
		for {
			w, l, r := i, 2*i+1, 2*i+2
			if l < len(h) && before(h[w], h[l]) {
				w = l
			}
			if r < len(h) && before(h[w], h[r]) {
				w = r
			}
			if w == i {
				return
			}
			h[i], h[w] = h[w], h[i]
			i = w
		}
	}
	for j := range int32(len(scores)) {
		switch {
		case len(h) < k:
			h = append(h, j)
			for i := len(h) - 1; i > 0 && before(h[(i-1)/2], h[i]); i = (i - 1) / 2 {
				h[i], h[(i-1)/2] = h[(i-1)/2], h[i]
			}
		case k > 0 && before(j, h[0]):
			h[0] = j
			down(0)
		}
	}
	slices.SortFunc(h, func(x, y int32) int {
		if before(x, y) {
			return -1
		}
		return 1
	})
	return h
}

// SparseAttention implements backend.Backend (spec §5.6–§5.7): per row and head
// an online softmax over the index list (window part, then compressed part) in
// blocks of 64 slots; faithful mode rounds P to bf16 before P·V; the sink adds
// exp(sink − m) to the denominator only.
func (b *Backend) SparseAttention(s backend.KVStore, q, kv, sel backend.Tensor, a backend.AttnArgs, bt *backend.Batch, out backend.Tensor) error {
	t, err := backend.Tensors[*Tensor](backend.CheckSparseAttention(s, q, kv, sel, a, bt, out), "attention", q, kv, out)
	if err != nil {
		return err
	}
	k, err := store(s)
	if err != nil {
		return err
	}
	qt, kt, ot := t[0], t[1], t[2]
	n, D, H := bt.Rows(), a.HeadDim, a.Heads
	var st *Tensor
	if a.Ratio == 4 {
		if st, err = ct(sel); err != nil {
			return fmt.Errorf("attention selection: %w", err)
		}
	}
	sink, ok := a.Sink.(*vec)
	if !ok {
		return fmt.Errorf("attention layer %d: sink %T", a.Layer, a.Sink)
	}
	faithful := b.faithful()
	W := a.Window
	return b.parallelErr(n, func(lo, hi int) error {
		var keys [][]float32
		bufs := decodeBufs{on: k.fmts != nil}
		sc := make([]float32, 64)
		acc := make([]float32, D)
		for row := lo; row < hi; row++ {
			sq := &bt.Seqs[bt.Seq[row]]
			t := int(bt.Pos[row])
			slot, err := k.slot(sq.Slot)
			if err != nil {
				return err
			}
			ls := &slot.layers[a.Layer]
			switch a.Ratio {
			case 128:
				bufs.reset(W+(t+1)/128, D)
			case 4:
				bufs.reset(W+st.cols, D)
			default:
				bufs.reset(W, D)
			}
			// Window part: ascending positions, padded with empty slots to W
			// (min(rows, W) for a prefill that starts at position 0, as the reference).
			wslots := W
			if sq.Start == 0 {
				wslots = min(sq.Rows, W)
			}
			keys = keys[:0]
			p0 := max(0, t-W+1)
			for p := p0; p <= t; p++ {
				if p >= sq.Start {
					keys = append(keys, kt.Row(sq.Row0+p-sq.Start))
				} else {
					kk, err := k.readRing(ls, a.Layer, p, bufs.next())
					if err != nil {
						return fmt.Errorf("attention: %w", err)
					}
					keys = append(keys, kk)
				}
			}
			for len(keys) < wslots {
				keys = append(keys, nil)
			}
			switch a.Ratio {
			case 128:
				for j := range (t + 1) / 128 {
					e, err := k.readEntry(sq, a.Layer, j, false, bufs.next())
					if err != nil {
						return fmt.Errorf("attention: %w", err)
					}
					keys = append(keys, e)
				}
			case 4:
				for _, j := range st.I[row*st.cols : (row+1)*st.cols] {
					if j < 0 || int(j) >= (t+1)/4 {
						keys = append(keys, nil)
						continue
					}
					e, err := k.readEntry(sq, a.Layer, int(j), false, bufs.next())
					if err != nil {
						return fmt.Errorf("attention: %w", err)
					}
					keys = append(keys, e)
				}
			}
			for h := range H {
				qh := qt.Row(row)[h*D : (h+1)*D]
				m := float32(math.Inf(-1))
				var l float32
				clear(acc)
				for b0 := 0; b0 < len(keys); b0 += 64 {
					blk := keys[b0:min(b0+64, len(keys))]
					bm := float32(math.Inf(-1))
					for i, kk := range blk {
						if kk == nil {
							sc[i] = float32(math.Inf(-1))
							continue
						}
						sc[i] = dot(qh, kk) * a.Scale
						bm = max(bm, sc[i])
					}
					mn := max(m, bm)
					if math.IsInf(float64(mn), -1) {
						continue // nothing real yet
					}
					alpha := exp32(m - mn)
					l *= alpha
					for i := range acc {
						acc[i] *= alpha
					}
					for i, kk := range blk {
						if kk == nil {
							continue
						}
						p := exp32(sc[i] - mn)
						l += p
						if faithful {
							p = num.RoundBF16(p)
						}
						for d, v := range kk {
							acc[d] += p * v
						}
					}
					m = mn
				}
				l += exp32(sink.v[h] - m)
				o := ot.Row(row)[h*D : (h+1)*D]
				for d := range o {
					o[d] = b.rb(acc[d] / l)
				}
			}
		}
		return nil
	})
}

// WriteWindow implements backend.Backend.
func (b *Backend) WriteWindow(s backend.KVStore, layer int, kv backend.Tensor, bt *backend.Batch) error {
	kt, err := backend.As[*Tensor](backend.CheckWriteWindow(s, layer, kv, bt), "write window", kv)
	if err != nil {
		return err
	}
	k, err := store(s)
	if err != nil {
		return err
	}
	for si := range bt.Seqs {
		sq := &bt.Seqs[si]
		slot, err := k.slot(sq.Slot)
		if err != nil {
			return err
		}
		for i := max(0, sq.Rows-k.spec.RingLen(layer)); i < sq.Rows; i++ {
			if err := k.writeRing(&slot.layers[layer], layer, sq.Start+i, kt.Row(sq.Row0+i)); err != nil {
				return fmt.Errorf("write window: %w", err)
			}
		}
	}
	return nil
}
