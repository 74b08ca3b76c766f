package ptxemu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// ummaPTX is one 128-thread CTA around tcgen05.mma: LOAD fills smA/smB,
// warp 0 allocates all 512 columns, every thread stores its lane's 32
// scale-factor words at columns 256..287 (SFLOAD may add a tcgen05.cp),
// thread 0 issues MMAS and commits to the barrier, every thread waits on
// it (parity WAITPAR) and copies its lane's N accumulator columns out.
const ummaPTX = `
.shared .align 1024 .b8 smA[16384];
.shared .align 1024 .b8 smB[32768];
.shared .align 16 .b8 smSF[1024];
.shared .align 8 .b64 bar;
.shared .align 8 .b64 bar2;
.shared .align 4 .b32 tbase;

.visible .entry mma(.param .u64 out, .param .u64 ga, .param .u64 gb, .param .u64 gsf, .param .u64 ahi, .param .u64 bhi,
	.param .u32 idesc, .param .u64 mapA, .param .u64 mapB)
{
	.reg .b32 %r<100>;
	.reg .b64 %rd<40>;
	.reg .pred %p<10>;

	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [ga];
	ld.param.u64 %rd3, [gb];
	ld.param.u64 %rd4, [gsf];
	ld.param.u64 %rd5, [ahi];
	ld.param.u64 %rd6, [bhi];
	ld.param.u32 %r9, [idesc];
	ld.param.u64 %rd30, [mapA];
	ld.param.u64 %rd31, [mapB];
	mov.u32 %r1, %tid.x;
	shr.u32 %r2, %r1, 5;
	mov.u32 %r3, smA;
	mov.u32 %r4, smB;
	mov.u32 %r5, bar;
	mov.u32 %r6, tbase;
	setp.ne.s32 %p2, %r2, 0;
	setp.ne.s32 %p3, %r1, 0;
	LOAD
	@%p2 bra ALLOCD;
	tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r6], 512;
	tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;
ALLOCD:
	@%p3 bra INITD;
	mbarrier.init.shared::cta.b64 [%r5], 1;
	fence.mbarrier_init.release.cluster;
INITD:
	fence.proxy.async.shared::cta;
	tcgen05.fence::before_thread_sync;
	bar.sync 0;
	tcgen05.fence::after_thread_sync;
	ld.shared.u32 %r11, [%r6];
	and.b32 %r12, %r2, 3;
	shl.b32 %r12, %r12, 21;
	add.s32 %r13, %r11, %r12;
	mul.wide.u32 %rd9, %r1, 128;
	add.s64 %rd10, %rd4, %rd9;
	ld.global.v4.u32 {%r20, %r21, %r22, %r23}, [%rd10];
	ld.global.v4.u32 {%r24, %r25, %r26, %r27}, [%rd10+16];
	ld.global.v4.u32 {%r28, %r29, %r30, %r31}, [%rd10+32];
	ld.global.v4.u32 {%r32, %r33, %r34, %r35}, [%rd10+48];
	ld.global.v4.u32 {%r36, %r37, %r38, %r39}, [%rd10+64];
	ld.global.v4.u32 {%r40, %r41, %r42, %r43}, [%rd10+80];
	ld.global.v4.u32 {%r44, %r45, %r46, %r47}, [%rd10+96];
	ld.global.v4.u32 {%r48, %r49, %r50, %r51}, [%rd10+112];
	add.s32 %r14, %r13, 256;
	tcgen05.st.sync.aligned.32x32b.x32.b32 [%r14], {%r20, %r21, %r22, %r23, %r24, %r25, %r26, %r27, %r28, %r29, %r30, %r31, %r32, %r33, %r34, %r35, %r36, %r37, %r38, %r39, %r40, %r41, %r42, %r43, %r44, %r45, %r46, %r47, %r48, %r49, %r50, %r51};
	tcgen05.wait::st.sync.aligned;
	tcgen05.fence::before_thread_sync;
	bar.sync 0;
	tcgen05.fence::after_thread_sync;
	@%p3 bra WAITMMA;
	cvt.u64.u32 %rd11, %r3;
	shr.u64 %rd11, %rd11, 4;
	or.b64 %rd12, %rd5, %rd11;
	cvt.u64.u32 %rd13, %r4;
	shr.u64 %rd13, %rd13, 4;
	or.b64 %rd14, %rd6, %rd13;
	SFLOAD
	MMAS
	tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%r5];
WAITMMA:
	mbarrier.try_wait.parity.shared::cta.b64 %p5, [%r5], WAITPAR;
	@!%p5 bra WAITMMA;
	tcgen05.fence::after_thread_sync;
	mov.u32 %r18, 0;
	mul.wide.u32 %rd17, %r1, NBYTES;
	add.s64 %rd18, %rd1, %rd17;
RD:
	setp.ge.u32 %p6, %r18, NCOLS;
	@%p6 bra RDD;
	add.s32 %r19, %r13, %r18;
	tcgen05.ld.sync.aligned.32x32b.x16.b32 {%r60, %r61, %r62, %r63, %r64, %r65, %r66, %r67, %r68, %r69, %r70, %r71, %r72, %r73, %r74, %r75}, [%r19];
	tcgen05.wait::ld.sync.aligned;
	st.global.v4.u32 [%rd18], {%r60, %r61, %r62, %r63};
	st.global.v4.u32 [%rd18+16], {%r64, %r65, %r66, %r67};
	st.global.v4.u32 [%rd18+32], {%r68, %r69, %r70, %r71};
	st.global.v4.u32 [%rd18+48], {%r72, %r73, %r74, %r75};
	add.s64 %rd18, %rd18, 64;
	add.s32 %r18, %r18, 16;
	bra.uni RD;
RDD:
	tcgen05.fence::before_thread_sync;
	bar.sync 0;
	@%p2 bra END;
	tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r11, 512;
END:
	ret;
}
`

