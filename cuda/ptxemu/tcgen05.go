package ptxemu

import (
	"fmt"
	"math"
	"strings"
)

// decTcgen05 decodes the tcgen05 family (sm_100a): tensor memory, its
// copies, the MMA and its commit. Only .cta_group::1 is emulated.
func decTcgen05(f *Function, in *inst) error {
	if len(in.mods) == 0 {
		return fmt.Errorf("tcgen05 without an operation")
	}
	if in.has("cta_group::2") {
		return unsupported("tcgen05 .cta_group::2 (CTA pairs)")
	}
	switch op := in.mods[0]; op {
	case "alloc", "dealloc", "relinquish_alloc_permit":
		return decTmemAlloc(in, op)
	case "ld", "st":
		return decTmemLdSt(in, op == "st")
	case "wait::ld", "wait::st":
		decTmemWait(in, op == "wait::ld")
		return nil
	case "fence::before_thread_sync", "fence::after_thread_sync":
		in.exec = func(*thread, *inst) {} // ordering only: the emulator runs tcgen05 work in issue order
		return nil
	case "cp":
		return decTmemCp(in)
	case "mma":
		return decUMMA(in)
	case "commit":
		return decCommit(in)
	default:
		return unsupported("tcgen05.%s", op)
	}
}

// smemDesc is a decoded sm_100 shared-memory matrix descriptor (PTX ISA
// "tcgen05 shared memory descriptor"; CUTLASS cute/arch/mma_sm100_desc.hpp
// SmemDescriptor): start, LBO and SBO in bytes and the swizzle span.
type smemDesc struct {
	start, lbo, sbo uint64
	swz             uint64 // 0 (none), 32, 64 or 128 bytes
}

func parseSmemDesc(d uint64) (smemDesc, error) {
	s := smemDesc{start: (d & 0x3fff) << 4, lbo: (d >> 16 & 0x3fff) << 4, sbo: (d >> 32 & 0x3fff) << 4}
	switch {
	case d>>46&7 != 1:
		return s, fmt.Errorf("shared-memory descriptor %#x: bits 46-48 are %#b, must be 0b001 (an sm_90 wgmma descriptor?)", d, d>>46&7)
	case d>>49&7 != 0:
		return s, fmt.Errorf("shared-memory descriptor %#x: a non-zero base offset is not emulated (start swizzled operands on the pattern's boundary)", d)
	case d>>52&1 != 0:
		return s, fmt.Errorf("shared-memory descriptor %#x: the absolute LBO mode is sm_103 only", d)
	case d>>53&0xff != 0 || d>>14&3 != 0 || d>>30&3 != 0:
		return s, fmt.Errorf("shared-memory descriptor %#x: reserved bits set", d)
	}
	switch d >> 61 {
	case 0:
	case 2:
		s.swz = 128
	case 4:
		s.swz = 64
	case 6:
		s.swz = 32
	case 1:
		return s, fmt.Errorf("shared-memory descriptor %#x: the 128B swizzle with 32B atoms is not emulated", d)
	default:
		return s, fmt.Errorf("shared-memory descriptor %#x: invalid swizzle mode %d", d, d>>61)
	}
	return s, nil
}

// addr is the shared-memory address of byte kb (< 32 for an MMA operand) of
// row r in the K-major canonical layout. Without swizzle, core matrices
// of 8 rows x 16 bytes are contiguous, LBO apart along K and SBO apart
// along M/N. With a swizzle of S bytes, rows are S bytes apart in atoms
// of 8 rows, SBO apart, and the 16-byte chunk index (address bits 4..)
// is XORed with the row within the pattern (address bits 7..), over the
// absolute address, as TMA writes it.
func (s smemDesc) addr(r, kb int) uint64 {
	a := s.start + uint64(r/8)*s.sbo
	if s.swz == 0 {
		return a + uint64(kb/16)*s.lbo + uint64(r%8)*16 + uint64(kb%16)
	}
	a += uint64(r%8)*s.swz + uint64(kb)
	return swizzle(a, s.swz)
}

// swizzle applies an S-byte swizzle to a shared-memory address: bits 4..
// XOR bits 7.. (CUTLASS Swizzle<3,4,3>, <2,4,3>, <1,4,3>).
func swizzle(a, span uint64) uint64 {
	if span == 0 {
		return a
	}
	return a ^ (a>>7&(span/16-1))<<4
}

// rowBytes reads n bytes of row r of the operand (n a multiple of 16).
func (t *thread) rowBytes(s smemDesc, r, n int, buf []byte) {
	for c := 0; c < n; c += 16 {
		copy(buf[c:c+16], t.mem(spShared, s.addr(r, c), 16))
	}
}

