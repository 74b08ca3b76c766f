package ptxemu

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The sm_90a warpgroup MMA (PTX ISA "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate"): wgmma.fence, wgmma.mma_async, wgmma.commit_group
// and wgmma.wait_group. Each thread computes its own fragment of D: the
// thread's two rows of A and N/4 columns of B are read at issue, and the
// product lands in its registers at the wait_group that completes the
// group. Between issue and that wait the accumulators hold wgPoison (a NaN),
// so an early read shows; a write to them or to the A registers, or a
// change to the shared memory the MMA reads, fails at the wait.

// wgPoison is what in-flight accumulator registers hold (an f32 NaN, an f16
// NaN in the upper half).
const wgPoison = 0x7fbadbad

// wgThread is one thread's wgmma state.
type wgThread struct {
	fenced  bool          // a wgmma.fence since the last wait_group (or the start)
	issued  []*wgOp       // since the last commit_group
	groups  [][]*wgOp     // committed, oldest first
	pending map[int]wgReg // accumulator register -> its true value while in flight
}

type wgReg struct {
	val uint64
	ops int // in-flight MMAs that write it
}

// wgShape is a decoded wgmma.mma_async form.
type wgShape struct {
	n, k       int
	dt, at, bt string // D and input types
	aRegs      bool   // A in registers, else a descriptor
	negA, negB bool   // imm-scale-a/b = -1
}

// wgOp is one issued wgmma.mma_async of one thread.
type wgOp struct {
	s       *wgShape
	regs    []uint64 // the frame's register file at issue
	d       []int    // accumulator registers
	scaleD  bool
	a, b    smemDesc
	aRows   [2][]float64 // rows g and g+8 of the warp's 16 rows, from registers
	aReg    []int        // this thread's A registers and their values at issue
	aVal    []uint64
	snap    []byte // shared-memory bytes at issue: A's two rows (descriptor form), then B's columns
	warpRow int    // 16 * (warp in the warpgroup) + lane/4
	colBase int    // 2 * (lane % 4)
}

// decWgmma: wgmma.fence/commit_group/wait_group.sync.aligned and
// wgmma.mma_async.sync.aligned.m64nNkK.dtype.atype.btype.
func decWgmma(f *Function, in *inst) error {
	if len(in.mods) == 0 {
		return fmt.Errorf("wgmma without an operation")
	}
	switch in.mods[0] {
	case "fence":
		in.exec = func(t *thread, _ *inst) { t.wg.fenced = true }
	case "commit_group":
		in.exec = func(t *thread, _ *inst) {
			t.wg.groups = append(t.wg.groups, t.wg.issued)
			t.wg.issued = nil
		}
	case "wait_group":
		if len(in.args) != 1 || in.args[0].kind != oImm {
			return fmt.Errorf("wgmma.wait_group takes an immediate count")
		}
		n := int(in.args[0].imm)
		in.exec = func(t *thread, _ *inst) { t.wgWait(n) }
	case "mma_async":
		return decWgmmaAsync(in)
	default:
		return unsupported("wgmma.%s", in.mods[0])
	}
	return nil
}

