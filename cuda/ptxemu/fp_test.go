package ptxemu

import (
	"encoding/binary"
	"math"
	"sort"
	"testing"
)

// Conversions of f16, bf16 and e4m3 against brute-force references

// refF16Value decodes an f16 bit pattern from the format's definition.
func refF16Value(h uint16) float32 {
	s := 1.0
	if h&0x8000 != 0 {
		s = -1
	}
	e, m := int(h>>10&31), float64(h&1023)
	switch {
	case e == 31 && m == 0:
		return float32(s * math.Inf(1))
	case e == 31:
		return float32(math.NaN())
	case e == 0:
		return float32(s * m * math.Exp2(-24))
	}
	return float32(s * (1024 + m) * math.Exp2(float64(e-25)))
}

// nearestEven picks, among the sorted non-negative codes' values, the one
// nearest to x >= 0, ties to the even code. It returns -1 above the last
// value's upper midpoint (given by top).
func nearestEven(vals []float64, top, x float64) int {
	if x >= top {
		return -1
	}
	i := sort.SearchFloat64s(vals, x)
	if i == len(vals) {
		return i - 1
	}
	if i == 0 || vals[i] == x {
		return i
	}
	lo, hi := x-vals[i-1], vals[i]-x
	switch {
	case lo < hi:
		return i - 1
	case hi < lo:
		return i
	case i%2 == 0:
		return i
	}
	return i - 1
}

var f16Pos = func() []float64 {
	v := make([]float64, 0x7c00)
	for i := range v {
		v[i] = float64(refF16Value(uint16(i)))
	}
	return v
}()

// refF16 is cvt.rn.f16.f32 by search over all f16 values.
func refF16(x float32) uint16 {
	if x != x {
		return 0x7e00
	}
	sign := uint16(0)
	if math.Signbit(float64(x)) {
		sign = 0x8000
	}
	i := nearestEven(f16Pos, 65520, math.Abs(float64(x)))
	if i < 0 {
		return sign | 0x7c00
	}
	return sign | uint16(i)
}

var e4m3Pos = func() []float64 {
	v := make([]float64, 0x7f)
	for i := range v {
		e, m := i>>3, float64(i&7)
		if e == 0 {
			v[i] = m * math.Exp2(-9)
		} else {
			v[i] = (8 + m) * math.Exp2(float64(e-10))
		}
	}
	return v
}()

// refE4M3 is cvt.rn.satfinite.e4m3x2.f32 for one value.
func refE4M3(x float32) uint8 {
	if x != x {
		return 0x7f
	}
	sign := uint8(0)
	if math.Signbit(float64(x)) {
		sign = 0x80
	}
	// satfinite: everything past 448, infinities included, saturates
	i := nearestEven(e4m3Pos, math.Inf(1), min(math.Abs(float64(x)), 1e300))
	return sign | uint8(i)
}

func TestF16Conversions(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		want := refF16Value(uint16(h))
		got := f16ToF32(uint16(h))
		if want != want {
			if got == got || f32ToF16(got)&0x7fff <= 0x7c00 {
				t.Errorf("f16 NaN %#04x -> %v -> %#04x", h, got, f32ToF16(got))
			}
			continue
		}
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("f16ToF32(%#04x) = %v, want %v", h, got, want)
		}
		if back := f32ToF16(got); back != uint16(h) {
			t.Fatalf("f32ToF16(f16ToF32(%#04x)) = %#04x", h, back)
		}
	}
	// every midpoint between neighbours, and a float32 ulp either side
	for i := 0; i+1 < len(f16Pos); i++ {
		mid := float32((f16Pos[i] + f16Pos[i+1]) / 2)
		for _, x := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9), -mid} {
			if got, want := f32ToF16(x), refF16(x); got != want {
				t.Fatalf("f32ToF16(%v) = %#04x, want %#04x", x, got, want)
			}
		}
	}
	for _, x := range []float32{65504, 65519.996, 65520, 1e9, float32(math.Inf(-1)), 0x1p-25, 0x1p-25 + 0x1p-40, 0x1p-26, float32(math.Copysign(0, -1))} {
		if got, want := f32ToF16(x), refF16(x); got != want {
			t.Errorf("f32ToF16(%v) = %#04x, want %#04x", x, got, want)
		}
	}
}

