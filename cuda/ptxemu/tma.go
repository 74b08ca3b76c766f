package ptxemu

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// TensorMap describes a tiled TMA tensor as cuTensorMapEncodeTiled takes it.
// The driver's 128-byte CUtensorMap encoding is opaque; EncodeTensorMap
// writes ptxemu's own (see there), which cp.async.bulk.tensor reads.
type TensorMap struct {
	DType   int       // CUtensorMapDataType
	Rank    int       // 1..5
	Addr    uint64    // global address, 16-byte aligned
	Dims    [5]uint64 // elements, innermost first
	Strides [5]uint64 // bytes; Strides[0] is the element itself and ignored
	Box     [5]uint32 // elements a copy moves, innermost first
	Swizzle int       // CUtensorMapSwizzle: 0 none, 1 32B, 2 64B, 3 128B
}

// CUtensorMapDataType values with their element sizes in bits; the
// 16U4 types are packed 4-bit elements (ALIGN16B: 16 elements take 16
// bytes of shared memory, 8 of data then 8 of padding).
const (
	TMAUint8       = 0
	TMA16U4Align8  = 13
	TMA16U4Align16 = 14
)

var tmaBits = map[int]int{0: 8, 1: 16, 2: 32, 3: 32, 4: 64, 5: 64, 6: 16, 7: 32, 8: 64, 9: 16, 10: 32, 11: 32, 12: 32,
	TMA16U4Align8: 4, TMA16U4Align16: 4}

// tmaMagic starts an encoded map ("ptxemuTM").
const tmaMagic = 0x4d5475_6d65787470

// EncodeTensorMap checks m as cuTensorMapEncodeTiled does and encodes it
// into 128 bytes: little-endian words 0 magic, 1 address, 2 dtype | rank<<8
// | swizzle<<16, 3-7 dims, 8-11 strides of dims 1-4, 12 box dims 0-3 (16
// bits each), 13 box dim 4.
func EncodeTensorMap(m TensorMap) ([128]byte, error) {
	var out [128]byte
	if err := m.check(); err != nil {
		return out, err
	}
	w := make([]uint64, 16)
	w[0], w[1] = tmaMagic, m.Addr
	w[2] = uint64(m.DType) | uint64(m.Rank)<<8 | uint64(m.Swizzle)<<16
	for i := range 5 {
		w[3+i] = m.Dims[i]
	}
	for i := 1; i < 5; i++ {
		w[7+i] = m.Strides[i]
	}
	for i := range 4 {
		w[12] |= uint64(m.Box[i]) << (16 * i)
	}
	w[13] = uint64(m.Box[4])
	for i, v := range w {
		binary.LittleEndian.PutUint64(out[8*i:], v)
	}
	return out, nil
}

func decodeTensorMap(b []byte) (TensorMap, error) {
	var m TensorMap
	w := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	if w(0) != tmaMagic {
		return m, fmt.Errorf("not a tensor map encoded by the emulated driver (cuTensorMapEncodeTiled)")
	}
	m.Addr = w(1)
	m.DType, m.Rank, m.Swizzle = int(w(2)&0xff), int(w(2)>>8&0xff), int(w(2)>>16&0xff)
	for i := range 5 {
		m.Dims[i] = w(3 + i)
	}
	for i := 1; i < 5; i++ {
		m.Strides[i] = w(7 + i)
	}
	for i := range 4 {
		m.Box[i] = uint32(w(12) >> (16 * i) & 0xffff)
	}
	m.Box[4] = uint32(w(13))
	return m, m.check()
}

// elemBits is the element size in bits; span the swizzle span in bytes.
func (m TensorMap) elemBits() int { return tmaBits[m.DType] }

func (m TensorMap) span() uint64 { return [4]uint64{0, 32, 64, 128}[m.Swizzle&3] }

// rowBytes is the shared-memory size of one box row (dimension 0).
func (m TensorMap) rowBytes() int {
	switch m.DType {
	case TMA16U4Align16:
		return int(m.Box[0])
	case TMA16U4Align8:
		return int(m.Box[0]) / 2
	}
	return int(m.Box[0]) * m.elemBits() / 8
}