// copyLoad copies the A and B images from global memory with plain loads.
const copyLoad = `
	shl.b32 %r7, %r1, 2;
CA:
	setp.ge.u32 %p1, %r7, 16384;
	@%p1 bra CAD;
	cvt.u64.u32 %rd7, %r7;
	add.s64 %rd8, %rd2, %rd7;
	ld.global.u32 %r8, [%rd8];
	add.s32 %r10, %r3, %r7;
	st.shared.u32 [%r10], %r8;
	add.s32 %r7, %r7, 512;
	bra.uni CA;
CAD:
	shl.b32 %r7, %r1, 2;
CB:
	setp.ge.u32 %p1, %r7, 32768;
	@%p1 bra CBD;
	cvt.u64.u32 %rd7, %r7;
	add.s64 %rd8, %rd3, %rd7;
	ld.global.u32 %r8, [%rd8];
	add.s32 %r10, %r4, %r7;
	st.shared.u32 [%r10], %r8;
	add.s32 %r7, %r7, 512;
	bra.uni CB;
CBD:
`

// ummaCase is one MMA kind: element encoders and decoders for A and B,
// the K elements an MMA step takes and how its scale factors sit in the
// 32 scale-factor columns.
type ummaCase struct {
	name       string
	kind       string // the PTX qualifiers after .cta_group::1
	m, n       int
	aFmt, bFmt uint32 // instruction-descriptor codes
	a, b       elemKind
	k          int // elements a step
	swz        int // swizzle span in bytes; 0: none (LBO 128 B, SBO 1024 B)
	negB       bool
	vec        int  // elements a scale factor (0: none)
	ue4m3      bool // scale factors ue4m3, else ue8m0
}

// elemKind encodes random elements into a row's 128 bytes and decodes them.
type elemKind struct {
	bits   int // 16, 8 or 4
	unpack bool
	decode func(code uint32) float64
}

// e2m1 values (the OCP MX spec's FP4 table, as in CUTLASS float_e2m1_t).
func e2m1Ref(c uint32) float64 {
	v := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}[c&7]
	if c&8 != 0 {
		return -v
	}
	return v
}