func TestBF16Conversions(t *testing.T) {
	for _, tc := range []struct {
		x    float32
		want uint16
	}{
		{1, 0x3f80},
		{-1.5, 0xbfc0},
		{1 + 0x1p-8, 0x3f80},           // tie, to even (down)
		{1 + 3*0x1p-8, 0x3f82},         // tie, to even (up)
		{1 + 0x1p-8 + 0x1p-23, 0x3f81}, // just above the tie
		{0x1p-134, 0x0000},             // half the smallest subnormal: tie to zero
		{3 * 0x1p-134, 0x0002},         // 1.5 subnormal ulps: tie to even (up)
		{math.MaxFloat32, 0x7f80},      // rounds past the largest finite to inf
		{float32(math.Inf(-1)), 0xff80},
	} {
		if got := f32ToBF16(tc.x); got != tc.want {
			t.Errorf("f32ToBF16(%v) = %#04x, want %#04x", tc.x, got, tc.want)
		}
	}
	if h := f32ToBF16(float32(math.NaN())); h&0x7f80 != 0x7f80 || h&0x7f == 0 {
		t.Errorf("f32ToBF16(NaN) = %#04x, not a NaN", h)
	}
	for _, h := range []uint16{0x3f80, 0x0001, 0x7f7f, 0xc2f7} {
		if got := math.Float32bits(bf16ToF32(h)); got != uint32(h)<<16 {
			t.Errorf("bf16ToF32(%#04x) bits %#08x", h, got)
		}
	}
}

func TestE4M3Conversions(t *testing.T) {
	for c := 0; c < 256; c++ {
		got := e4m3ToF32(uint8(c))
		if c&0x7f == 0x7f {
			if got == got {
				t.Errorf("e4m3ToF32(%#02x) = %v, want NaN", c, got)
			}
			continue
		}
		want := float32(e4m3Pos[c&0x7f])
		if c&0x80 != 0 {
			want = -want
		}
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Errorf("e4m3ToF32(%#02x) = %v, want %v", c, got, want)
		}
		if back := f32ToE4M3(got); back != uint8(c) {
			t.Errorf("f32ToE4M3(%v) = %#02x, want %#02x", got, back, c)
		}
	}
	var xs []float32
	for i := 0; i+1 < len(e4m3Pos); i++ {
		mid := float32((e4m3Pos[i] + e4m3Pos[i+1]) / 2)
		xs = append(xs, mid, -mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9))
	}
	inf := float32(math.Inf(1))
	xs = append(xs, 448, 449, 464, 480, 1e9, inf, -inf, -500, 0x1p-10, 0x1p-10+0x1p-30, 0x1p-11, 0x1p-20, 0, float32(math.Copysign(0, -1)))
	for _, x := range xs {
		if got, want := f32ToE4M3(x), refE4M3(x); got != want {
			t.Errorf("f32ToE4M3(%v) = %#02x, want %#02x", x, got, want)
		}
	}
	if got := f32ToE4M3(float32(math.NaN())); got&0x7f != 0x7f {
		t.Errorf("f32ToE4M3(NaN) = %#02x, want 0x7f", got)
	}
	if refE4M3(1e9) != 0x7e || refE4M3(-inf) != 0xfe {
		t.Error("refE4M3 does not saturate")
	}
}

