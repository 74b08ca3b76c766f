package ptxemu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"
)

// asyncState is a block's state for the asynchronous sm_90/sm_100
// machinery: waiters on its mbarriers, the copies that land when a
// barrier's phase completes, and its tensor memory. Guarded by the block's
// mutex.
type asyncState struct {
	cond    *sync.Cond // mbarrier waiters; created on first use
	gen     uint64     // bumped whenever a phase of one of the block's barriers completes
	waiting int
	landing map[uint64][]func() // barrier offset -> copies that land when its phase completes
	tmem    *tmemState
	maxnreg map[int][]uint64 // warp -> its setmaxnreg calls (count | inc<<32)
}

// leftover reports state a finished block must not leave behind.
func (a *asyncState) leftover() error {
	if a.tmem != nil && a.tmem.allocated() > 0 {
		return fmt.Errorf("the block exited with %d tensor-memory columns allocated (tcgen05.dealloc missing)", a.tmem.allocated())
	}
	return nil
}

// The 64-bit mbarrier object is opaque on the GPU; ptxemu keeps its state in
// those 8 bytes of shared memory as
//
//	bits  0-19 pending arrivals of the current phase
//	bits 20-39 expected arrivals (the count of init, less arrive_drop)
//	bits 40-61 tx-count, 22-bit two's complement
//	bit  62    the current phase's parity
//	bit  63    set by mbarrier.init (a barrier used before init faults)
const (
	mbCountMask = 1<<20 - 1
	mbTxBits    = 22
	mbPhaseBit  = 1 << 62
	mbValidBit  = 1 << 63
	mbMaxTx     = 1<<20 - 1 // the PTX ISA's tx-count range
)

type mbState struct {
	pending, expected int
	tx                int
	phase             uint64 // 0 or 1
}

func decodeMb(v uint64) (mbState, bool) {
	tx := int(int64(v<<(64-40-mbTxBits)) >> (64 - mbTxBits))
	return mbState{pending: int(v & mbCountMask), expected: int(v >> 20 & mbCountMask), tx: tx, phase: v >> 62 & 1}, v&mbValidBit != 0
}

func (s mbState) encode() uint64 {
	return uint64(s.pending) | uint64(s.expected)<<20 | uint64(s.tx)&(1<<mbTxBits-1)<<40 | s.phase<<62 | mbValidBit
}

// mbar is an mbarrier located: the block whose shared memory holds it and
// its offset there.
type mbar struct {
	b   *blockState
	off uint64
}

// locateMbar resolves an mbarrier address in space sp (shared::cta,
// shared::cluster or generic) to its block, checking the 8-byte alignment.
func (t *thread) locateMbar(sp space, addr uint64) mbar {
	if addr%8 != 0 {
		t.illegal(fmt.Errorf("mbarrier at %#x is not 8-byte aligned", addr))
	}
	b := t.b
	switch sp {
	case spGeneric:
		if addr < sharedWin || addr >= sharedWin+windowBytes {
			t.illegal(fmt.Errorf("mbarrier at generic address %#x outside shared memory", addr))
		}
		addr -= sharedWin
	case spCluster:
		if r := addr >> clusterShift; r != 0 {
			if b.cl == nil || int(r-1) >= len(b.cl.blocks) {
				t.illegal(errors.New("mbarrier in a block outside the cluster"))
			}
			b = b.cl.blocks[r-1]
			addr &= 1<<clusterShift - 1
		}
	case spShared:
	default:
		t.illegal(fmt.Errorf("mbarrier outside shared memory (space %d)", sp))
	}
	if addr+8 > uint64(len(b.shared)) {
		t.illegal(fmt.Errorf("mbarrier at %#x past %d bytes of shared memory", addr, len(b.shared)))
	}
	return mbar{b, addr}
}

// mbState reads the barrier; call with m.b.mu held.
func mbRead(m mbar) (mbState, error) {
	s, ok := decodeMb(binary.LittleEndian.Uint64(m.b.shared[m.off:]))
	if !ok {
		return s, fmt.Errorf("mbarrier at %#x used before mbarrier.init", m.off)
	}
	return s, nil
}