func (m TensorMap) check() error {
	bits, ok := tmaBits[m.DType]
	switch {
	case !ok:
		return fmt.Errorf("tensor map: data type %d not emulated", m.DType)
	case m.Rank < 1 || m.Rank > 5:
		return fmt.Errorf("tensor map: rank %d outside 1..5", m.Rank)
	case m.Addr%16 != 0:
		return fmt.Errorf("tensor map: address %#x not 16-byte aligned", m.Addr)
	case m.Swizzle < 0 || m.Swizzle > 3:
		return fmt.Errorf("tensor map: swizzle %d not emulated", m.Swizzle)
	}
	for i := range m.Rank {
		switch {
		case m.Dims[i] < 1 || m.Dims[i] > 1<<32:
			return fmt.Errorf("tensor map: dimension %d of %d elements", i, m.Dims[i])
		case i > 0 && (m.Strides[i]%16 != 0 || m.Strides[i] >= 1<<40):
			return fmt.Errorf("tensor map: stride %d of %d bytes: a multiple of 16 below 2^40", i, m.Strides[i])
		case m.Box[i] < 1 || m.Box[i] > 256:
			return fmt.Errorf("tensor map: box dimension %d of %d elements outside 1..256", i, m.Box[i])
		}
	}
	if bits == 4 && m.Box[0]%16 != 0 {
		return fmt.Errorf("tensor map: 4-bit box rows of %d elements, must be a multiple of 16", m.Box[0])
	}
	rb := m.rowBytes()
	switch {
	case rb%16 != 0:
		return fmt.Errorf("tensor map: box rows of %d bytes, must be a multiple of 16", rb)
	case m.span() > 0 && uint64(rb) > m.span():
		return fmt.Errorf("tensor map: box rows of %d bytes exceed the %d-byte swizzle span", rb, m.span())
	}
	return nil
}

// decodeBulk decodes cp.async.bulk: the tensor load
// cp.async.bulk.tensor.Nd.shared::cluster.global{.tile}.mbarrier::complete_tx::bytes{.multicast::cluster}{.L2::cache_hint}
// [dst], [tmap, {c0..}], [mbar]{, ctaMask}{, hint}, the tensor store
// cp.async.bulk.tensor.Nd.global.shared::cta{.tile}.bulk_group [tmap, {c..}], [src],
// the 1-D load cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes
// [dst], [src], size, [mbar], the 1-D store
// cp.async.bulk.global.shared::cta.bulk_group{.L2::cache_hint} [dst], [src], size{, hint},
// and cp.async.bulk.commit_group / wait_group{.read} N (bulk.go).
func (f *Function) decodeBulk(in *inst, rest string) error {
	switch {
	case in.has("commit_group") || in.has("wait_group"):
		return f.decBulkGroup(in, rest)
	case in.has("im2col") || in.has("cta_group::2") || in.has("prefetch") || in.has("reduce"):
		return f.deferUnsupported(in, "instruction "+strings.SplitN(in.text, " ", 2)[0])
	}
	var ops []operand
	for _, s := range splitOperands(rest) {
		if strings.HasPrefix(s, "[") && strings.Contains(s, "{") { // [tmap, {c..}]
			inner := strings.TrimSpace(strings.Trim(s, "[]"))
			i := strings.Index(inner, ",")
			if i < 0 {
				return fmt.Errorf("bad tensor operand %s", s)
			}
			tm, err := f.operand(inner[:i])
			if err != nil {
				return err
			}
			if tm.kind == oAddr { // a bare register reads as an address
				tm = operand{kind: oReg, reg: tm.reg}
			}
			co, err := f.operand(strings.TrimSpace(inner[i+1:]))
			if err != nil {
				return err
			}
			ops = append(ops, tm, co)
			continue
		}
		o, err := f.operand(s)
		if err != nil {
			return err
		}
		ops = append(ops, o)
	}
	in.args = ops
	dims := 0
	for _, m := range in.mods {
		if len(m) == 2 && m[1] == 'd' && m[0] >= '1' && m[0] <= '5' {
			dims = int(m[0] - '0')
		}
	}
	store := len(in.mods) > 2 && strings.HasPrefix(in.mods[len(in.mods)-1], "bulk_group") ||
		strings.Contains(in.text, ".global.shared::cta")
	switch {
	case in.has("tensor") && store:
		if len(ops) != 3 || ops[1].kind != oVec || len(ops[1].vec) != dims {
			return fmt.Errorf("%s: takes [tmap, {%d coordinates}], [src]", in.text, dims)
		}
		in.exec = func(t *thread, in *inst) { t.tmaStore(in) }
	case in.has("tensor"):
		multicast := in.has("multicast::cluster")
		if !in.has("mbarrier::complete_tx::bytes") || len(ops) < 4 || ops[2].kind != oVec || len(ops[2].vec) != dims {
			return fmt.Errorf("%s: takes [dst], [tmap, {%d coordinates}], [mbar]", in.text, dims)
		}
		if multicast && len(ops) < 5 {
			return fmt.Errorf("%s: .multicast::cluster takes a CTA mask", in.text)
		}
		in.exec = func(t *thread, in *inst) { t.tmaLoad(in, multicast) }
	case store:
		if !in.has("bulk_group") || len(ops) != 3 && !(len(ops) == 4 && in.has("L2::cache_hint")) {
			return unsupported("bulk copy %s", in.text)
		}
		in.exec = func(t *thread, in *inst) { t.bulkStore(in) }
	default:
		if !in.has("global") || !in.has("mbarrier::complete_tx::bytes") || len(ops) != 4 || in.has("multicast::cluster") {
			return unsupported("bulk copy %s", in.text)
		}
		in.exec = func(t *thread, in *inst) { t.bulkLoad(in) }
	}
	return nil
}

