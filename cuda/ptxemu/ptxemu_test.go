package ptxemu

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/internal/testctx"
)

// These tests run hand-written PTX (in the style NVRTC emits) on the
// emulator and check the results against values computed in Go. Output
// buffers are poisoned with 0xff first, so a kernel that writes nothing fails.

const ptxHeader = ".version 8.4\n.target sm_80\n.address_size 64\n\n"

func loadPTX(t *testing.T, d *Device, body string) *Module {
	t.Helper()
	m, err := d.Load([]byte(ptxHeader + body))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(m.Unload)
	return m
}

// devBuf allocates n bytes of device memory poisoned with 0xff and returns
// its address and the host view that aliases it.
func devBuf(t *testing.T, d *Device, n int) (uint64, []byte) {
	t.Helper()
	p, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Bytes(p, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0xff
	}
	return p, b
}

// params packs kernel parameters (uint64 and uint32) at their natural alignment.
func params(vals ...any) []byte {
	var b []byte
	for _, v := range vals {
		switch v := v.(type) {
		case uint64:
			for len(b)%8 != 0 {
				b = append(b, 0)
			}
			b = binary.LittleEndian.AppendUint64(b, v)
		case uint32:
			for len(b)%4 != 0 {
				b = append(b, 0)
			}
			b = binary.LittleEndian.AppendUint32(b, v)
		default:
			panic("params: unsupported type")
		}
	}
	return b
}