var (
	kindF16  = elemKind{16, false, func(c uint32) float64 { return float64(f16ToF32(uint16(c))) }}
	kindBF16 = elemKind{16, false, func(c uint32) float64 { return float64(bf16ToF32(uint16(c))) }}
	kindE4M3 = elemKind{8, false, func(c uint32) float64 { return float64(e4m3ToF32(uint8(c))) }}
	kindE5M2 = elemKind{8, false, func(c uint32) float64 { return float64(f16ToF32(uint16(c) << 8)) }}
	kindE2M1 = elemKind{4, false, e2m1Ref}
	kindE2U  = elemKind{4, true, e2m1Ref} // unpacked for kind::(mx)f8f6f4
)

func (e elemKind) random(rng *rand.Rand) uint32 {
	switch e.bits {
	case 16:
		f := float32(rng.IntN(33)-16) / 8
		if e.decode(uint32(f32ToF16(f))) == float64(f) {
			return uint32(f32ToF16(f))
		}
		return uint32(f32ToBF16(f))
	case 8:
		c := rng.Uint32() & 0xff
		if c&0x7f >= 0x78 { // no NaN/Inf or huge values
			c &^= 0x40
		}
		return c
	}
	return rng.Uint32() & 15
}

// put writes element k's code into a 128-byte K-major row.
func (e elemKind) put(row []byte, k int, c uint32) {
	switch {
	case e.bits == 16:
		binary.LittleEndian.PutUint16(row[2*k:], uint16(c))
	case e.bits == 8:
		row[k] = byte(c)
	case e.unpack: // 16 elements in 8 bytes, then 8 bytes of padding
		row[16*(k/16)+k%16/2] |= byte(c) << (4 * (k % 2))
	default:
		row[k/2] |= byte(c) << (4 * (k % 2))
	}
}

// image lays K-major rows out as the canonical layouts of the PTX ISA's
// "Shared memory matrix layout" (CUTLASS UMMA::Layout_K_SW128/SW64/SW32 and
// Layout_K_INTER): with a swizzle of S bytes, 8-row atoms of S-byte rows
// 8*S bytes apart, the 16-byte chunk index of row r XORed with
// (r % 8) / (128/S); without, 8x16-byte core matrices 128 bytes apart
// along K and 1024 along M/N.
func image(rows [][]byte, swz int) []byte {
	atom := 1024
	if swz > 0 {
		atom = 8 * swz
	}
	img := make([]byte, atom*((len(rows)+7)/8))
	for r, row := range rows {
		for kb, v := range row {
			off := r/8*atom + kb%16
			if swz > 0 {
				off += r%8*swz + (kb/16^r%8/(128/swz))*16
			} else {
				off += kb/16*128 + r%8*16
			}
			img[off] = v
		}
	}
	return img
}

func descHi(swz int) uint64 {
	if swz == 0 {
		return (128>>4)<<16 | (1024>>4)<<32 | 1<<46
	}
	code := map[int]uint64{128: 2, 64: 4, 32: 6}[swz]
	return 1<<16 | uint64(8*swz>>4)<<32 | 1<<46 | code<<61
}

// mmaSteps writes the MMA instructions of steps K-steps: descriptors
// advanced along K (32 bytes in the swizzled atom, two core matrices
// without swizzle), D overwritten by the first step, scale factors at the
// step's columns and ids.
func (c ummaCase) mmaSteps(steps int, sf func(step int) (colA, colB, id int)) string {
	var b strings.Builder
	adv := 2
	if c.swz == 0 {
		adv = 16
	}
	for s := range steps {
		fmt.Fprintf(&b, "\tadd.s64 %%rd15, %%rd12, %d;\n\tadd.s64 %%rd16, %%rd14, %d;\n\tmov.u32 %%r90, %d;\n\tsetp.ne.u32 %%p4, %%r90, 0;\n",
			s*adv, s*adv, s)
		if c.vec == 0 {
			fmt.Fprintf(&b, "\ttcgen05.mma.cta_group::1.kind::%s [%%r11], %%rd15, %%rd16, %%r9, %%p4;\n", c.kind)
			continue
		}
		ca, cb, id := sf(s)
		fmt.Fprintf(&b, "\tadd.s32 %%r15, %%r11, %d;\n\tadd.s32 %%r16, %%r11, %d;\n\tor.b32 %%r17, %%r9, %d;\n", ca, cb, id<<29|id<<4)
		fmt.Fprintf(&b, "\ttcgen05.mma.cta_group::1.kind::%s [%%r11], %%rd15, %%rd16, %%r17, [%%r15], [%%r16], %%p4;\n", c.kind)
	}
	return b.String()
}