// mbUpdate applies arrivals and a tx-count change to m and completes the
// phase when both reach zero. It returns the phase parity before the
// update (the state token of mbarrier.arrive). Call with m.b.mu held.
func mbUpdate(m mbar, arrive, tx int) (uint64, error) {
	s, err := mbRead(m)
	if err != nil {
		return 0, err
	}
	old := s.phase
	s.tx += tx
	switch {
	case s.tx > mbMaxTx || s.tx < -mbMaxTx:
		return 0, fmt.Errorf("mbarrier at %#x: tx-count %d outside ±(2^20-1)", m.off, s.tx)
	case arrive > s.pending:
		return 0, fmt.Errorf("mbarrier at %#x: %d arrivals with %d pending in the phase", m.off, arrive, s.pending)
	}
	s.pending -= arrive
	done := s.pending == 0 && s.tx == 0
	if done {
		s.phase ^= 1
		s.pending = s.expected
	}
	binary.LittleEndian.PutUint64(m.b.shared[m.off:], s.encode())
	if done {
		m.b.completePhase(m.off)
	}
	return old, nil
}

// mbApply runs fn on m under its block's lock and faults with its error.
func (t *thread) mbApply(m mbar, fn func() error) {
	m.b.mu.Lock()
	err := fn()
	m.b.mu.Unlock()
	if err != nil {
		t.panicf("%v", err)
	}
}

// completePhase lands the copies that were waiting on the barrier at off
// and wakes the block's mbarrier waiters. Call with b.mu held.
func (b *blockState) completePhase(off uint64) {
	a := &b.async
	for _, land := range a.landing[off] {
		land()
	}
	delete(a.landing, off)
	b.running += a.waiting
	a.waiting = 0
	a.gen++
	if a.cond != nil {
		a.cond.Broadcast()
	}
}

// addLanding queues a copy into b's shared memory that lands when the
// phase of the barrier at off completes. Call with b.mu held.
func (b *blockState) addLanding(off uint64, land func()) {
	if b.async.landing == nil {
		b.async.landing = map[uint64][]func(){}
	}
	b.async.landing[off] = append(b.async.landing[off], land)
}

// mbWait reports whether the phase with the given parity has completed
// (the current phase's parity differs). Unless test, it blocks until it
// has: try_wait may suspend until the phase completes. A barrier of another
// block, or any in a cluster launch, is polled instead, because the
// deadlock check sees only this block's threads.
func (t *thread) mbWait(m mbar, parity uint64, test bool) bool {
	b := m.b
	b.mu.Lock()
	for {
		s, err := mbRead(m)
		if err != nil {
			b.mu.Unlock()
			t.panicf("%v", err)
		}
		if s.phase != parity&1 {
			b.mu.Unlock()
			return true
		}
		if test || b != t.b || b.cl != nil {
			b.mu.Unlock()
			if !test {
				time.Sleep(20 * time.Microsecond)
			}
			return false
		}
		a := &b.async
		if a.cond == nil {
			a.cond = sync.NewCond(&b.mu)
		}
		a.waiting++
		b.wait(t, a.cond, &a.gen, a.gen)
	}
}