// cvtedge runs cvt corner cases of the PTX ISA (one thread): NaN to a 64-bit
// integer or from .f64 (1 << (n-1), not 0), signed results sign-extended to
// a wider register, saturation of .s64, directed int-to-float rounding,
// .sat between 64-bit integers, .satfinite and .relu to f16/bf16.
const cvtEdgePTX = `
.visible .entry cvtedge(
	.param .u64 cvtedge_param_0,
	.param .u64 cvtedge_param_1
)
{
	.reg .b16 	%rs<4>;
	.reg .b32 	%r<10>;
	.reg .f32 	%f<10>;
	.reg .f64 	%fd<3>;
	.reg .b64 	%rd<10>;

	ld.param.u64 	%rd1, [cvtedge_param_0];
	ld.param.u64 	%rd2, [cvtedge_param_1];
	ld.global.f64 	%fd1, [%rd1];
	ld.global.f32 	%f1, [%rd1+8];
	ld.global.f32 	%f2, [%rd1+12];
	ld.global.u32 	%r1, [%rd1+16];
	ld.global.u32 	%r2, [%rd1+20];
	ld.global.u32 	%r3, [%rd1+24];
	ld.global.u32 	%r4, [%rd1+28];
	ld.global.u64 	%rd3, [%rd1+32];
	ld.global.f64 	%fd2, [%rd1+40];
	ld.global.f32 	%f3, [%rd1+48];
	ld.global.f32 	%f4, [%rd1+52];
	ld.global.f32 	%f5, [%rd1+56];
	ld.global.f32 	%f6, [%rd1+60];
	cvt.rni.u64.f64 	%rd4, %fd1;
	st.global.u64 	[%rd2], %rd4;
	cvt.rzi.s64.f32 	%rd5, %f1;
	st.global.u64 	[%rd2+8], %rd5;
	cvt.rzi.s32.f64 	%r5, %fd1;
	st.global.u32 	[%rd2+16], %r5;
	cvt.rzi.s32.f32 	%r6, %f1;
	st.global.u32 	[%rd2+24], %r6;
	cvt.s8.s32 	%r7, %r1;
	st.global.u32 	[%rd2+32], %r7;
	cvt.rzi.s8.f32 	%r8, %f2;
	st.global.u32 	[%rd2+40], %r8;
	cvt.rzi.s32.f32 	%rd6, %f2;
	st.global.u64 	[%rd2+48], %rd6;
	cvt.rzi.s64.f64 	%rd7, %fd2;
	st.global.u64 	[%rd2+56], %rd7;
	cvt.rzi.s64.f32 	%rd8, %f6;
	st.global.u64 	[%rd2+64], %rd8;
	cvt.rz.f32.s32 	%f7, %r2;
	st.global.f32 	[%rd2+72], %f7;
	cvt.rm.f32.s32 	%f8, %r3;
	st.global.f32 	[%rd2+80], %f8;
	cvt.rp.f32.u32 	%f9, %r4;
	st.global.f32 	[%rd2+88], %f9;
	cvt.sat.s64.u64 	%rd9, %rd3;
	st.global.u64 	[%rd2+96], %rd9;
	cvt.rn.satfinite.f16.f32 	%rs1, %f3;
	st.global.u16 	[%rd2+104], %rs1;
	cvt.rn.satfinite.f16.f32 	%rs2, %f5;
	st.global.u16 	[%rd2+112], %rs2;
	cvt.rn.relu.f16.f32 	%rs3, %f4;
	st.global.u16 	[%rd2+120], %rs3;
	cvt.rn.relu.bf16x2.f32 	%r9, %f4, %f5;
	st.global.u32 	[%rd2+128], %r9;
	ret;
}
`