func (c ummaCase) idesc() uint32 {
	id := c.aFmt<<7 | c.bFmt<<10 | uint32(c.n>>3)<<17 | uint32(c.m>>4)<<24
	if c.negB {
		id |= 1 << 14
	}
	if c.vec == 0 {
		return id | 1<<4 // D f32
	}
	if !c.ue4m3 {
		id |= 1 << 23
	}
	return id
}

// sfLayout places step s's scale factors: a step takes per = k/vec bytes
// of a column's word, so 4/per steps share a set of columns (SFA at 256+,
// SFB at 260+) with ids 0, per, ..; the next steps take the next set.
func (c ummaCase) sfLayout(s int) (colA, colB, id int) {
	per := c.k / c.vec
	group := s / (4 / per)
	return 256 + 8*group, 260 + 8*group, s % (4 / per) * per
}

// TestUMMA runs tcgen05.mma of each kind over 4 K-steps and compares D
// with a float64 reference. Scale factors sit as CUTLASS tmem_sf_frg lays
// them (cute/atom/mma_traits_sm100_frag.hpp): row i's in lane i%32 of
// every lane quarter, column base + i/32, byte id + j; the D tile as
// tmem_frg: lane = row for M=128, rows 16q..16q+15 in lanes 32q.. for M=64.
func TestUMMA(t *testing.T) {
	for _, c := range []ummaCase{
		{name: "f16 M128 N64", kind: "f16", m: 128, n: 64, a: kindF16, b: kindF16, k: 16, swz: 128},
		{name: "bf16 M64 N32", kind: "f16", m: 64, n: 32, aFmt: 1, bFmt: 1, a: kindBF16, b: kindBF16, k: 16, swz: 128},
		{name: "e4m3 x -e5m2 no swizzle", kind: "f8f6f4", m: 128, n: 48, bFmt: 1, a: kindE4M3, b: kindE5M2, k: 32, negB: true},
		{name: "f16 64B swizzle", kind: "f16", m: 128, n: 16, a: kindF16, b: kindF16, k: 16, swz: 64},
		{name: "e5m2 x e4m3 32B swizzle", kind: "f8f6f4", m: 128, n: 32, aFmt: 1, a: kindE5M2, b: kindE4M3, k: 32, swz: 32},
		{name: "mxf8f6f4 e4m3 x e2m1", kind: "mxf8f6f4.block_scale.block32", m: 128, n: 64, bFmt: 5, a: kindE4M3, b: kindE2U, k: 32, swz: 128, vec: 32},
		{name: "mxf4 block32 ue8m0", kind: "mxf4.block_scale.block32", m: 128, n: 32, aFmt: 1, bFmt: 1, a: kindE2M1, b: kindE2M1, k: 64, swz: 128, vec: 32},
		{name: "mxf4nvf4 block16 ue4m3", kind: "mxf4nvf4.block_scale.block16", m: 128, n: 96, aFmt: 1, bFmt: 1, a: kindE2M1, b: kindE2M1, k: 64, swz: 128, vec: 16, ue4m3: true},
	} {
		t.Run(c.name, func(t *testing.T) { runUMMA(t, c, false) })
	}
}

