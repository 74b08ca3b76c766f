package ptxemu

import (
	"fmt"
	"math"
	"time"
)

// thread is one CUDA thread: its registers, local memory and call stack.
type thread struct {
	b      *blockState
	w      *warpState
	lane   int
	flat   int
	tid    [3]uint32
	fn     *Function
	regs   []uint64
	pc     int
	local  []byte
	lbase  int // local memory base of the current frame
	in     []byte
	out    []byte
	ret    []byte
	frames []frame
	carry  uint64
	// the cluster barrier phase this thread arrived in
	clPhase   uint64
	clArrived bool
	steps     int64
	exited    bool
	// cp.async copies not yet done: issued since the last commit_group,
	// and the committed groups, oldest first (see decCp)
	cpIssued []func()
	cpGroups [][]func()
	tc       tcThread   // tcgen05 work issued by this thread and not yet complete
	wg       wgThread   // wgmma groups issued by this thread and not yet waited for
	bk       bulkThread // bulk stores issued by this thread and not yet complete
	// last global allocation touched, to skip the device lookup
	cBase uint64
	cBuf  []byte
}

type frame struct {
	fn       *Function
	pc       int
	regs     []uint64
	lbase    int
	in, out  []byte
	ret      []byte
	retOff   int // where the callee's return value goes in the caller's out buffer
	retBytes int
}

func (t *thread) run() {
	b := t.b
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if r == errAbort {
			return
		}
		b.mu.Lock()
		if le, ok := r.(*LaunchError); ok {
			b.fail(le)
		} else {
			b.fail(t.fault(fmt.Errorf("emulator panic: %v", r), false, false))
		}
		b.alive--
		b.running--
		b.mu.Unlock()
	}()
	f := t.fn
	t.regs = make([]uint64, f.nregs)
	t.in = b.params
	t.out = make([]byte, f.outSize)
	t.ret = nil
	t.local = make([]byte, alignUp(f.localSize, 16))
	max := b.dev.MaxSteps
	for !t.exited {
		insts := t.fn.insts
		if t.pc >= len(insts) {
			t.doRet()
			continue
		}
		in := &insts[t.pc]
		t.pc++
		if in.guard >= 0 && (t.regs[in.guard] != 0) == in.guardNot {
			continue
		}
		t.steps++
		if t.steps&0xfff == 0 {
			if max > 0 && t.steps > max {
				t.panicf("step limit %d reached (a loop that never ends?)", max)
			}
			if b.stop.Load() { // a thread of this launch failed: stop spinning on its flags
				b.mu.Lock()
				b.fail(errAbort) // wakes this block's waiters, which would otherwise sleep forever
				b.alive--
				b.running--
				b.mu.Unlock()
				return
			}
		}
		in.exec(t, in)
	}
	t.bulkExit()
	t.tcExit()
	t.exit()
}

func (t *thread) fault(err error, illegal, deadlock bool) *LaunchError {
	e := &LaunchError{Kernel: t.b.f.Name, Block: t.b.ctaid, Thread: t.tid, PC: t.pc - 1, Err: err, Illegal: illegal, Deadlock: deadlock}
	if t.pc-1 >= 0 && t.pc-1 < len(t.fn.insts) {
		e.Inst = t.fn.insts[t.pc-1].text
		if t.fn != t.b.f {
			e.Inst = t.fn.Name + ": " + e.Inst
		}
	}
	return e
}

func (t *thread) panicf(format string, a ...any) {
	panic(t.fault(fmt.Errorf(format, a...), false, false))
}

func (t *thread) illegal(err error) {
	panic(t.fault(err, true, false))
}

// get reads an operand's bits.
func (t *thread) get(o *operand) uint64 {
	switch o.kind {
	case oReg:
		v := t.regs[o.reg]
		if o.not {
			return b2u(v == 0)
		}
		return v
	case oImm:
		return o.imm
	case oSpecial:
		return t.special(o.spec)
	case oLocalSym:
		return uint64(t.lbase) + o.imm
	case oAddr:
		return t.addr(o)
	}
	t.panicf("operand kind %d has no value", o.kind)
	return 0
}