func TestCvtEdgeCases(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, cvtEdgePTX)
	pi, bi := devBuf(t, d, 64)
	le := binary.LittleEndian
	f32 := func(off int, v float32) { le.PutUint32(bi[off:], math.Float32bits(v)) }
	le.PutUint64(bi[0:], math.Float64bits(math.NaN()))
	f32(8, float32(math.NaN()))
	f32(12, -5.7)
	le.PutUint32(bi[16:], 0xf0)
	le.PutUint32(bi[20:], 0x7fffffff)
	le.PutUint32(bi[24:], uint32(0xfeffffff)) // -16777217
	le.PutUint32(bi[28:], 16777217)
	le.PutUint64(bi[32:], 1<<63)
	le.PutUint64(bi[40:], math.Float64bits(1e30))
	f32(48, 1e6)
	f32(52, -3)
	f32(56, 2)
	f32(60, -1e30)
	po, bo := devBuf(t, d, 136)
	mustLaunch(t, d, m, "cvtedge", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(pi, po))
	for i, w := range []struct {
		name  string
		v     uint64
		bytes int
	}{
		{"cvt.rni.u64.f64 NaN", 1 << 63, 8},
		{"cvt.rzi.s64.f32 NaN", 1 << 63, 8},
		{"cvt.rzi.s32.f64 NaN", 1 << 31, 4},
		{"cvt.rzi.s32.f32 NaN", 0, 4},
		{"cvt.s8.s32 0xf0 (sign-extended)", 0xfffffff0, 4},
		{"cvt.rzi.s8.f32 -5.7 (sign-extended)", 0xfffffffb, 4},
		{"cvt.rzi.s32.f32 -5.7 to a 64-bit register", 0xfffffffffffffffb, 8},
		{"cvt.rzi.s64.f64 1e30", math.MaxInt64, 8},
		{"cvt.rzi.s64.f32 -1e30", 1 << 63, 8},
		{"cvt.rz.f32.s32 0x7fffffff", 0x4effffff, 4},
		{"cvt.rm.f32.s32 -16777217", 0xcb800001, 4},
		{"cvt.rp.f32.u32 16777217", 0x4b800001, 4},
		{"cvt.sat.s64.u64 2^63", math.MaxInt64, 8},
		{"cvt.rn.satfinite.f16.f32 1e6", 0x7bff, 2},
		{"cvt.rn.satfinite.f16.f32 2", 0x4000, 2},
		{"cvt.rn.relu.f16.f32 -3", 0, 2},
		{"cvt.rn.relu.bf16x2.f32 -3, 2", 0x4000, 4},
	} {
		var got uint64
		for b := w.bytes - 1; b >= 0; b-- {
			got = got<<8 | uint64(bo[8*i+b])
		}
		if got != w.v {
			t.Errorf("%s = %#x, want %#x", w.name, got, w.v)
		}
	}
}

// cvt to and from e4m3x2 (the e4m3x2 type was not recognised, so the
// module failed to load).
const cvtE4M3PTX = `
.visible .entry cvte4m3(
	.param .u64 cvte4m3_param_0,
	.param .u64 cvte4m3_param_1
)
{
	.reg .b16 	%rs<4>;
	.reg .b32 	%r<4>;
	.reg .f32 	%f<4>;
	.reg .b64 	%rd<4>;

	ld.param.u64 	%rd1, [cvte4m3_param_0];
	ld.param.u64 	%rd2, [cvte4m3_param_1];
	ld.global.f32 	%f1, [%rd1];
	ld.global.f32 	%f2, [%rd1+4];
	cvt.rn.satfinite.e4m3x2.f32 	%rs1, %f1, %f2;
	st.global.u16 	[%rd2], %rs1;
	cvt.rn.f16x2.e4m3x2 	%r1, %rs1;
	st.global.u32 	[%rd2+4], %r1;
	cvt.rn.satfinite.relu.e4m3x2.f32 	%rs2, %f1, %f2;
	st.global.u16 	[%rd2+8], %rs2;
	ret;
}
`

func TestCvtE4M3x2(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, cvtE4M3PTX)
	pi, bi := devBuf(t, d, 8)
	binary.LittleEndian.PutUint32(bi[0:], math.Float32bits(1e6)) // saturates to 448
	binary.LittleEndian.PutUint32(bi[4:], math.Float32bits(-3))
	po, bo := devBuf(t, d, 12)
	mustLaunch(t, d, m, "cvte4m3", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(pi, po))
	le := binary.LittleEndian
	if got := le.Uint16(bo[0:]); got != 0x7ec4 {
		t.Errorf("cvt.rn.satfinite.e4m3x2.f32 1e6, -3 = %#04x, want 0x7ec4", got)
	}
	if got := le.Uint32(bo[4:]); got != uint32(refF16(448))<<16|uint32(refF16(-3)) {
		t.Errorf("cvt.rn.f16x2.e4m3x2 = %#08x, want f16 448, -3", got)
	}
	if got := le.Uint16(bo[8:]); got != 0x7e00 {
		t.Errorf("cvt.rn.satfinite.relu.e4m3x2.f32 1e6, -3 = %#04x, want 0x7e00", got)
	}
}