func runUMMA(t *testing.T, c ummaCase, tma bool) {
	steps := 4 // K steps: 32 bytes each, within one swizzle row
	if c.swz == 32 || c.swz == 64 {
		steps = c.swz / 32
	}
	rng := rand.New(rand.NewPCG(7, uint64(c.m*1000+c.n)))
	K := steps * c.k
	gen := func(rows int, e elemKind) ([][]float64, [][]byte) {
		vals, bytes := make([][]float64, rows), make([][]byte, rows)
		for r := range rows {
			vals[r], bytes[r] = make([]float64, K), make([]byte, 32*steps)
			for k := range K {
				code := e.random(rng)
				vals[r][k] = e.decode(code)
				e.put(bytes[r], k, code)
			}
		}
		return vals, bytes
	}
	av, ab := gen(c.m, c.a)
	bv, bb := gen(c.n, c.b)
	nsf := 0
	if c.vec > 0 {
		nsf = K / c.vec
	}
	sfCode := func() byte {
		if c.ue4m3 {
			return byte(0x28 + rng.IntN(0x30))
		}
		return byte(120 + rng.IntN(15))
	}
	sfDec := func(b byte) float64 {
		if c.ue4m3 {
			return float64(e4m3ToF32(b))
		}
		return math.Ldexp(1, int(b)-127)
	}
	sfa, sfb := make([][]byte, c.m), make([][]byte, c.n)
	for i := range sfa {
		sfa[i] = make([]byte, nsf)
		for j := range sfa[i] {
			sfa[i][j] = sfCode()
		}
	}
	for i := range sfb {
		sfb[i] = make([]byte, nsf)
		for j := range sfb[i] {
			sfb[i][j] = sfCode()
		}
	}
	// the 32 scale-factor words of each lane (columns 256..287)
	words := make([]byte, 128*128)
	if c.vec > 0 {
		per := c.k / c.vec
		for s := range steps {
			ca, cb, id := c.sfLayout(s)
			for lane := range 128 {
				for j := range per {
					for q := 0; 32*q < c.m; q++ {
						words[lane*128+4*(ca-256+q)+id+j] = sfa[32*q+lane%32][s*per+j]
					}
					for q := 0; 32*q+lane%32 < c.n; q++ {
						words[lane*128+4*(cb-256+q)+id+j] = sfb[32*q+lane%32][s*per+j]
					}
				}
			}
		}
	}
	d := NewDevice()
	up := func(b []byte) uint64 {
		p, buf := devBuf(t, d, len(b))
		copy(buf, b)
		return p
	}
	load, sfload := copyLoad, ""
	var pa, pb, mapA, mapB uint64
	if tma {
		// A row-major e4m3 and B packed e2m1 in global memory, the scale
		// factors as 512-byte atoms (CUTLASS Sm1xxBlockScaledBasicChunk:
		// byte (i%32)*16 + (i/32)*4 + j) for tcgen05.cp 32x128b.warpx4
		ga, gb, atoms := make([]byte, 128*c.m), make([]byte, 64*c.n), make([]byte, 1024)
		for m := range c.m {
			copy(ga[128*m:], ab[m])
			for j := range nsf {
				atoms[m%32*16+m/32*4+j] = sfa[m][j]
			}
		}
		for n := range c.n {
			for k := range K {
				gb[64*n+k/2] |= bb[n][16*(k/16)+k%16/2] >> (4 * (k % 2)) & 15 << (4 * (k % 2))
			}
			for j := range nsf {
				atoms[512+n%32*16+n/32*4+j] = sfb[n][j]
			}
		}
		words = make([]byte, len(words)) // tcgen05.st writes zeros; the copies land after it
		pga, pgb := up(ga), up(gb)
		pb = up(atoms)
		mapA = upMap(t, d, TensorMap{DType: TMAUint8, Rank: 2, Addr: pga, Dims: [5]uint64{128, uint64(c.m)}, Strides: [5]uint64{0, 128}, Box: [5]uint32{128, uint32(c.m)}, Swizzle: 3})
		mapB = upMap(t, d, TensorMap{DType: TMA16U4Align16, Rank: 2, Addr: pgb, Dims: [5]uint64{128, uint64(c.n)}, Strides: [5]uint64{0, 64}, Box: [5]uint32{128, uint32(c.n)}, Swizzle: 3})
		load = tmaSFCopy
		sfload = strings.ReplaceAll(tmaIssue, "TX", fmt.Sprint(128*c.m+64*c.n))
	} else {
		pa = up(append(image(ab, c.swz), make([]byte, 16384)...)[:16384])
		pb = up(append(image(bb, c.swz), make([]byte, 32768)...)[:32768])
	}
	body := strings.NewReplacer("LOAD", load, "SFLOAD", sfload, "MMAS", c.mmaSteps(steps, c.sfLayout), "WAITPAR", "0",
		"NBYTES", fmt.Sprint(4*c.n), "NCOLS", fmt.Sprint(c.n)).Replace(ummaPTX)
	mod := loadPTX100(t, d, body)
	psf := up(words)
	out, ob := devBuf(t, d, 128*4*c.n)
	mustLaunch(t, d, mod, "mma", Dim{1, 1, 1}, Dim{128, 1, 1}, 0, params(out, pa, pb, psf, descHi(c.swz), descHi(c.swz), c.idesc(), mapA, mapB))
	got := u32s(ob)
	for m := range c.m {
		lane := m
		if c.m == 64 {
			lane = m%16 + 32*(m/16)
		}
		for n := range c.n {
			var want, mag float64
			for k := range K {
				p := av[m][k] * bv[n][k]
				if c.negB {
					p = -p
				}
				if c.vec > 0 {
					p *= sfDec(sfa[m][k/c.vec]) * sfDec(sfb[n][k/c.vec])
				}
				want += p
				mag += math.Abs(p)
			}
			g := float64(math.Float32frombits(got[lane*c.n+n]))
			if math.Abs(g-want) > 1e-6*mag+1e-30 {
				t.Fatalf("D[%d][%d] = %g, want %g", m, n, g, want)
			}
		}
	}
}