func decWgmmaAsync(in *inst) error {
	var s wgShape
	var types []string
	for _, m := range in.mods[1:] {
		switch {
		case strings.HasPrefix(m, "m64n"):
			nk := strings.SplitN(m[4:], "k", 2)
			if len(nk) != 2 {
				return fmt.Errorf("wgmma shape %s", m)
			}
			s.n, _ = strconv.Atoi(nk[0])
			s.k, _ = strconv.Atoi(nk[1])
		case m == "sync" || m == "aligned":
		case m == "satfinite" || m == "sp":
			return unsupported("wgmma.mma_async .%s", m)
		default:
			types = append(types, m)
		}
	}
	if len(types) != 3 {
		return unsupported("wgmma.mma_async types %v", types)
	}
	s.dt, s.at, s.bt = types[0], types[1], types[2]
	wantK := map[string]int{"f16": 16, "bf16": 16, "e4m3": 32, "e5m2": 32}
	switch {
	case wantK[s.at] == 0 || wantK[s.bt] == 0:
		return unsupported("wgmma.mma_async inputs .%s.%s (tf32, integer and b1 forms)", s.at, s.bt)
	case s.k != wantK[s.at] || wantK[s.at] != wantK[s.bt] || (s.k != 32 && s.at != s.bt):
		return fmt.Errorf("wgmma.mma_async: k%d with .%s.%s", s.k, s.at, s.bt)
	case s.n < 8 || s.n > 256 || s.n%8 != 0:
		return fmt.Errorf("wgmma.mma_async: N=%d, must be 8..256 in steps of 8", s.n)
	case s.dt != "f32" && !(s.dt == "f16" && s.at != "bf16"):
		return fmt.Errorf("wgmma.mma_async: D .%s with .%s inputs", s.dt, s.at)
	}
	nd := s.n / 2
	if s.dt == "f16" {
		nd = s.n / 4
	}
	if len(in.args) < 5 || in.args[0].kind != oVec || len(in.args[0].vec) != nd {
		return fmt.Errorf("wgmma.mma_async m64n%d .%s needs %d accumulator registers", s.n, s.dt, nd)
	}
	s.aRegs = in.args[1].kind == oVec
	if s.aRegs && len(in.args[1].vec) != 4 {
		return fmt.Errorf("wgmma.mma_async: A in registers takes 4 registers")
	}
	// d, a, b, scale-d, imm-scale-a, imm-scale-b, then imm-trans-a (A in
	// shared memory) and imm-trans-b, for 16-bit inputs only.
	nargs := 6
	if s.k == 16 {
		nargs = 8
		if s.aRegs {
			nargs = 7
		}
	}
	if len(in.args) != nargs {
		return fmt.Errorf("wgmma.mma_async .%s with A in %s takes %d operands, not %d", s.at,
			map[bool]string{true: "registers", false: "shared memory"}[s.aRegs], nargs, len(in.args))
	}
	for i := 4; i < nargs; i++ {
		a := in.args[i]
		if a.kind != oImm {
			return fmt.Errorf("wgmma.mma_async operand %d must be an immediate", i+1)
		}
		v := int64(a.imm)
		switch {
		case i < 6 && v != 1 && v != -1:
			return fmt.Errorf("wgmma.mma_async: imm-scale %d, must be 1 or -1", v)
		case i >= 6 && v > 1:
			return fmt.Errorf("wgmma.mma_async: imm-trans %d, must be 0 or 1", v)
		case i >= 6 && v == 1:
			return unsupported("wgmma.mma_async with a transposed (MN-major) operand")
		}
	}
	s.negA, s.negB = int64(in.args[4].imm) == -1, int64(in.args[5].imm) == -1
	for _, o := range in.args[0].vec {
		if o.kind != oReg {
			return fmt.Errorf("wgmma.mma_async: accumulators must be registers")
		}
	}
	in.exec = func(t *thread, in *inst) { t.wgIssue(&s, in) }
	return nil
}

// wgElem decodes element k of a 32-byte K row of type ty.
func wgElem(row []byte, ty string, k int) float64 {
	switch ty {
	case "f16":
		return float64(f16ToF32(uint16(row[2*k]) | uint16(row[2*k+1])<<8))
	case "bf16":
		return float64(bf16ToF32(uint16(row[2*k]) | uint16(row[2*k+1])<<8))
	case "e4m3":
		return float64(e4m3ToF32(row[k]))
	}
	return float64(f16ToF32(uint16(row[k]) << 8)) // e5m2
}

// wgRegElem decodes element kk of row r (of 16) of the warp's A fragment
// from the lanes' four registers, laid out as mma.sync's A (PTX ISA
// "Register fragment layout for matrix A", wgmma .m64nNk16/k32).
func wgRegElem(vals *[32][8]uint64, ty string, r, kk int) float64 {
	per := 4 / typeSize(ty) // elements a register
	cc := kk % (4 * per)
	reg := vals[(r%8)<<2|cc/per][r/8+2*(kk/(4*per))]
	esz := 32 / per
	var row [4]byte
	v := uint32(reg) >> (esz * (cc % per))
	for i := range esz / 8 {
		row[i] = byte(v >> (8 * i))
	}
	return wgElem(row[:], ty, 0)
}