// launch runs entry name and returns its error; it fails the test if the
// launch has not returned before the test's deadline.
func launch(t *testing.T, d *Device, m *Module, name string, grid, block Dim, dyn int, p []byte) error {
	t.Helper()
	f, err := m.Function(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testctx.New(t)
	done := make(chan error, 1)
	go func() { done <- d.Launch(f, grid, block, dyn, p) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		t.Fatalf("%s: launch did not return: %v", name, context.Cause(ctx))
		return nil
	}
}

func mustLaunch(t *testing.T, d *Device, m *Module, name string, grid, block Dim, dyn int, p []byte) {
	t.Helper()
	if err := launch(t, d, m, name, grid, block, dyn, p); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func u32s(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

func putU32s(b []byte, v []uint32) {
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
}

func asLaunchError(t *testing.T, err error) *LaunchError {
	t.Helper()
	var le *LaunchError
	if !errors.As(err, &le) {
		t.Fatalf("error %v (%T), want a *LaunchError", err, err)
	}
	return le
}

// Integer and float arithmetic, conversions

const arithPTX = `
.visible .entry arith(
	.param .u64 arith_param_0,
	.param .u64 arith_param_1,
	.param .u64 arith_param_2
)
{
	.reg .pred 	%p<3>;
	.reg .b16 	%rs<2>;
	.reg .b32 	%r<40>;
	.reg .f32 	%f<12>;
	.reg .b64 	%rd<14>;

	ld.param.u64 	%rd1, [arith_param_0];
	ld.param.u64 	%rd2, [arith_param_1];
	ld.param.u64 	%rd3, [arith_param_2];
	cvta.to.global.u64 	%rd4, %rd1;
	cvta.to.global.u64 	%rd5, %rd2;
	cvta.to.global.u64 	%rd6, %rd3;
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd7, %r1, 8;
	add.s64 	%rd8, %rd4, %rd7;
	ld.global.u32 	%r2, [%rd8];
	ld.global.u32 	%r3, [%rd8+4];
	mul.lo.s32 	%r4, %r1, 3;
	mul.wide.u32 	%rd9, %r4, 4;
	add.s64 	%rd10, %rd5, %rd9;
	ld.global.f32 	%f1, [%rd10];
	ld.global.f32 	%f2, [%rd10+4];
	ld.global.f32 	%f3, [%rd10+8];
	mul.wide.u32 	%rd11, %r1, 96;
	add.s64 	%rd12, %rd6, %rd11;
	add.s32 	%r5, %r2, %r3;
	st.global.u32 	[%rd12], %r5;
	mad.lo.s32 	%r6, %r2, %r3, 7;
	st.global.u32 	[%rd12+4], %r6;
	mul.wide.s32 	%rd13, %r2, %r3;
	st.global.u64 	[%rd12+8], %rd13;
	shr.s32 	%r7, %r2, 3;
	st.global.u32 	[%rd12+16], %r7;
	bfe.u32 	%r8, %r2, 4, 8;
	st.global.u32 	[%rd12+20], %r8;
	bfe.s32 	%r9, %r2, 4, 8;
	st.global.u32 	[%rd12+24], %r9;
	bfe.s32 	%r10, %r2, 28, 8;
	st.global.u32 	[%rd12+28], %r10;
	prmt.b32 	%r11, %r2, %r3, 0x5140;
	st.global.u32 	[%rd12+32], %r11;
	prmt.b32 	%r12, %r2, %r3, 36657;
	st.global.u32 	[%rd12+36], %r12;
	setp.lt.s32 	%p1, %r2, %r3;
	selp.b32 	%r13, %r2, %r3, %p1;
	st.global.u32 	[%rd12+40], %r13;
	setp.gt.u32 	%p2, %r2, %r3;
	selp.u32 	%r14, 1, 0, %p2;
	st.global.u32 	[%rd12+44], %r14;
	fma.rn.f32 	%f4, %f1, %f2, %f3;
	st.global.f32 	[%rd12+48], %f4;
	cvt.rn.f16.f32 	%rs1, %f1;
	cvt.u32.u16 	%r15, %rs1;
	st.global.u32 	[%rd12+52], %r15;
	cvt.f32.f16 	%f5, %rs1;
	st.global.f32 	[%rd12+56], %f5;
	cvt.rzi.s32.f32 	%r16, %f1;
	st.global.u32 	[%rd12+60], %r16;
	min.f32 	%f6, %f1, %f2;
	st.global.f32 	[%rd12+64], %f6;
	max.f32 	%f7, %f1, %f2;
	st.global.f32 	[%rd12+68], %f7;
	cvt.rn.f32.s32 	%f8, %r2;
	st.global.f32 	[%rd12+72], %f8;
	mul.hi.u32 	%r17, %r2, %r3;
	st.global.u32 	[%rd12+76], %r17;
	cvt.rni.u32.f32 	%r18, %f2;
	st.global.u32 	[%rd12+80], %r18;
	ret;
}
`

// fmaRef is fma.rn.f32: the exact x*y+z rounded once to float32.
func fmaRef(x, y, z float32) float32 {
	if x != x || y != y || z != z || math.IsInf(float64(x), 0) || math.IsInf(float64(y), 0) || math.IsInf(float64(z), 0) {
		return float32(float64(x)*float64(y) + float64(z)) // no exact value to round
	}
	p := new(big.Float).SetPrec(1000).SetFloat64(float64(x))
	p.Mul(p, new(big.Float).SetFloat64(float64(y)))
	p.Add(p, new(big.Float).SetFloat64(float64(z)))
	f, _ := p.Float32()
	return f
}

func fminRef(x, y float32) float32 {
	switch {
	case x != x:
		return y
	case y != y:
		return x
	case y < x:
		return y
	}
	return x
}

func fmaxRef(x, y float32) float32 {
	switch {
	case x != x:
		return y
	case y != y:
		return x
	case y > x:
		return y
	}
	return x
}

// cvtIntRef is cvt with an integer rounding to a saturated integer range.
func cvtIntRef(x float64, round func(float64) float64, lo, hi float64) uint32 {
	switch r := round(x); {
	case x != x:
		return 0
	case r < lo:
		return uint32(int64(lo))
	case r > hi:
		return uint32(int64(hi))
	default:
		return uint32(int64(r))
	}
}

func prmtRef(a, b, c uint32) uint32 {
	src := [8]byte{byte(a), byte(a >> 8), byte(a >> 16), byte(a >> 24), byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)}
	var r uint32
	for i := 0; i < 4; i++ {
		sel := c >> (4 * i) & 15
		v := src[sel&7]
		if sel&8 != 0 {
			v = byte(int8(v) >> 7)
		}
		r |= uint32(v) << (8 * i)
	}
	return r
}

func TestArith(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, arithPTX)
	const n = 32
	rng := rand.New(rand.NewPCG(1, 2))
	ints := make([]uint32, 2*n)
	for i := range ints {
		ints[i] = rng.Uint32()
	}
	copy(ints, []uint32{5, 7, 0xfffffff0, 3, 0x80000000, 0xffffffff, 16777217, 0x7fffffff, 0x12345678, 0x9abcdef0})
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	fmaY := float32(math.Ldexp(16773121, -48)) // (1+2^-12) * fmaY = 2^-24 + 2^-60
	fl := make([]float32, 3*n)
	for i := range fl {
		fl[i] = float32(rng.NormFloat64() * 100)
	}
	for i, v := range [][3]float32{
		{1.5, 2.5, 0.25},
		{3e9, -0.5, 1},         // rzi saturates high; rni of -0.5 -> 0
		{-3e9, 4294967296, 1},  // saturates low; rni saturates to u32 max
		{nan, 7, 1},            // NaN -> 0, min/max pick 7
		{7, nan, 1},            // NaN -> 0 for rni
		{65520, 2.5, 0},        // f16 overflow to inf; rni ties to even
		{65519, 3.5, 0},        // rounds down to 65504
		{1e-8, -2.7, inf},      // f16 underflow
		{-2.98e-8, 0.1, 0},     // f16 subnormal rounding
		{1 + 0x1p-12, fmaY, 1}, // fma.rn: exact 1 + 2^-24 + 2^-60 rounds up (double rounding gives 1)
		{-1 - 0x1p-12, fmaY, -1},
		{inf, -inf, 0},
	} {
		copy(fl[3*i:], v[:])
	}
	pi, bi := devBuf(t, d, 4*len(ints))
	putU32s(bi, ints)
	pf, bf := devBuf(t, d, 4*len(fl))
	for i, v := range fl {
		binary.LittleEndian.PutUint32(bf[4*i:], math.Float32bits(v))
	}
	po, bo := devBuf(t, d, 96*n)
	mustLaunch(t, d, m, "arith", Dim{1, 1, 1}, Dim{n, 1, 1}, 0, params(pi, pf, po))
	out := u32s(bo)
	f32 := math.Float32bits
	for i := 0; i < n; i++ {
		a, b := ints[2*i], ints[2*i+1]
		x, y, z := fl[3*i], fl[3*i+1], fl[3*i+2]
		wide := uint64(int64(int32(a)) * int64(int32(b)))
		h := refF16(x)
		// kind f: a float32 and h: an f16, where any NaN matches a NaN
		want := []struct {
			name string
			v    uint32
			kind byte
		}{
			{"add.s32", a + b, 'i'},
			{"mad.lo.s32", a*b + 7, 'i'},
			{"mul.wide.s32 lo", uint32(wide), 'i'},
			{"mul.wide.s32 hi", uint32(wide >> 32), 'i'},
			{"shr.s32", uint32(int32(a) >> 3), 'i'},
			{"bfe.u32 4,8", a >> 4 & 0xff, 'i'},
			{"bfe.s32 4,8", uint32(int32(a<<20) >> 24), 'i'},
			{"bfe.s32 28,8", uint32(int32(a) >> 28), 'i'},
			{"prmt 0x5140", prmtRef(a, b, 0x5140), 'i'},
			{"prmt 0x8f31", prmtRef(a, b, 0x8f31), 'i'},
			{"selp min", uint32(min(int32(a), int32(b))), 'i'},
			{"setp.gt.u32", map[bool]uint32{true: 1, false: 0}[a > b], 'i'},
			{"fma.rn.f32", f32(fmaRef(x, y, z)), 'f'},
			{"cvt.rn.f16.f32", uint32(h), 'h'},
			{"cvt.f32.f16", f32(refF16Value(h)), 'f'},
			{"cvt.rzi.s32.f32", cvtIntRef(float64(x), math.Trunc, math.MinInt32, math.MaxInt32), 'i'},
			{"min.f32", f32(fminRef(x, y)), 'f'},
			{"max.f32", f32(fmaxRef(x, y)), 'f'},
			{"cvt.rn.f32.s32", f32(float32(int32(a))), 'i'},
			{"mul.hi.u32", uint32(uint64(a) * uint64(b) >> 32), 'i'},
			{"cvt.rni.u32.f32", cvtIntRef(float64(y), math.RoundToEven, 0, math.MaxUint32), 'i'},
		}
		for j, w := range want {
			got := out[24*i+j]
			nan := func(v uint32) bool { return v&0x7fffffff > 0x7f800000 }
			if w.kind == 'h' {
				nan = func(v uint32) bool { return v&0x7fff > 0x7c00 && v <= 0xffff }
			}
			if w.kind != 'i' && nan(w.v) && nan(got) {
				continue
			}
			if got != w.v {
				t.Errorf("thread %d: %s (a=%#x b=%#x x=%v y=%v z=%v) = %#x, want %#x", i, w.name, a, b, x, y, z, got, w.v)
			}
		}
		for j := len(want); j < 24; j++ {
			if out[24*i+j] != 0xffffffff {
				t.Errorf("thread %d: slot %d written", i, j)
			}
		}
	}
}

// halfround computes fma.rn.f16, fma.rn.f16x2 (both lanes) and
// cvt.rn.f16.f64 per thread; each must round the exact value once.
const halfRoundPTX = `
.visible .entry halfround(
	.param .u64 halfround_param_0,
	.param .u64 halfround_param_1
)
{
	.reg .b16 	%rs<10>;
	.reg .b32 	%r<6>;
	.reg .f64 	%fd<2>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [halfround_param_0];
	ld.param.u64 	%rd2, [halfround_param_1];
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd3, %r1, 16;
	add.s64 	%rd4, %rd1, %rd3;
	ld.global.v4.u16 	{%rs1, %rs2, %rs3, %rs4}, [%rd4];
	ld.global.f64 	%fd1, [%rd4+8];
	fma.rn.f16 	%rs5, %rs1, %rs2, %rs3;
	mov.b32 	%r2, {%rs1, %rs1};
	mov.b32 	%r3, {%rs2, %rs2};
	mov.b32 	%r4, {%rs3, %rs3};
	fma.rn.f16x2 	%r5, %r2, %r3, %r4;
	mov.b32 	{%rs6, %rs7}, %r5;
	cvt.rn.f16.f64 	%rs8, %fd1;
	mul.wide.u32 	%rd5, %r1, 8;
	add.s64 	%rd6, %rd2, %rd5;
	st.global.v4.u16 	[%rd6], {%rs5, %rs6, %rs7, %rs8};
	ret;
}
`

func TestHalfRounding(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, halfRoundPTX)
	// x*y+z exactly, and the f64 to convert; want the f16 results.
	cases := []struct {
		x, y, z  float32
		v        float64
		fma, cvt uint16
	}{
		// 2^-11(1+2^-10) * (1-2^-10) + (1+2^-10) = 1 + 2^-10 + 2^-11 - 2^-31:
		// just below the tie, so 0x3c01 (rounding via f32 hits the tie: 0x3c02)
		{0x1p-11 * (1 + 0x1p-10), 1 - 0x1p-10, 1 + 0x1p-10, 1 + 0x1p-11 + 0x1p-40, 0x3c01, 0x3c01},
		{0x1p-11, 1, 1, 1 + 0x1p-11, 0x3c00, 0x3c00},                   // ties to even
		{0x1p-11, 1, 1 + 0x1p-10, 1 + 3*0x1p-11, 0x3c02, 0x3c02},       // ties to even
		{-2, 3, 0.5, -(1 + 0x1p-11 - 0x1p-40), 0xc580, 0xbc00},         // exact; just below the tie
		{256, 256, 0, 65520 - 0x1p-30, 0x7c00, 0x7bff},                 // overflow; just below the overflow tie
		{1.5 * 0x1p-14, 0x1p-10, 0, 0x1p-25 + 0x1p-60, 0x0002, 0x0001}, // subnormal ties
	}
	pi, bi := devBuf(t, d, 16*len(cases))
	for i, c := range cases {
		for j, h := range []uint16{refF16(c.x), refF16(c.y), refF16(c.z)} {
			binary.LittleEndian.PutUint16(bi[16*i+2*j:], h)
		}
		binary.LittleEndian.PutUint64(bi[16*i+8:], math.Float64bits(c.v))
	}
	po, bo := devBuf(t, d, 8*len(cases))
	mustLaunch(t, d, m, "halfround", Dim{1, 1, 1}, Dim{uint32(len(cases)), 1, 1}, 0, params(pi, po))
	for i, c := range cases {
		for j, name := range []string{"fma.rn.f16", "fma.rn.f16x2 lo", "fma.rn.f16x2 hi", "cvt.rn.f16.f64"} {
			want := c.fma
			if j == 3 {
				want = c.cvt
			}
			if got := binary.LittleEndian.Uint16(bo[8*i+2*j:]); got != want {
				t.Errorf("case %d: %s = %#04x, want %#04x", i, name, got, want)
			}
		}
	}
}

