package ptxemu

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// Tensor memory (sm_100): per CTA 128 lanes x 512 columns of 32-bit cells.
// An address is lane<<16 | column.
const (
	tmemLanes = 128
	tmemCols  = 512
)

type tmemState struct {
	cells        [tmemLanes * tmemCols]uint32
	used         [tmemCols / 32]bool // allocation in 32-column units
	relinquished bool
}

func (m *tmemState) allocated() int {
	n := 0
	for _, u := range m.used {
		if u {
			n += 32
		}
	}
	return n
}

// tmem returns b's tensor memory, creating it on first use. Call with b.mu held.
func (b *blockState) tmem() *tmemState {
	if b.async.tmem == nil {
		b.async.tmem = &tmemState{}
	}
	return b.async.tmem
}

// checkCols reports whether columns [col, col+n) are allocated.
func (m *tmemState) checkCols(col, n int) error {
	if col < 0 || n < 0 || col+n > tmemCols {
		return fmt.Errorf("tensor-memory columns %d..%d outside 0..%d", col, col+n-1, tmemCols-1)
	}
	for c := col; c < col+n; c++ {
		if !m.used[c/32] {
			return fmt.Errorf("tensor-memory column %d is not allocated", c)
		}
	}
	return nil
}

func (m *tmemState) cell(lane, col int) *uint32 { return &m.cells[lane*tmemCols+col] }

// tcThread is a thread's tcgen05 work in flight: MMAs and copies issued and
// not yet committed (they run, in issue order, at tcgen05.commit: the
// latest moment the ISA allows), loads whose registers are written at
// tcgen05.wait::ld and stores that reach tensor memory at tcgen05.wait::st.
type tcThread struct {
	queue []func()
	lds   []tmemLoad
	sts   []func()
}

type tmemLoad struct {
	dst *operand
	v   uint32
}

// tcExit completes what the thread left in flight, as the hardware does.
func (t *thread) tcExit() {
	for _, st := range t.tc.sts {
		st()
	}
	t.runQueue()
	t.tc = tcThread{}
}

func (t *thread) runQueue() {
	q := t.tc.queue
	t.tc.queue = nil
	for _, op := range q {
		op()
	}
}

// tmemLocked runs fn on the block's tensor memory under the block lock and
// faults with its error.
func (t *thread) tmemLocked(fn func(m *tmemState) error) {
	b := t.b
	b.mu.Lock()
	err := fn(b.tmem())
	b.mu.Unlock()
	if err != nil {
		t.panicf("%v", err)
	}
}

// decTmemAlloc: tcgen05.alloc [dst], ncols / dealloc taddr, ncols /
// relinquish_alloc_permit, warp-wide (.sync.aligned); the lowest live lane
// acts for the warp.
func decTmemAlloc(in *inst, op string) error {
	in.exec = func(t *thread, in *inst) {
		var v [2]uint64
		for i := range min(len(in.args), 2) {
			v[i] = t.get(&in.args[i])
		}
		c := t.collective(0xffffffff, v[0], v[1])
		leader := bits.TrailingZeros32(c.alive)
		for l := range 32 {
			if c.alive&(1<<l) != 0 && (c.vals[l][0] != v[0] || c.vals[l][1] != v[1]) {
				t.panicf("tcgen05.%s: the lanes of the warp pass different operands", op)
			}
		}
		if t.lane != leader {
			return
		}
		switch op {
		case "relinquish_alloc_permit":
			t.tmemLocked(func(m *tmemState) error { m.relinquished = true; return nil })
		case "alloc":
			n := int(uint32(v[1]))
			var col int
			t.tmemLocked(func(m *tmemState) error {
				var err error
				col, err = m.alloc(n)
				return err
			})
			dst := t.addr(&in.args[0])
			t.checkAlign(dst, 4)
			putLE(t.mem(spShared, dst, 4), uint64(col))
		case "dealloc":
			addr, n := uint32(v[0]), int(uint32(v[1]))
			t.tmemLocked(func(m *tmemState) error { return m.dealloc(addr, n) })
		}
	}
	return nil
}

func (m *tmemState) alloc(n int) (int, error) {
	switch {
	case m.relinquished:
		return 0, fmt.Errorf("tcgen05.alloc after tcgen05.relinquish_alloc_permit")
	case n < 32 || n > tmemCols || n&(n-1) != 0:
		return 0, fmt.Errorf("tcgen05.alloc of %d columns: must be a power of two in 32..512", n)
	}
	for col := 0; col+n <= tmemCols; col += n {
		free := true
		for u := col / 32; u < (col+n)/32; u++ {
			free = free && !m.used[u]
		}
		if free {
			for u := col / 32; u < (col+n)/32; u++ {
				m.used[u] = true
			}
			return col, nil
		}
	}
	return 0, fmt.Errorf("tcgen05.alloc of %d columns with %d of 512 allocated (the GPU would wait for a dealloc; no other block shares this one's tensor memory here)", n, m.allocated())
}

func (m *tmemState) dealloc(addr uint32, n int) error {
	col := int(addr & 0xffff)
	switch {
	case addr>>16 != 0:
		return fmt.Errorf("tcgen05.dealloc of address %#x: lane must be 0", addr)
	case n < 32 || n > tmemCols || n&(n-1) != 0:
		return fmt.Errorf("tcgen05.dealloc of %d columns: must be a power of two in 32..512", n)
	case col%32 != 0:
		return fmt.Errorf("tcgen05.dealloc at column %d: not an allocation's start", col)
	}
	if err := m.checkCols(col, n); err != nil {
		return fmt.Errorf("tcgen05.dealloc: %w", err)
	}
	for u := col / 32; u < (col+n)/32; u++ {
		m.used[u] = false
	}
	return nil
}