// ctaTargets are the blocks a copy lands in: the block of a shared::cluster
// address, or every block of a multicast mask, each with the offset.
func (t *thread) ctaTargets(addr uint64, mask uint16, multicast bool) []mbar {
	off := addr & (1<<clusterShift - 1)
	if !multicast {
		m := t.locateMbar(spCluster, addr&^7) // the block only; alignment is checked by the caller
		return []mbar{{m.b, addr & (1<<clusterShift - 1)}}
	}
	var out []mbar
	for r := range 16 {
		if mask&(1<<r) == 0 {
			continue
		}
		switch {
		case t.b.cl != nil && r < len(t.b.cl.blocks):
			out = append(out, mbar{t.b.cl.blocks[r], off})
		case t.b.cl == nil && r == 0:
			out = append(out, mbar{t.b, off})
		default:
			t.illegal(fmt.Errorf("multicast to CTA %d outside the cluster", r))
		}
	}
	return out
}

// readMap reads and decodes the tensor map a TMA operand points at.
func (t *thread) readMap(o *operand) TensorMap {
	a := t.get(o)
	if a%64 != 0 {
		t.illegal(fmt.Errorf("tensor map at %#x is not 64-byte aligned", a))
	}
	m, err := decodeTensorMap(t.mem(spGeneric, a, 128))
	if err != nil {
		t.panicf("%v", err)
	}
	return m
}

// boxRows walks the box's rows (dimensions 1..4), in shared-memory order.
func (m TensorMap) boxRows(fn func(row int, idx [5]int)) {
	var idx [5]int
	row := 0
	var rec func(d int)
	rec = func(d int) {
		if d == 0 {
			fn(row, idx)
			row++
			return
		}
		for i := 0; i < int(m.Box[d]); i++ {
			idx[d] = i
			rec(d - 1)
		}
	}
	top := max(m.Rank-1, 0)
	for d := m.Rank; d < 5; d++ {
		idx[d] = 0
	}
	rec(top)
}

// boxImage gathers the box at coordinates c from global memory into its
// shared-memory image (unswizzled); out-of-bounds elements read as zero.
func (t *thread) boxImage(m TensorMap, c [5]int64) []byte {
	rb := m.rowBytes()
	rows := 1
	for d := 1; d < m.Rank; d++ {
		rows *= int(m.Box[d])
	}
	img := make([]byte, rows*rb)
	bits := m.elemBits()
	m.boxRows(func(row int, idx [5]int) {
		base, inside := m.Addr, true
		for d := 1; d < m.Rank; d++ {
			x := c[d] + int64(idx[d])
			if x < 0 || x >= int64(m.Dims[d]) {
				inside = false
			}
			base += uint64(x) * m.Strides[d]
		}
		if !inside {
			return
		}
		dst := img[row*rb : (row+1)*rb]
		for i := 0; i < int(m.Box[0]); i++ {
			x := c[0] + int64(i)
			if x < 0 || x >= int64(m.Dims[0]) {
				continue
			}
			if bits >= 8 {
				n := bits / 8
				copy(dst[i*n:(i+1)*n], t.mem(spGlobal, base+uint64(x)*uint64(n), n))
				continue
			}
			nib := t.mem(spGlobal, base+uint64(x)/2, 1)[0] >> (4 * (x & 1)) & 15
			p := i / 2 // ALIGN8B: packed as in global memory
			if m.DType == TMA16U4Align16 {
				p = 16*(i/16) + i%16/2
			}
			dst[p] |= nib << (4 * (i & 1))
		}
	})
	return img
}

