package ptxemu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

const sm90Header = ".version 8.4\n.target sm_90a\n.address_size 64\n\n"

// wgPTX is one warpgroup around wgmma.mma_async: every thread copies the A
// (64 rows) and B (N rows) images from global memory into smA/smB, loads its
// D fragment (ND registers) and, for A in registers, its STEPS x 4 A
// registers, then issues STEPS MMAs in one group (descriptors advanced along
// K), waits, and stores D. ISSUED runs between the MMAs and the commit,
// WAITED after the wait (before the stores).
const wgPTX = `
.shared .align 1024 .b8 smA[8192];
.shared .align 1024 .b8 smB[32768];

.visible .entry wg(.param .u64 out, .param .u64 ga, .param .u64 gb, .param .u64 gd, .param .u64 gfrag,
	.param .u64 ahi, .param .u64 bhi)
{
	.reg .b32 %r<40>;
	.reg .b32 %a<40>;
	.reg .b32 %d<130>;
	.reg .b64 %rd<40>;
	.reg .pred %p<10>;

	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [ga];
	ld.param.u64 %rd3, [gb];
	ld.param.u64 %rd4, [gd];
	ld.param.u64 %rd5, [gfrag];
	ld.param.u64 %rd6, [ahi];
	ld.param.u64 %rd7, [bhi];
	mov.u32 %r1, %tid.x;
	mov.u32 %r3, smA;
	mov.u32 %r4, smB;
	shl.b32 %r7, %r1, 2;
CA:
	setp.ge.u32 %p1, %r7, 8192;
	@%p1 bra CAD;
	cvt.u64.u32 %rd8, %r7;
	add.s64 %rd9, %rd2, %rd8;
	ld.global.u32 %r8, [%rd9];
	add.s32 %r10, %r3, %r7;
	st.shared.u32 [%r10], %r8;
	add.s32 %r7, %r7, NTHREADS4;
	bra.uni CA;
CAD:
	shl.b32 %r7, %r1, 2;
CB:
	setp.ge.u32 %p1, %r7, 32768;
	@%p1 bra CBD;
	cvt.u64.u32 %rd8, %r7;
	add.s64 %rd9, %rd3, %rd8;
	ld.global.u32 %r8, [%rd9];
	add.s32 %r10, %r4, %r7;
	st.shared.u32 [%r10], %r8;
	add.s32 %r7, %r7, NTHREADS4;
	bra.uni CB;
CBD:
	bar.sync 0;
	mul.wide.u32 %rd10, %r1, DBYTES;
	add.s64 %rd11, %rd4, %rd10;
	add.s64 %rd30, %rd1, %rd10;
	mul.wide.u32 %rd10, %r1, FBYTES;
	add.s64 %rd12, %rd5, %rd10;
LOADS
	cvt.u64.u32 %rd13, %r3;
	shr.u64 %rd13, %rd13, 4;
	or.b64 %rd14, %rd6, %rd13;
	cvt.u64.u32 %rd13, %r4;
	shr.u64 %rd13, %rd13, 4;
	or.b64 %rd15, %rd7, %rd13;
FENCE
MMAS
ISSUED
	wgmma.commit_group.sync.aligned;
	wgmma.wait_group.sync.aligned 0;
WAITED
STORES
	ret;
}
`

// wgCase is one wgmma form: input kinds, N, swizzle, where A lives, the
// negations and whether the first MMA adds D (scale-d).
type wgCase struct {
	name       string
	dt, at, bt string
	a, b       elemKind
	n, swz     int
	aRegs      bool
	negA, negB bool
	scaleD     bool
}

func (c wgCase) k() int { return 32 / (c.a.bits / 8) }

// steps: the K steps of 32 bytes inside one swizzle row (4 without swizzle).
func (c wgCase) steps() int {
	if c.swz == 32 || c.swz == 64 {
		return c.swz / 32
	}
	return 4
}

func (c wgCase) nd() int {
	if c.dt == "f16" {
		return c.n / 4
	}
	return c.n / 2
}