// ldstShape is a tcgen05.ld/st shape: the lanes it spans, registers and
// columns per .x1, and where register j of thread t goes (lane and column
// offsets, from CUTLASS cute/atom/copy_traits_sm100.hpp SM100_TMEM_LOAD_*
// DstLayout; .xN repeats along columns).
type ldstShape struct {
	lanes, regs, cols int
	at                func(t, j int) (lane, col int)
}

var ldstShapes = map[string]ldstShape{
	"32x32b":  {32, 1, 1, func(t, j int) (int, int) { return t, j }},
	"16x64b":  {16, 1, 2, func(t, j int) (int, int) { return 8*(t%2) + t/4, t/2%2 + 2*j }},
	"16x128b": {16, 2, 4, func(t, j int) (int, int) { return t/4 + 8*(j%2), t%4 + 4*(j/2) }},
	"16x256b": {16, 4, 8, func(t, j int) (int, int) { return t/4 + 8*(j/2%2), 2*(t%4) + j%2 + 8*(j/4) }},
}

// parseLdSt reads .shape and .num of tcgen05.ld/st.
func parseLdSt(in *inst) (sh ldstShape, num int, err error) {
	name := ""
	for _, m := range in.mods {
		switch {
		case ldstShapes[m].at != nil:
			name = m
		case m == "16x32bx2":
			return sh, 0, unsupported("tcgen05.%s shape %s", in.mods[0], m)
		case len(m) > 1 && m[0] == 'x' && m[1] >= '0' && m[1] <= '9':
			num, err = strconv.Atoi(m[1:])
		case strings.HasPrefix(m, "pack::") || strings.HasPrefix(m, "unpack::"):
			return sh, 0, unsupported("tcgen05.%s .%s", in.mods[0], m)
		}
	}
	sh = ldstShapes[name]
	if name == "" || err != nil || num < 1 || num > 128 || num&(num-1) != 0 || num*sh.regs > 128 {
		return sh, 0, fmt.Errorf("tcgen05 ld/st: bad shape or .num in %s", in.text)
	}
	return sh, num, nil
}

// laneWindow checks a tcgen05.ld/st address against the warp's lane
// quarter: warp w of the CTA reaches lanes 32*(w%4) .. 32*(w%4)+31 only.
func (t *thread) laneWindow(addr uint32, lanes int) (lane, col int) {
	lane, col = int(addr>>16), int(addr&0xffff)
	q := t.flat / 32 % 4
	if lane < 32*q || lane+lanes > 32*q+32 {
		t.illegal(fmt.Errorf("tensor-memory lanes %d..%d from warp %d: a warp with %%warpid %% 4 == %d reaches lanes %d..%d only",
			lane, lane+lanes-1, t.flat/32, q, 32*q, 32*q+31))
	}
	return lane, col
}

// decTmemLdSt: tcgen05.ld.sync.aligned.shape.xN.b32 {r..}, [taddr] and
// tcgen05.st.sync.aligned.shape.xN.b32 [taddr], {r..} for the shapes
// 32x32b, 16x64b, 16x128b and 16x256b.
func decTmemLdSt(in *inst, store bool) error {
	sh, num, err := parseLdSt(in)
	if err != nil {
		return err
	}
	ai, ri := 1, 0
	if store {
		ai, ri = 0, 1
	}
	if len(in.args) != 2 || in.args[ai].kind != oAddr {
		return fmt.Errorf("tcgen05.%s takes registers and a tensor-memory address", in.mods[0])
	}
	regs := in.args[ri].vec
	if in.args[ri].kind != oVec {
		regs = in.args[ri : ri+1]
	}
	if len(regs) != num*sh.regs {
		return fmt.Errorf("tcgen05.%s .x%d needs %d registers, has %d", in.mods[0], num, num*sh.regs, len(regs))
	}
	in.exec = func(t *thread, in *inst) {
		lane, col := t.laneWindow(uint32(t.addr(&in.args[ai])), sh.lanes)
		t.tmemLocked(func(m *tmemState) error { return m.checkCols(col, num*sh.cols) })
		cell := func(j int) (int, int) {
			l, c := sh.at(t.lane, j%sh.regs)
			return lane + l, col + c + j/sh.regs*sh.cols
		}
		if store {
			vals := make([]uint32, len(regs))
			for j := range vals {
				vals[j] = uint32(t.get(&regs[j]))
			}
			t.tc.sts = append(t.tc.sts, func() {
				t.tmemLocked(func(m *tmemState) error {
					for j, v := range vals {
						*m.cell(cell(j)) = v
					}
					return nil
				})
			})
			return
		}
		t.tmemLocked(func(m *tmemState) error {
			for j := range regs {
				t.tc.lds = append(t.tc.lds, tmemLoad{&regs[j], *m.cell(cell(j))})
			}
			return nil
		})
	}
	return nil
}

// decTmemWait: tcgen05.wait::ld writes the registers of the thread's
// loads, tcgen05.wait::st lands its stores.
func decTmemWait(in *inst, ld bool) {
	in.exec = func(t *thread, _ *inst) {
		if ld {
			for _, l := range t.tc.lds {
				t.set(l.dst, uint64(l.v))
			}
			t.tc.lds = t.tc.lds[:0]
			return
		}
		sts := t.tc.sts
		t.tc.sts = nil
		for _, st := range sts {
			st()
		}
	}
}