func (t *thread) coords(o *operand, rank int) [5]int64 {
	var c [5]int64
	for i := range rank {
		c[i] = int64(int32(t.get(&o.vec[i])))
	}
	return c
}

// tmaLoad gathers the box now and lands it, swizzled, in each target
// block's shared memory when the phase of that block's barrier completes;
// the box's bytes count against the barrier's tx-count at once.
func (t *thread) tmaLoad(in *inst, multicast bool) {
	m := t.readMap(&in.args[1])
	img := t.boxImage(m, t.coords(&in.args[2], m.Rank))
	dst, bar := t.addr(&in.args[0]), t.addr(&in.args[3])
	align := uint64(128)
	if m.span() == 0 {
		align = 16
	}
	if dst%align != 0 {
		t.illegal(fmt.Errorf("TMA destination %#x not %d-byte aligned", dst, align))
	}
	tx := len(img)
	if m.DType == TMA16U4Align16 {
		tx /= 2 // the bytes read from global memory (DeepGEMM sm100 counts them so)
	}
	var mask uint16
	if multicast {
		mask = uint16(t.get(&in.args[4]))
	}
	t.land(img, dst, bar, mask, multicast, tx, m.span())
}

// land queues img for shared memory at dst (swizzled over the absolute
// address) in each target block, on the barrier at bar's offset there.
func (t *thread) land(img []byte, dst, bar uint64, mask uint16, multicast bool, tx int, span uint64) {
	bars := t.ctaTargets(bar, mask, multicast)
	dsts := t.ctaTargets(dst, mask, multicast)
	for i, mb := range bars {
		if bar%8 != 0 {
			t.illegal(fmt.Errorf("mbarrier at %#x is not 8-byte aligned", bar))
		}
		sh := dsts[i].b.shared
		off := dsts[i].off
		if off+uint64(len(img)) > uint64(len(sh)) || mb.off+8 > uint64(len(mb.b.shared)) {
			t.illegal(fmt.Errorf("bulk copy of %d bytes to shared %#x past %d bytes of shared memory", len(img), off, len(sh)))
		}
		t.mbApply(mb, func() error {
			mb.b.addLanding(mb.off, func() {
				for j, v := range img {
					sh[swizzle(off+uint64(j), span)] = v
				}
			})
			_, err := mbUpdate(mb, 0, -tx)
			return err
		})
	}
}

// bulkLoad is the 1-D cp.async.bulk global -> shared::cluster with
// complete_tx.
func (t *thread) bulkLoad(in *inst) {
	dst, src := t.addr(&in.args[0]), t.addr(&in.args[1])
	n := int(uint32(t.get(&in.args[2])))
	t.bulkAlign(in, dst, src, n)
	img := append([]byte(nil), t.mem(spGlobal, src, n)...)
	t.land(img, dst, t.addr(&in.args[3]), 0, false, n, 0)
}

// tmaStore reads the box from shared memory (swizzled) when issued and
// queues its global writes in the thread's bulk group (bulk.go), skipping
// out-of-bounds elements.
func (t *thread) tmaStore(in *inst) {
	m := t.readMap(&in.args[0])
	if m.elemBits() < 8 {
		t.panicf("TMA store of 4-bit elements is not emulated")
	}
	c := t.coords(&in.args[1], m.Rank)
	src := t.addr(&in.args[2])
	rb, n := m.rowBytes(), m.elemBits()/8
	rows := 1
	for d := 1; d < m.Rank; d++ {
		rows *= int(m.Box[d])
	}
	op := &bulkOp{text: in.text, src: src, span: m.span(), img: t.sharedImage(src, rows*rb, m.span())}
	lo, hi := max(c[0], 0), min(c[0]+int64(m.Box[0]), int64(m.Dims[0]))
	m.boxRows(func(row int, idx [5]int) {
		base := m.Addr
		for d := 1; d < m.Rank; d++ {
			x := c[d] + int64(idx[d])
			if x < 0 || x >= int64(m.Dims[d]) {
				return
			}
			base += uint64(x) * m.Strides[d]
		}
		if lo < hi {
			op.segs = append(op.segs, bulkSeg{dst: t.mem(spGlobal, base+uint64(lo)*uint64(n), int(hi-lo)*n), off: row*rb + int(lo-c[0])*n})
		}
	})
	t.bulkIssue(op)
}