// wgDescHi is a wgmma descriptor's fixed part (CUTLASS GmmaDescriptor):
// swizzled K-major layouts have 8-row atoms 8*S bytes apart (SBO) and an
// unused LBO of 1; the interleaved one 128-byte core matrices 128 bytes
// apart along K (LBO) and 1024 along M/N (SBO), as image lays them out.
func wgDescHi(swz int) uint64 {
	if swz == 0 {
		return (128>>4)<<16 | (1024>>4)<<32
	}
	return 1<<16 | uint64(8*swz>>4)<<32 | map[int]uint64{128: 1, 64: 2, 32: 3}[swz]<<62
}

// ptx fills in wgPTX for c; issued and waited are inserted after the MMAs
// and after the wait.
func (c wgCase) ptx(fence bool, issued, waited string) string {
	nd, steps := c.nd(), c.steps()
	var loads, mmas, stores strings.Builder
	for i := range nd {
		fmt.Fprintf(&loads, "\tld.global.b32 %%d%d, [%%rd11+%d];\n", i, 4*i)
		fmt.Fprintf(&stores, "\tst.global.b32 [%%rd30+%d], %%d%d;\n", 4*i, i)
	}
	if c.aRegs {
		for i := range 4 * steps {
			fmt.Fprintf(&loads, "\tld.global.b32 %%a%d, [%%rd12+%d];\n", i, 4*i)
		}
	}
	regs := make([]string, nd)
	for i := range regs {
		regs[i] = fmt.Sprintf("%%d%d", i)
	}
	adv := 2 // 32 bytes of K: inside the swizzle row, or two core matrices
	if c.swz == 0 {
		adv = 16
	}
	imm := func(neg bool) int {
		if neg {
			return -1
		}
		return 1
	}
	for s := range steps {
		fmt.Fprintf(&mmas, "\tadd.s64 %%rd16, %%rd14, %d;\n\tadd.s64 %%rd17, %%rd15, %d;\n", s*adv, s*adv)
		fmt.Fprintf(&mmas, "\tsetp.ne.u32 %%p4, %d, 0;\n", b2i(s > 0 || c.scaleD))
		a := "%rd16"
		if c.aRegs {
			a = fmt.Sprintf("{%%a%d, %%a%d, %%a%d, %%a%d}", 4*s, 4*s+1, 4*s+2, 4*s+3)
		}
		tail := ""
		if c.k() == 16 {
			tail = ", 0, 0"
			if c.aRegs {
				tail = ", 0"
			}
		}
		fmt.Fprintf(&mmas, "\twgmma.mma_async.sync.aligned.m64n%dk%d.%s.%s.%s {%s}, %s, %%rd17, %%p4, %d, %d%s;\n",
			c.n, c.k(), c.dt, c.at, c.bt, strings.Join(regs, ", "), a, imm(c.negA), imm(c.negB), tail)
	}
	f := ""
	if fence {
		f = "\twgmma.fence.sync.aligned;"
	}
	return strings.NewReplacer("LOADS", loads.String(), "MMAS", mmas.String(), "STORES", stores.String(),
		"FENCE", f, "ISSUED", issued, "WAITED", waited, "DBYTES", fmt.Sprint(4*nd), "FBYTES", fmt.Sprint(16*steps),
		"NTHREADS4", "512").Replace(wgPTX)
}

// wgData is a case's random operands and initial D.
type wgData struct {
	av, bv     [][]float64 // [row][k] over all steps
	ab, bb     [][]byte    // K-major rows, 32 bytes a step
	dinit      []uint32    // [thread][register]
	frag       []uint32    // [thread][step][4]: A in registers
	ga, gb, gd []byte
}

// wgFragA is A's register fragment (CUTLASS SM90 ALayout_64x16 and its
// 8-bit form): register j of thread t holds 4 bytes of row 16*(t/32) +
// (t%32)/4 + 8*(j%2), at byte 4*(t%4) of the K step's half j/2 (two 16-bit
// or four 8-bit elements).
func wgFragA(ab [][]byte, tid, step, j int) uint32 {
	row := 16*(tid/32) + tid%32/4 + 8*(j%2)
	byteOff := 32*step + 16*(j/2) + 4*(tid%4) // 4 bytes of K per lane, two halves of 16 bytes
	return binary.LittleEndian.Uint32(ab[row][byteOff:])
}