func upMap(t *testing.T, d *Device, m TensorMap) uint64 {
	t.Helper()
	enc, err := EncodeTensorMap(m)
	if err != nil {
		t.Fatal(err)
	}
	p, b := devBuf(t, d, 128)
	copy(b, enc[:])
	return p
}

// tmaSFCopy copies the two scale-factor atoms (gb) to smSF with plain stores.
const tmaSFCopy = `
	shl.b32 %r7, %r1, 2;
	mov.u32 %r96, smSF;
	setp.ge.u32 %p1, %r7, 1024;
	@%p1 bra SFD;
	cvt.u64.u32 %rd7, %r7;
	add.s64 %rd8, %rd3, %rd7;
	ld.global.u32 %r8, [%rd8];
	add.s32 %r10, %r96, %r7;
	st.shared.u32 [%r10], %r8;
	add.s32 %r7, %r7, 512;
	setp.ge.u32 %p1, %r7, 1024;
	@%p1 bra SFD;
	add.s64 %rd8, %rd8, 512;
	ld.global.u32 %r8, [%rd8];
	add.s32 %r10, %r10, 512;
	st.shared.u32 [%r10], %r8;
SFD:
`

// tmaIssue (thread 0) loads A and B with TMA on a second barrier, waits,
// and copies the scale-factor atoms into tensor memory (DeepGEMM sm100
// make_sf_desc: no swizzle, SBO 128 bytes).
const tmaIssue = `
	mov.u32 %r95, bar2;
	mbarrier.init.shared::cta.b64 [%r95], 1;
	fence.mbarrier_init.release.cluster;
	mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r95], TX;
	mov.u32 %r91, 0;
	cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r3], [%rd30, {%r91, %r91}], [%r95];
	cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r4], [%rd31, {%r91, %r91}], [%r95];
TW:
	mbarrier.try_wait.parity.shared::cta.b64 %p7, [%r95], 0;
	@!%p7 bra TW;
	tcgen05.fence::after_thread_sync;
	mov.u32 %r92, smSF;
	cvt.u64.u32 %rd20, %r92;
	shr.u64 %rd20, %rd20, 4;
	mov.b64 %rd22, 0x400800000000;
	or.b64 %rd21, %rd20, %rd22;
	add.s32 %r93, %r11, 256;
	tcgen05.cp.cta_group::1.32x128b.warpx4 [%r93], %rd21;
	add.s64 %rd23, %rd21, 32;
	add.s32 %r94, %r11, 260;
	tcgen05.cp.cta_group::1.32x128b.warpx4 [%r94], %rd23;
`