// decTmemCp: tcgen05.cp.cta_group::1.{128x256b,128x128b,32x128b.warpx4}
// [taddr], sdesc copies rows of 32 or 16 bytes, addressed as a K-major
// operand, to lanes 0.. of tensor memory, 4 bytes a column; .warpx4
// repeats the 32 rows in the four lane quarters (the scale-factor copy of
// DeepGEMM sm100 and CUTLASS SM100_UTCCP_4x32dp128bit_1cta).
func decTmemCp(in *inst) error {
	rows, bytes, reps := 0, 0, 1
	for _, m := range in.mods {
		switch m {
		case "128x256b":
			rows, bytes = 128, 32
		case "128x128b":
			rows, bytes = 128, 16
		case "32x128b":
			rows, bytes = 32, 16
		case "warpx4":
			reps = 4
		case "4x256b", "64x128b", "warpx2::02_13", "warpx2::01_23":
			return unsupported("tcgen05.cp shape %s", m)
		}
		if strings.HasPrefix(m, "b8x16") || strings.HasPrefix(m, "b4x16") || strings.HasPrefix(m, "b6x16") {
			return unsupported("tcgen05.cp decompression .%s", m)
		}
	}
	if rows == 0 || (rows == 32) != (reps == 4) {
		return unsupported("tcgen05.cp form %s", in.text)
	}
	if len(in.args) != 2 || in.args[0].kind != oAddr {
		return fmt.Errorf("tcgen05.cp takes [taddr], sdesc")
	}
	in.exec = func(t *thread, in *inst) {
		taddr := uint32(t.addr(&in.args[0]))
		s, err := parseSmemDesc(t.get(&in.args[1]))
		if err != nil {
			t.panicf("tcgen05.cp: %v", err)
		}
		col := int(taddr & 0xffff)
		if taddr>>16 != 0 {
			t.panicf("tcgen05.cp to lane %d: the copy starts at lane 0", taddr>>16)
		}
		t.tmemLocked(func(m *tmemState) error { return m.checkCols(col, bytes/4) })
		t.tc.queue = append(t.tc.queue, func() {
			buf := make([]byte, rows*bytes)
			for r := range rows {
				t.rowBytes(s, r, bytes, buf[r*bytes:])
			}
			t.tmemLocked(func(m *tmemState) error {
				for rep := range reps {
					for r := range rows {
						for c := 0; c < bytes/4; c++ {
							*m.cell(32*rep+r, col+c) = uint32(getLE(buf[r*bytes+4*c : r*bytes+4*c+4]))
						}
					}
				}
				return nil
			})
		})
	}
	return nil
}

// decCommit: tcgen05.commit.cta_group::1.mbarrier::arrive::one
// {.shared::cluster}{.multicast::cluster}.b64 [mbar]{, ctaMask} runs the
// thread's issued MMAs and copies, then arrives once on the barrier (in
// every CTA of the mask, at the same offset, with .multicast).
func decCommit(in *inst) error {
	if !in.has("mbarrier::arrive::one") {
		return unsupported("tcgen05.commit form %s", in.text)
	}
	multicast := in.has("multicast::cluster")
	if len(in.args) != 1+b2i(multicast) || in.args[0].kind != oAddr {
		return fmt.Errorf("tcgen05.commit takes [mbar]{, ctaMask}")
	}
	sp := in.sp
	if sp == spNone {
		sp = spGeneric
	}
	in.exec = func(t *thread, in *inst) {
		t.runQueue()
		addr := t.addr(&in.args[0])
		bars := []mbar{}
		if multicast {
			if addr%8 != 0 {
				t.illegal(fmt.Errorf("mbarrier at %#x is not 8-byte aligned", addr))
			}
			for _, m := range t.ctaTargets(addr, uint16(t.get(&in.args[1])), true) {
				if m.off+8 > uint64(len(m.b.shared)) {
					t.illegal(fmt.Errorf("mbarrier at %#x past %d bytes of shared memory", m.off, len(m.b.shared)))
				}
				bars = append(bars, m)
			}
		} else {
			bars = append(bars, t.locateMbar(sp, addr))
		}
		for _, m := range bars {
			t.mbApply(m, func() error { _, err := mbUpdate(m, 1, 0); return err })
		}
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// e2m1 values by code (sign in bit 3).
var e2m1Vals = [8]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}

func e2m1(code byte) float64 {
	v := e2m1Vals[code&7]
	if code&8 != 0 {
		return -v
	}
	return v
}

func ue8m0(b byte) float64 {
	if b == 0xff {
		return math.NaN()
	}
	return math.Ldexp(1, int(b)-127)
}

// ue4m3 is e4m3 without a sign: bit 7 is ignored.
func ue4m3(b byte) float64 { return float64(e4m3ToF32(b & 0x7f)) }