func (c wgCase) data(rng *rand.Rand) wgData {
	steps := c.steps()
	K := steps * c.k()
	var w wgData
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
	w.av, w.ab = gen(64, c.a)
	w.bv, w.bb = gen(c.n, c.b)
	w.ga = append(image(w.ab, c.swz), make([]byte, 8192)...)[:8192]
	w.gb = append(image(w.bb, c.swz), make([]byte, 32768)...)[:32768]
	nd := c.nd()
	w.dinit = make([]uint32, 128*nd)
	for i := range w.dinit {
		v := float32(rng.IntN(64)-32) / 4
		if c.dt == "f16" {
			w.dinit[i] = uint32(f32ToF16(v)) | uint32(f32ToF16(-v))<<16
		} else {
			w.dinit[i] = math.Float32bits(v)
		}
	}
	w.gd = make([]byte, 4*len(w.dinit))
	putU32s(w.gd, w.dinit)
	w.frag = make([]uint32, 128*steps*4)
	for tid := range 128 {
		for s := range steps {
			for j := range 4 {
				w.frag[(tid*steps+s)*4+j] = wgFragA(w.ab, tid, s, j)
			}
		}
	}
	return w
}

// check compares thread outputs with the reference: value v of thread t
// is D[16*(t/32) + (t%32)/4 + 8*((v/2)%2)][8*(v/4) + 2*(t%4) + v%2]
// (CUTLASS CLayout_64xN); f16 packs values 2j, 2j+1 in register j.
func (c wgCase) check(t *testing.T, w wgData, got []uint32) {
	t.Helper()
	nd := c.nd()
	per := 1
	if c.dt == "f16" {
		per = 2
	}
	for tid := range 128 {
		for v := range nd * per {
			m := 16*(tid/32) + tid%32/4 + 8*(v/2%2)
			n := 8*(v/4) + 2*(tid%4) + v%2
			reg := got[tid*nd+v/per]
			init := w.dinit[tid*nd+v/per]
			var g, d0 float64
			if per == 2 {
				h := uint16(reg >> (16 * (v % 2)))
				g, d0 = float64(f16ToF32(h)), float64(f16ToF32(uint16(init>>(16*(v%2)))))
			} else {
				g, d0 = float64(math.Float32frombits(reg)), float64(math.Float32frombits(init))
			}
			var want, mag float64
			if c.scaleD {
				want, mag = d0, math.Abs(d0)
			}
			for k := range w.av[m] {
				p := w.av[m][k] * w.bv[n][k]
				if c.negA != c.negB {
					p = -p
				}
				want += p
				mag += math.Abs(p)
			}
			tol := 1e-6*mag + 1e-30
			if per == 2 {
				tol = 1e-3*mag + 1e-3
			}
			if math.Abs(g-want) > tol {
				t.Fatalf("thread %d value %d: D[%d][%d] = %g, want %g", tid, v, m, n, g, want)
			}
		}
	}
}

func runWG(t *testing.T, c wgCase, fence bool, issued, waited string, block int) ([]uint32, error) {
	t.Helper()
	w := c.data(rand.New(rand.NewPCG(9, uint64(c.n*10+c.swz))))
	d := NewDevice()
	up := func(b []byte) uint64 {
		p, buf := devBuf(t, d, len(b))
		copy(buf, b)
		return p
	}
	fb := make([]byte, 4*len(w.frag))
	putU32s(fb, w.frag)
	mod, err := d.Load([]byte(sm90Header + c.ptx(fence, issued, waited)))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(mod.Unload)
	out, ob := devBuf(t, d, len(w.gd))
	err = launch(t, d, mod, "wg", Dim{1, 1, 1}, Dim{uint32(block), 1, 1}, 0,
		params(out, up(w.ga), up(w.gb), up(w.gd), up(fb), wgDescHi(c.swz), wgDescHi(c.swz)))
	if err == nil && issued == "" && waited == "" {
		c.check(t, w, u32s(ob))
	}
	return u32s(ob), err
}