// TestTinyGEMMTile is the pieces together: TMA loads of A (e4m3) and B
// (e2m1, 16U4_ALIGN16B) on an mbarrier with their byte count, scale
// factors copied to tensor memory by tcgen05.cp, one thread issuing the
// block-scaled MMAs (the MXFP4 expert path: kind::mxf8f6f4, ue8m0 per 32)
// and committing to a second barrier, four warps loading D with tcgen05.ld.
func TestTinyGEMMTile(t *testing.T) {
	runUMMA(t, ummaCase{name: "tile", kind: "mxf8f6f4.block_scale.block32", m: 128, n: 64, bFmt: 5, a: kindE4M3, b: kindE2U,
		k: 32, swz: 128, vec: 32}, true)
}

// TestUMMAFaults: descriptors the hardware rejects or the emulator does not
// model fail the launch with a message naming the field.
func TestUMMAFaults(t *testing.T) {
	f16 := ummaCase{kind: "f16", m: 128, n: 64, k: 16, swz: 128}
	f8 := ummaCase{kind: "f8f6f4", m: 128, n: 64, k: 32, swz: 128}
	mx := ummaCase{kind: "mxf8f6f4.block_scale.block32", m: 128, n: 64, bFmt: 5, k: 32, swz: 128, vec: 32}
	nv := ummaCase{kind: "mxf4nvf4.block_scale.block16", m: 128, n: 64, aFmt: 1, bFmt: 1, k: 64, swz: 128, vec: 16, ue4m3: true}
	for _, tc := range []struct {
		name  string
		c     ummaCase
		idesc func(uint32) uint32
		ahi   func(uint64) uint64
		want  string
	}{
		{"wgmma descriptor", f16, nil, func(h uint64) uint64 { return h&^(7<<46|7<<61) | 1<<62 }, "bits 46-48"},
		{"base offset", f16, nil, func(h uint64) uint64 { return h | 1<<49 }, "base offset"},
		{"128B swizzle with 32B atoms", f16, nil, func(h uint64) uint64 { return h&^(7<<61) | 1<<61 }, "32B atoms"},
		{"MN-major A", f16, func(i uint32) uint32 { return i | 1<<15 }, nil, "MN-major"},
		{"N=24 for M=128", f16, func(i uint32) uint32 { return i&^(0x3f<<17) | 3<<17 }, nil, "N=24 invalid"},
		{"M=256 on one CTA", f16, func(i uint32) uint32 { return i&^(0x1f<<24) | 16<<24 }, nil, "M=256"},
		{"f16 accumulator", f16, func(i uint32) uint32 { return i &^ (3 << 4) }, nil, "only F32"},
		{"fp6 operand", f8, func(i uint32) uint32 { return i | 3<<7 }, nil, "e2m1 (5) are emulated"},
		{"ue4m3 for mxf8f6f4", mx, func(i uint32) uint32 { return i &^ (1 << 23) }, nil, "ue4m3 scale factors need"},
		{"block16 scale id", nv, func(i uint32) uint32 { return i | 1<<29 }, nil, "scale-factor ids"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			idesc, ahi := c.idesc(), descHi(c.swz)
			if tc.idesc != nil {
				idesc = tc.idesc(idesc)
			}
			if tc.ahi != nil {
				ahi = tc.ahi(ahi)
			}
			d := NewDevice()
			body := strings.NewReplacer("LOAD", copyLoad, "SFLOAD", "", "MMAS", c.mmaSteps(1, c.sfLayout), "WAITPAR", "0",
				"NBYTES", fmt.Sprint(4*c.n), "NCOLS", fmt.Sprint(c.n)).Replace(ummaPTX)
			mod := loadPTX100(t, d, body)
			pa, _ := devBuf(t, d, 16384)
			pb, _ := devBuf(t, d, 32768)
			psf, _ := devBuf(t, d, 128*128)
			out, _ := devBuf(t, d, 128*4*c.n)
			err := launch(t, d, mod, "mma", Dim{1, 1, 1}, Dim{128, 1, 1}, 0, params(out, pa, pb, psf, ahi, descHi(c.swz), idesc, uint64(0), uint64(0)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("launch error %v, want one naming %q", err, tc.want)
			}
		})
	}
}