func (t *thread) wgIssue(s *wgShape, in *inst) {
	wg := &t.wg
	if !wg.fenced {
		t.panicf("wgmma.mma_async without a wgmma.fence before it (at the start and after each wgmma.wait_group)")
	}
	if (t.flat/128+1)*128 > int(t.b.dim.X*t.b.dim.Y*t.b.dim.Z) {
		t.panicf("wgmma.mma_async: thread %d's warpgroup is not complete in a block of %d threads", t.flat, t.b.dim.X*t.b.dim.Y*t.b.dim.Z)
	}
	op := &wgOp{s: s, regs: t.regs, scaleD: t.get(&in.args[3]) != 0,
		warpRow: 16*(t.flat/32%4) + t.lane/4, colBase: 2 * (t.lane % 4)}
	var err error
	if s.aRegs {
		var words [4]uint64
		for i := range 4 {
			o := &in.args[1].vec[i]
			words[i] = t.get(o)
			if o.kind == oReg {
				op.aReg, op.aVal = append(op.aReg, o.reg), append(op.aVal, words[i])
			}
		}
		vals := &t.collective(math.MaxUint32, words[:]...).vals
		for h := range 2 {
			op.aRows[h] = make([]float64, s.k)
			for kk := range s.k {
				op.aRows[h][kk] = wgRegElem(vals, s.at, t.lane/4+8*h, kk)
			}
		}
	} else if op.a, err = parseWgDesc(t.get(&in.args[1])); err != nil {
		t.panicf("wgmma.mma_async: A: %v", err)
	}
	if op.b, err = parseWgDesc(t.get(&in.args[2])); err != nil {
		t.panicf("wgmma.mma_async: B: %v", err)
	}
	op.snap = t.wgRead(op)
	if !s.aRegs { // .sync: the warp's lanes issue together (the A form exchanged registers above)
		t.collective(math.MaxUint32)
	}
	for _, o := range in.args[0].vec {
		op.d = append(op.d, o.reg)
		if wg.pending == nil {
			wg.pending = map[int]wgReg{}
		}
		p, ok := wg.pending[o.reg]
		if !ok {
			p.val = t.regs[o.reg]
			t.regs[o.reg] = wgPoison
		}
		p.ops++
		wg.pending[o.reg] = p
	}
	wg.issued = append(wg.issued, op)
}

// wgRead reads the shared-memory rows op uses: A's rows warpRow and
// warpRow+8 (descriptor form), then B's rows colBase+8q+{0,1}.
func (t *thread) wgRead(op *wgOp) []byte {
	var out []byte
	var buf [32]byte
	if !op.s.aRegs {
		for h := range 2 {
			t.rowBytes(op.a, op.warpRow+8*h, 32, buf[:])
			out = append(out, buf[:]...)
		}
	}
	for q := 0; q < op.s.n/8; q++ {
		for j := range 2 {
			t.rowBytes(op.b, 8*q+op.colBase+j, 32, buf[:])
			out = append(out, buf[:]...)
		}
	}
	return out
}

// wgWait completes the thread's committed groups until at most n remain.
// It is .sync: no lane of the warp goes on before every lane has completed
// its part (a warp that then releases the operands' shared memory does so
// for all its lanes, as on the GPU).
func (t *thread) wgWait(n int) {
	wg := &t.wg
	wg.fenced = false
	for len(wg.groups) > n {
		g := wg.groups[0]
		wg.groups = wg.groups[1:]
		for _, op := range g {
			t.wgRun(op)
		}
	}
	t.collective(math.MaxUint32)
}