// TestWgmma runs wgmma.mma_async forms over a K row of the swizzle (four
// MMAs without swizzle) and compares D with a float64 reference.
func TestWgmma(t *testing.T) {
	for _, c := range []wgCase{
		{name: "e4m3 N128 128B", dt: "f32", at: "e4m3", bt: "e4m3", a: kindE4M3, b: kindE4M3, n: 128, swz: 128},
		{name: "e4m3 x e5m2 N8 64B A regs", dt: "f32", at: "e4m3", bt: "e5m2", a: kindE4M3, b: kindE5M2, n: 8, swz: 64, aRegs: true, scaleD: true},
		{name: "e5m2 N256 32B -A", dt: "f32", at: "e5m2", bt: "e5m2", a: kindE5M2, b: kindE5M2, n: 256, swz: 32, negA: true, scaleD: true},
		{name: "bf16 N256 128B A regs", dt: "f32", at: "bf16", bt: "bf16", a: kindBF16, b: kindBF16, n: 256, swz: 128, aRegs: true},
		{name: "bf16 N32 interleaved -B", dt: "f32", at: "bf16", bt: "bf16", a: kindBF16, b: kindBF16, n: 32, swz: 0, negB: true, scaleD: true},
		{name: "bf16 N64 64B", dt: "f32", at: "bf16", bt: "bf16", a: kindBF16, b: kindBF16, n: 64, swz: 64},
		{name: "f16 to f16 N64 128B", dt: "f16", at: "f16", bt: "f16", a: kindF16, b: kindF16, n: 64, swz: 128, scaleD: true},
		{name: "f16 N24 32B A regs", dt: "f32", at: "f16", bt: "f16", a: kindF16, b: kindF16, n: 24, swz: 32, aRegs: true, scaleD: true},
		{name: "e4m3 N96 interleaved A regs", dt: "f32", at: "e4m3", bt: "e4m3", a: kindE4M3, b: kindE4M3, n: 96, swz: 0, aRegs: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := runWG(t, c, true, "", "", 128); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWgmmaAsync: the accumulators read as wgPoison until the wait that
// completes the group, and what the ISA leaves undefined fails the launch.
func TestWgmmaAsync(t *testing.T) {
	e4 := wgCase{dt: "f32", at: "e4m3", bt: "e4m3", a: kindE4M3, b: kindE4M3, n: 16, swz: 128}
	regs := e4
	regs.aRegs = true
	// Lanes 1..31 dawdle before the wait; lane 0 of warp w then overwrites A
	// row 16w, which only its own warp reads: fine once the whole warp waited.
	dawdle := `
	and.b32 %r20, %r1, 31;
	setp.eq.u32 %p5, %r20, 0;
	mov.u32 %r21, 0;
DLY:
	@%p5 bra DLYD;
	add.u32 %r21, %r21, 1;
	setp.lt.u32 %p6, %r21, 20000;
	@%p6 bra DLY;
DLYD:
`
	release := `
	@!%p5 bra WD;
	shr.u32 %r22, %r1, 5;
	mul.lo.u32 %r22, %r22, 2048;
	add.u32 %r22, %r22, %r3;
	mov.u32 %r23, 0xdeadbeef;
	st.shared.u32 [%r22], %r23;
WD:
`
	for _, tc := range []struct {
		name           string
		c              wgCase
		fence          bool
		issued, waited string
		block          int
		want           string // error text; "" passes
		poison         bool   // out[0] and out[1] hold wgPoison
	}{
		{name: "poisoned until waited", c: e4, fence: true, issued: "\tmov.b32 %r20, %d0;\n\twgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 1;\n\tmov.b32 %r21, %d0;\n",
			waited: "\tst.global.b32 [%rd30], %r20;\n\tst.global.b32 [%rd30+4], %r21;\n\tret;\n", poison: true},
		{name: "operands released after the warp's wait", c: e4, fence: true, issued: dawdle, waited: release},
		{name: "accumulator written", c: e4, fence: true, issued: "\tmov.b32 %d3, 0;\n", want: "accumulator register was written"},
		{name: "A register written", c: regs, fence: true, issued: "\tmov.b32 %a0, 0;\n", want: "A register was written"},
		{name: "B overwritten in flight", c: e4, fence: true, issued: "\tst.shared.u32 [%r4], %r1;\n", want: "operand B (row 0, K byte "},
		{name: "A overwritten in flight", c: e4, fence: true, issued: "\tst.shared.u32 [%r3+16], %r1;\n", want: "operand A (row 0, K byte 1"},
		{name: "no fence", c: e4, fence: false, want: "without a wgmma.fence"},
		{name: "half a warpgroup", c: e4, fence: true, block: 64, want: "warpgroup is not complete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			block := tc.block
			if block == 0 {
				block = 128
			}
			out, err := runWG(t, tc.c, tc.fence, tc.issued, tc.waited, block)
			switch {
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("launch error %v, want one naming %q", err, tc.want)
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.poison && (out[0] != wgPoison || out[1] != wgPoison):
				t.Fatalf("accumulator read %#x before and %#x after wait_group 1, want %#x (in flight)", out[0], out[1], uint32(wgPoison))
			}
		})
	}
}

// TestWgmmaForms: malformed forms fail to load; valid forms the emulator
// does not run load and fail when reached, naming the form.
func TestWgmmaForms(t *testing.T) {
	d8 := "{%f1, %f2, %f3, %f4}"
	for _, tc := range []struct {
		name, inst string
		atLoad     bool
		want       string
	}{
		{"N not a multiple of 8", "wgmma.mma_async.sync.aligned.m64n12k16.f32.bf16.bf16 {%f1, %f2, %f3, %f4, %f5, %f6}, %rd1, %rd1, 1, 1, 1, 0, 0;", true, "N=12"},
		{"k32 for bf16", "wgmma.mma_async.sync.aligned.m64n8k32.f32.bf16.bf16 " + d8 + ", %rd1, %rd1, 1, 1, 1, 0, 0;", true, "k32 with .bf16.bf16"},
		{"accumulator count", "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 " + d8 + ", %rd1, %rd1, 1, 1, 1;", true, "needs 8 accumulator registers"},
		{"f16 D over bf16", "wgmma.mma_async.sync.aligned.m64n8k16.f16.bf16.bf16 {%f1, %f2}, %rd1, %rd1, 1, 1, 1, 0, 0;", true, "D .f16 with .bf16"},
		{"imm-scale 2", "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 " + d8 + ", %rd1, %rd1, 1, 2, 1;", true, "imm-scale 2"},
		{"missing imm-trans", "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 " + d8 + ", %rd1, %rd1, 1, 1, 1;", true, "takes 8 operands"},
		{"transposed B", "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 " + d8 + ", %rd1, %rd1, 1, 1, 1, 0, 1;", false, "transposed"},
		{"tf32", "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 " + d8 + ", %rd1, %rd1, 1, 1, 1;", false, "tf32"},
		{"wait_group count in a register", "wgmma.wait_group.sync.aligned %r1;", true, "immediate count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := sm90Header + ".visible .entry k()\n{\n\t.reg .b32 %r<4>;\n\t.reg .f32 %f<10>;\n\t.reg .b64 %rd<2>;\n" +
				"\twgmma.fence.sync.aligned;\n\t" + tc.inst + "\n\tret;\n}\n"
			d := NewDevice()
			m, err := d.Load([]byte(src))
			if err == nil {
				t.Cleanup(m.Unload)
				if tc.atLoad {
					t.Fatalf("Load succeeded, want an error naming %q", tc.want)
				}
				err = launch(t, d, m, "k", Dim{1, 1, 1}, Dim{128, 1, 1}, 0, nil)
			} else if !tc.atLoad {
				t.Fatalf("Load: %v, want the form to load", err)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}