// decMbarrier: init, inval, arrive (.expect_tx), arrive_drop, expect_tx,
// complete_tx, test_wait and try_wait (.parity).
func decMbarrier(f *Function, in *inst) error {
	op := ""
	for _, m := range in.mods {
		switch m {
		case "init", "inval", "arrive", "arrive_drop", "expect_tx", "complete_tx", "test_wait", "try_wait":
			if op == "" {
				op = m
			}
		case "noComplete", "pending_count":
			return unsupported("mbarrier.%s", m)
		}
	}
	sp := in.sp
	if sp == spNone {
		sp = spGeneric
	}
	addrArg := 0
	if op == "arrive" || op == "arrive_drop" || op == "test_wait" || op == "try_wait" {
		addrArg = 1
	}
	if len(in.args) <= addrArg || in.args[addrArg].kind != oAddr {
		return fmt.Errorf("mbarrier.%s: the barrier operand must be an address", op)
	}
	val := func(t *thread, in *inst, i int, def int) int {
		if i < len(in.args) {
			return int(uint32(t.get(&in.args[i])))
		}
		return def
	}
	switch op {
	case "init":
		in.exec = func(t *thread, in *inst) {
			m := t.locateMbar(sp, t.addr(&in.args[0]))
			n := val(t, in, 1, 0)
			if n < 1 || n > mbCountMask {
				t.panicf("mbarrier.init count %d outside 1..2^20-1", n)
			}
			m.b.mu.Lock()
			binary.LittleEndian.PutUint64(m.b.shared[m.off:], mbState{pending: n, expected: n}.encode())
			m.b.mu.Unlock()
		}
	case "inval":
		in.exec = func(t *thread, in *inst) {
			m := t.locateMbar(sp, t.addr(&in.args[0]))
			m.b.mu.Lock()
			binary.LittleEndian.PutUint64(m.b.shared[m.off:], 0)
			m.b.mu.Unlock()
		}
	case "arrive", "arrive_drop":
		expectTx := in.has("expect_tx")
		drop := op == "arrive_drop"
		in.exec = func(t *thread, in *inst) {
			m := t.locateMbar(sp, t.addr(&in.args[1]))
			count, tx := 1, 0
			if expectTx {
				tx = val(t, in, 2, 0)
			} else {
				count = val(t, in, 2, 1)
			}
			if count < 1 || count > mbCountMask {
				t.panicf("mbarrier.%s count %d outside 1..2^20-1", op, count)
			}
			if m.b != t.b && in.args[0].kind != oSink {
				t.panicf("mbarrier.%s on another block's barrier must discard its state (_)", op)
			}
			var phase uint64
			t.mbApply(m, func() error {
				if drop {
					s, err := mbRead(m)
					if err != nil {
						return err
					}
					if count > s.expected {
						return fmt.Errorf("mbarrier.arrive_drop of %d with %d expected", count, s.expected)
					}
					s.expected -= count
					binary.LittleEndian.PutUint64(m.b.shared[m.off:], s.encode())
				}
				var err error
				phase, err = mbUpdate(m, count, tx)
				return err
			})
			t.set(&in.args[0], phase)
		}
	case "expect_tx", "complete_tx":
		sign := 1
		if op == "complete_tx" {
			sign = -1
		}
		in.exec = func(t *thread, in *inst) {
			m := t.locateMbar(sp, t.addr(&in.args[0]))
			tx := val(t, in, 1, 0)
			t.mbApply(m, func() error { _, err := mbUpdate(m, 0, sign*tx); return err })
		}
	case "test_wait", "try_wait":
		test := op == "test_wait"
		in.exec = func(t *thread, in *inst) {
			m := t.locateMbar(sp, t.addr(&in.args[1]))
			// the parity form names the phase; the state form is
			// arrive's token, the phase parity at that arrival
			parity := t.get(&in.args[2]) & 1
			t.set(&in.args[0], b2u(t.mbWait(m, parity, test)))
		}
	default:
		return unsupported("mbarrier form %s", in.text)
	}
	return nil
}

// decElect is elect.sync d|p, membermask: the lowest lane of the mask is
// the leader.
func decElect(f *Function, in *inst) error {
	if len(in.args) != 3 {
		return fmt.Errorf("elect.sync takes d|p, membermask")
	}
	in.exec = func(t *thread, in *inst) {
		mask := uint32(t.get(&in.args[2]))
		c := t.collective(mask)
		live := mask & c.alive
		leader := 0
		for leader < 32 && live&(1<<leader) == 0 {
			leader++
		}
		t.set(&in.args[0], uint64(leader))
		t.set(&in.args[1], b2u(t.lane == leader))
	}
	return nil
}