func (t *thread) set(o *operand, v uint64) {
	switch o.kind {
	case oReg:
		t.regs[o.reg] = v
	case oSink:
	default:
		t.panicf("cannot write operand kind %d", o.kind)
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func (t *thread) f32(o *operand) float32 { return math.Float32frombits(uint32(t.get(o))) }
func (t *thread) f64(o *operand) float64 { return math.Float64frombits(t.get(o)) }

// addr is an address operand's value: base register plus constant.
func (t *thread) addr(o *operand) uint64 {
	a := o.imm
	if o.reg >= 0 {
		a += t.regs[o.reg]
	}
	if o.sym == spLocal {
		a += uint64(t.lbase)
	}
	return a
}

func (t *thread) special(s special) uint64 {
	b := t.b
	switch s {
	case sTidX, sTidY, sTidZ:
		return uint64(t.tid[s-sTidX])
	case sNtidX:
		return uint64(b.dim.X)
	case sNtidY:
		return uint64(b.dim.Y)
	case sNtidZ:
		return uint64(b.dim.Z)
	case sCtaidX, sCtaidY, sCtaidZ:
		return uint64(b.ctaid[s-sCtaidX])
	case sNctaidX:
		return uint64(b.grid.X)
	case sNctaidY:
		return uint64(b.grid.Y)
	case sNctaidZ:
		return uint64(b.grid.Z)
	case sLaneid:
		return uint64(t.lane)
	case sWarpid:
		return uint64(t.flat / 32)
	case sNwarpid:
		return uint64(len(b.warps))
	case sSmid:
		return 0
	case sNsmid:
		return 1
	case sClock, sClock64, sGlobaltimer:
		return uint64(time.Now().UnixNano())
	case sLanemaskLt:
		return 1<<t.lane - 1
	case sLanemaskLe:
		return 1<<(t.lane+1) - 1
	case sLanemaskEq:
		return 1 << t.lane
	case sLanemaskGe:
		return uint64(^uint32(1<<t.lane - 1))
	case sLanemaskGt:
		return uint64(^uint32(1<<(t.lane+1) - 1))
	case sDynSmem:
		return uint64(b.dynSmem)
	case sClusterRank:
		return uint64(b.rank)
	case sClusterN:
		if b.cl == nil {
			return 1
		}
		return uint64(len(b.cl.blocks))
	}
	t.panicf("special register %d", s)
	return 0
}

// mem returns n bytes at addr in space sp.
func (t *thread) mem(sp space, addr uint64, n int) []byte {
	switch sp {
	case spGeneric:
		switch {
		case addr >= sharedWin && addr < sharedWin+windowBytes:
			return t.mem(spShared, addr-sharedWin, n)
		case addr >= localWin && addr < localWin+windowBytes:
			return t.mem(spLocal, addr-localWin, n)
		case addr >= paramWin && addr < paramWin+windowBytes:
			return t.mem(spParamIn, addr-paramWin, n)
		}
		return t.global(addr, n)
	case spGlobal, spConst:
		return t.global(addr, n)
	case spCluster:
		return t.clusterShared(addr, n)
	case spShared:
		if addr+uint64(n) > uint64(len(t.b.shared)) {
			t.illegal(fmt.Errorf("shared access at %#x (+%d) past %d bytes of shared memory", addr, n, len(t.b.shared)))
		}
		return t.b.shared[addr : addr+uint64(n)]
	case spLocal:
		if addr+uint64(n) > uint64(len(t.local)) {
			t.illegal(fmt.Errorf("local access at %#x (+%d) past %d bytes", addr, n, len(t.local)))
		}
		return t.local[addr : addr+uint64(n)]
	case spParamIn, spParamOut, spParamRet:
		buf := t.in
		if sp == spParamOut {
			buf = t.out
		} else if sp == spParamRet {
			buf = t.ret
		}
		if addr >= paramWin {
			addr -= paramWin
		}
		if addr+uint64(n) > uint64(len(buf)) {
			t.illegal(fmt.Errorf("param access at %d (+%d) past %d bytes", addr, n, len(buf)))
		}
		return buf[addr : addr+uint64(n)]
	}
	t.panicf("memory space %d", sp)
	return nil
}

func (t *thread) global(addr uint64, n int) []byte {
	if addr >= t.cBase && addr+uint64(n) <= t.cBase+uint64(len(t.cBuf)) && t.cBuf != nil {
		off := addr - t.cBase
		return t.cBuf[off : off+uint64(n)]
	}
	d := t.b.dev
	d.mu.Lock()
	a, err := d.lookupAlloc(addr, n)
	d.mu.Unlock()
	if err != nil {
		t.illegal(err)
	}
	t.cBase, t.cBuf = a.base, a.buf // cache the whole allocation
	off := addr - a.base
	return a.buf[off : off+uint64(n)]
}

// call enters callee with the caller's out-parameter slots as arguments.
func (t *thread) call(in *inst) {
	callee := in.callee
	if len(callee.insts) == 0 {
		t.panicf("call of %s, which has no body", callee.Name)
	}
	args := make([]byte, callee.inSize)
	for i, a := range in.args[1].vec {
		if i >= len(callee.params) {
			t.panicf("call of %s: too many arguments", callee.Name)
		}
		p := callee.params[i]
		copy(args[p.off:p.off+p.size], t.out[a.imm:])
	}
	fr := frame{fn: t.fn, pc: t.pc, regs: t.regs, lbase: t.lbase, in: t.in, out: t.out, ret: t.ret, retOff: -1}
	if len(in.args[0].vec) > 0 {
		fr.retOff, fr.retBytes = int(in.args[0].vec[0].imm), callee.retSize
	}
	t.frames = append(t.frames, fr)
	if len(t.frames) > 64 {
		t.panicf("call depth over 64")
	}
	t.lbase = alignUp(t.lbase+t.fn.localSize, 16)
	if need := t.lbase + alignUp(callee.localSize, 16); need > len(t.local) {
		t.local = append(t.local, make([]byte, need-len(t.local))...)
	}
	t.fn, t.pc = callee, 0
	t.regs = make([]uint64, callee.nregs)
	t.in, t.out, t.ret = args, make([]byte, callee.outSize), make([]byte, callee.retSize)
}

// doRet returns from a .func, or ends the thread in the entry.
func (t *thread) doRet() {
	if len(t.frames) == 0 {
		t.exited = true
		return
	}
	fr := t.frames[len(t.frames)-1]
	t.frames = t.frames[:len(t.frames)-1]
	ret := t.ret
	t.fn, t.pc, t.regs, t.lbase, t.in, t.out, t.ret = fr.fn, fr.pc, fr.regs, fr.lbase, fr.in, fr.out, fr.ret
	if fr.retOff >= 0 {
		copy(t.out[fr.retOff:], ret[:fr.retBytes])
	}
}