// fpmods checks rounding and modifier corner cases of the PTX ISA, one
// thread, one word each: directed rounding overflows to the largest finite
// value (.rz) and rounds subnormal results in its direction; NaN operands and
// sqrt of a negative give NaN; +0 + -0 is -0 rounding down; .ftz on directed
// rounding; max.NaN; max.relu.s32; .relu keeps a NaN; mad.hi.sat.s32;
// add.ftz.f16.
const fpModsPTX = `
.visible .entry fpmods(
	.param .u64 fpmods_param_0
)
{
	.reg .b16 	%rs<8>;
	.reg .b32 	%r<8>;
	.reg .f32 	%f<16>;
	.reg .b64 	%rd<2>;

	ld.param.u64 	%rd1, [fpmods_param_0];
	add.rz.f32 	%f1, 0f7F7FFFFF, 0f7F7FFFFF;
	st.global.f32 	[%rd1], %f1;
	add.rp.f32 	%f2, 0f7F7FFFFF, 0f7F7FFFFF;
	st.global.f32 	[%rd1+4], %f2;
	add.rz.f32 	%f3, 0fFF7FFFFF, 0fFF7FFFFF;
	st.global.f32 	[%rd1+8], %f3;
	mul.rp.f32 	%f4, 0f0D800001, 0f2B800000;
	st.global.f32 	[%rd1+12], %f4;
	add.rm.f32 	%f5, 0f00000000, 0f80000000;
	st.global.f32 	[%rd1+16], %f5;
	add.rz.f32 	%f6, 0f7FC00000, 0f3F800000;
	st.global.f32 	[%rd1+20], %f6;
	sqrt.rz.f32 	%f7, 0fBF800000;
	st.global.f32 	[%rd1+24], %f7;
	add.rz.ftz.f32 	%f8, 0f00000001, 0f00000000;
	st.global.f32 	[%rd1+28], %f8;
	div.rp.f32 	%f9, 0f3F800000, 0f40400000;
	st.global.f32 	[%rd1+32], %f9;
	max.NaN.f32 	%f10, 0f7FC00000, 0f3F800000;
	st.global.f32 	[%rd1+36], %f10;
	min.f32 	%f11, 0f7FC00000, 0f3F800000;
	st.global.f32 	[%rd1+40], %f11;
	max.relu.s32 	%r1, -5, -7;
	st.global.u32 	[%rd1+44], %r1;
	mov.b16 	%rs1, 0x7E00;
	mov.b16 	%rs2, 0x3C00;
	mov.b16 	%rs3, 0x0000;
	fma.rn.relu.f16 	%rs4, %rs1, %rs2, %rs3;
	cvt.u32.u16 	%r2, %rs4;
	st.global.u32 	[%rd1+48], %r2;
	mad.hi.sat.s32 	%r3, 2147483647, 2147483647, 2147483647;
	st.global.u32 	[%rd1+52], %r3;
	mov.b16 	%rs5, 0xBC00;
	fma.rn.relu.f16 	%rs6, %rs5, %rs2, %rs3;
	cvt.u32.u16 	%r4, %rs6;
	st.global.u32 	[%rd1+56], %r4;
	mov.b16 	%rs7, 0x0001;
	add.ftz.f16 	%rs7, %rs7, %rs3;
	cvt.u32.u16 	%r5, %rs7;
	st.global.u32 	[%rd1+60], %r5;
	ret;
}
`