// wgRun completes one MMA: checks what it read is unchanged, then writes
// its fragment of D. Products are exact in float64 and summed in k order
// with D, rounded once to f32 (or f16): more exact than the tensor core,
// whose FP8 accumulation keeps fewer bits.
func (t *thread) wgRun(op *wgOp) {
	s := op.s
	if now := t.wgRead(op); !bytes.Equal(now, op.snap) {
		i := 0
		for now[i] == op.snap[i] {
			i++
		}
		what, d, row := "A", op.a, op.warpRow+8*(i/32)
		if j := i - 64; s.aRegs || j >= 0 {
			if s.aRegs {
				j = i
			}
			what, d, row = "B", op.b, 8*(j/64)+op.colBase+j/32%2
		}
		t.panicf("wgmma.mma_async: shared memory of operand %s (row %d, K byte %d at %#x) changed between the MMA's issue and its wgmma.wait_group",
			what, row, i%32, d.addr(row, i%32))
	}
	for i, r := range op.aReg {
		if op.regs[r] != op.aVal[i] {
			t.panicf("wgmma.mma_async: an A register was written before the wgmma.wait_group that completes the MMA")
		}
	}
	snap := op.snap
	var a [2][]float64
	if s.aRegs {
		a = op.aRows
	} else {
		for h := range 2 {
			a[h] = make([]float64, s.k)
			for kk := range s.k {
				a[h][kk] = wgElem(snap[32*h:], s.at, kk)
			}
		}
		snap = snap[64:]
	}
	nb := s.n / 4
	b := make([]float64, nb*s.k) // column c's K values at c*k
	for c := range nb {
		for kk := range s.k {
			v := wgElem(snap[32*c:], s.bt, kk)
			if s.negA != s.negB {
				v = -v
			}
			b[c*s.k+kk] = v
		}
	}
	wg := &t.wg
	dot := func(h, c int) float64 {
		bc := b[c*s.k : (c+1)*s.k]
		var sum float64
		for kk, x := range a[h] {
			sum += x * bc[kk]
		}
		return sum
	}
	// D value i: row warpRow + 8*((i>>1)&1), column 8*(i/4) + colBase + (i&1)
	// (f32); f16 packs values 2j, 2j+1 in register j.
	val := func(i int, in uint64) uint64 {
		h, c := (i>>1)&1, 2*(i/4)+(i&1)
		sum := dot(h, c)
		if s.dt == "f16" {
			if op.scaleD {
				sum += float64(f16ToF32(uint16(in)))
			}
			return uint64(f32ToF16(f32Odd(sum)))
		}
		if op.scaleD {
			sum += float64(math.Float32frombits(uint32(in)))
		}
		return uint64(math.Float32bits(float32(sum)))
	}
	for j, r := range op.d {
		p := wg.pending[r]
		if s.dt == "f16" {
			p.val = val(2*j, p.val) | val(2*j+1, p.val>>16)<<16
		} else {
			p.val = val(j, p.val)
		}
		p.ops--
		if p.ops > 0 {
			wg.pending[r] = p
			continue
		}
		delete(wg.pending, r)
		if op.regs[r] != wgPoison {
			t.panicf("wgmma.mma_async: an accumulator register was written before the wgmma.wait_group that completes the MMA")
		}
		op.regs[r] = p.val
	}
}

// parseWgDesc decodes an sm_90 wgmma shared-memory matrix descriptor (PTX
// ISA "Matrix Descriptor Format"; CUTLASS GmmaDescriptor): start, LBO and
// SBO in 16-byte units, base offset in bits 49-51, the layout in 62-63
// (0 interleaved, 1 128B, 2 64B, 3 32B swizzle).
func parseWgDesc(d uint64) (smemDesc, error) {
	s := smemDesc{start: (d & 0x3fff) << 4, lbo: (d >> 16 & 0x3fff) << 4, sbo: (d >> 32 & 0x3fff) << 4}
	switch {
	case d>>46&7 != 0:
		return s, fmt.Errorf("descriptor %#x: bits 46-48 set (an sm_100 tcgen05 descriptor?)", d)
	case d>>49&7 != 0:
		return s, fmt.Errorf("descriptor %#x: a non-zero base offset is not emulated (start swizzled operands on the pattern's boundary)", d)
	case d>>52&0x3ff != 0 || d>>14&3 != 0 || d>>30&3 != 0:
		return s, fmt.Errorf("descriptor %#x: reserved bits set", d)
	}
	s.swz = [4]uint64{0, 128, 64, 32}[d>>62]
	return s, nil
}