func TestFloatModifiers(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, fpModsPTX)
	po, bo := devBuf(t, d, 64)
	mustLaunch(t, d, m, "fpmods", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(po))
	const nan32, nan16 = 1 << 32, 1 << 33 // any f32 / f16 NaN
	for i, w := range []struct {
		name string
		v    uint64
	}{
		{"add.rz.f32 max+max", 0x7f7fffff},
		{"add.rp.f32 max+max", 0x7f800000},
		{"add.rz.f32 -max-max", 0xff7fffff},
		{"mul.rp.f32 subnormal result", 0x00000201},
		{"add.rm.f32 +0 + -0", 0x80000000},
		{"add.rz.f32 NaN+1", nan32},
		{"sqrt.rz.f32 -1", nan32},
		{"add.rz.ftz.f32 subnormal", 0},
		{"div.rp.f32 1/3", 0x3eaaaaab},
		{"max.NaN.f32 NaN, 1", nan32},
		{"min.f32 NaN, 1", 0x3f800000},
		{"max.relu.s32 -5, -7", 0},
		{"fma.rn.relu.f16 NaN", nan16},
		{"mad.hi.sat.s32", 0x7fffffff},
		{"fma.rn.relu.f16 -1", 0},
		{"add.ftz.f16 subnormal", 0},
	} {
		got := binary.LittleEndian.Uint32(bo[4*i:])
		switch w.v {
		case nan32:
			if got&0x7fffffff <= 0x7f800000 {
				t.Errorf("%s = %#x, want a NaN", w.name, got)
			}
		case nan16:
			if got&0x7fff <= 0x7c00 || got > 0xffff {
				t.Errorf("%s = %#x, want an f16 NaN", w.name, got)
			}
		default:
			if uint64(got) != w.v {
				t.Errorf("%s = %#x, want %#x", w.name, got, w.v)
			}
		}
	}
}
