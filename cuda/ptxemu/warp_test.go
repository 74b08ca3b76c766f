package ptxemu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Shuffles and votes

const shflPTX = `
.visible .entry shfl(
	.param .u64 shfl_param_0,
	.param .u64 shfl_param_1
)
{
	.reg .pred 	%p<8>;
	.reg .b32 	%r<40>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [shfl_param_0];
	ld.param.u64 	%rd2, [shfl_param_1];
	cvta.to.global.u64 	%rd3, %rd1;
	cvta.to.global.u64 	%rd4, %rd2;
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd5, %r1, 4;
	add.s64 	%rd6, %rd3, %rd5;
	ld.global.u32 	%r2, [%rd6];
	shfl.sync.bfly.b32 	%r3, %r2, 16, 31, -1;
	add.s32 	%r4, %r2, %r3;
	shfl.sync.bfly.b32 	%r3, %r4, 8, 31, -1;
	add.s32 	%r4, %r4, %r3;
	shfl.sync.bfly.b32 	%r3, %r4, 4, 31, -1;
	add.s32 	%r4, %r4, %r3;
	shfl.sync.bfly.b32 	%r3, %r4, 2, 31, -1;
	add.s32 	%r4, %r4, %r3;
	shfl.sync.bfly.b32 	%r3, %r4, 1, 31, -1;
	add.s32 	%r4, %r4, %r3;
	shfl.sync.down.b32 	%r5|%p1, %r2, 1, 31, -1;
	selp.u32 	%r6, 1, 0, %p1;
	shfl.sync.up.b32 	%r7|%p2, %r2, 2, 0, -1;
	selp.u32 	%r8, 1, 0, %p2;
	shfl.sync.idx.b32 	%r9, %r2, 5, 31, -1;
	shfl.sync.idx.b32 	%r10, %r2, 3, 6175, -1;
	shfl.sync.down.b32 	%r11, %r2, 1, 6175, -1;
	and.b32 	%r12, %r1, 3;
	xor.b32 	%r13, %r12, 3;
	shfl.sync.idx.b32 	%r14, %r2, %r13, 31, -1;
	and.b32 	%r15, %r2, 1;
	setp.eq.s32 	%p3, %r15, 1;
	vote.sync.ballot.b32 	%r16, %p3, -1;
	shfl.sync.up.b32 	%r17, %r2, 2, 31, -1;
	shfl.sync.idx.b32 	%r18, %r2, 37, 31, -1;
	vote.sync.any.pred 	%p4, %p3, -1;
	selp.u32 	%r19, 1, 0, %p4;
	vote.sync.all.pred 	%p5, %p3, -1;
	selp.u32 	%r20, 1, 0, %p5;
	mul.wide.u32 	%rd5, %r1, 64;
	add.s64 	%rd7, %rd4, %rd5;
	st.global.v4.u32 	[%rd7], {%r4, %r5, %r6, %r7};
	st.global.v4.u32 	[%rd7+16], {%r8, %r9, %r10, %r11};
	st.global.v4.u32 	[%rd7+32], {%r14, %r16, %r17, %r18};
	st.global.v2.u32 	[%rd7+48], {%r19, %r20};
	ret;
}
`

func TestShuffleVote(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, shflPTX)
	for _, tc := range []struct {
		name string
		in   func(l int) uint32
	}{
		{"mixed", func(l int) uint32 { return uint32(l*l*7 + 3) }},
		{"allOdd", func(l int) uint32 { return uint32(2*l + 1) }},
		{"allEven", func(l int) uint32 { return uint32(2*l + 100) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v [32]uint32
			var sum, ballot uint32
			for l := range v {
				v[l] = tc.in(l)
				sum += v[l]
				if v[l]&1 == 1 {
					ballot |= 1 << l
				}
			}
			pi, bi := devBuf(t, d, 128)
			putU32s(bi, v[:])
			po, bo := devBuf(t, d, 64*32)
			mustLaunch(t, d, m, "shfl", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, params(pi, po))
			out := u32s(bo)
			b2 := func(b bool) uint32 { return map[bool]uint32{true: 1, false: 0}[b] }
			for l := 0; l < 32; l++ {
				down, downOK := v[l], l < 31
				if downOK {
					down = v[l+1]
				}
				up, upOK := v[l], l >= 2
				if upOK {
					up = v[l-2]
				}
				down8 := v[l]
				if l%8 < 7 {
					down8 = v[l+1]
				}
				want := []struct {
					name string
					v    uint32
				}{
					{"bfly sum", sum},
					{"down 1", down}, {"down 1 pred", b2(downOK)},
					{"up 2 c=0", up}, {"up 2 pred", b2(upOK)},
					{"idx 5", v[5]},
					{"idx 3 width 8", v[l&^7|3]},
					{"down 1 width 8", down8},
					{"idx reg", v[l&3^3]},
					{"ballot", ballot},
					{"up 2 c=0x1f", v[l]},
					{"idx 37", v[5]},
					{"vote.any", b2(ballot != 0)},
					{"vote.all", b2(ballot == 0xffffffff)},
				}
				for j, w := range want {
					if got := out[16*l+j]; got != w.v {
						t.Errorf("lane %d: %s = %#x, want %#x", l, w.name, got, w.v)
					}
				}
			}
		})
	}
}

// Two half-warps run different shuffle sequences with disjoint member masks
// at the same time (legal on sm_70+): each must only wait for its own half.
const halfWarpPTX = `
.visible .entry halves(
	.param .u64 halves_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<4>;

	ld.param.u64 	%rd1, [halves_param_0];
	mov.u32 	%r1, %tid.x;
	mul.lo.s32 	%r2, %r1, 3;
	add.s32 	%r2, %r2, 1;
	setp.lt.u32 	%p1, %r1, 16;
	@!%p1 bra 	$L__BB0_2;
	shfl.sync.bfly.b32 	%r3, %r2, 8, 31, 65535;
	add.s32 	%r2, %r2, %r3;
	shfl.sync.bfly.b32 	%r3, %r2, 4, 31, 65535;
	add.s32 	%r2, %r2, %r3;
	shfl.sync.bfly.b32 	%r3, %r2, 2, 31, 65535;
	add.s32 	%r2, %r2, %r3;
	shfl.sync.bfly.b32 	%r3, %r2, 1, 31, 65535;
	add.s32 	%r2, %r2, %r3;
	bra.uni 	$L__BB0_3;
$L__BB0_2:
	shfl.sync.bfly.b32 	%r3, %r2, 1, 31, -65536;
	max.u32 	%r2, %r2, %r3;
	shfl.sync.bfly.b32 	%r3, %r2, 2, 31, -65536;
	max.u32 	%r2, %r2, %r3;
	shfl.sync.bfly.b32 	%r3, %r2, 4, 31, -65536;
	max.u32 	%r2, %r2, %r3;
	shfl.sync.bfly.b32 	%r3, %r2, 8, 31, -65536;
	max.u32 	%r2, %r2, %r3;
	shfl.sync.idx.b32 	%r3, %r2, 17, 31, -65536;
	add.s32 	%r2, %r2, %r3;
$L__BB0_3:
	mul.wide.u32 	%rd2, %r1, 4;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.u32 	[%rd3], %r2;
	ret;
}
`

func TestShuffleDisjointMasks(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, halfWarpPTX)
	var lowSum, highMax uint32
	for l := 0; l < 32; l++ {
		if v := uint32(3*l + 1); l < 16 {
			lowSum += v
		} else {
			highMax = max(highMax, v)
		}
	}
	for iter := 0; iter < 20; iter++ {
		po, bo := devBuf(t, d, 128)
		mustLaunch(t, d, m, "halves", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, params(po))
		for l, got := range u32s(bo) {
			want := lowSum
			if l >= 16 {
				want = 2 * highMax
			}
			if got != want {
				t.Fatalf("iteration %d lane %d: %d, want %d", iter, l, got, want)
			}
		}
	}
}

// ldmatrix + mma.sync m16n8k16

// mma loads A (16x16 f16, row-major), B (16x8, row-major) and its transpose
// BT (8x16, row-major) into shared memory, builds the fragments with
// ldmatrix (.x4 for A, .x2.trans from B, .x2 from BT) and writes
// D = A*B + 1 twice, 16x8 f32 row-major each.
const mmaPTX = `
.visible .entry mma(
	.param .u64 mma_param_0,
	.param .u64 mma_param_1,
	.param .u64 mma_param_2,
	.param .u64 mma_param_3
)
{
	.reg .b32 	%r<64>;
	.reg .f32 	%f<12>;
	.reg .b64 	%rd<20>;
	.shared .align 16 .b8 sA[512];
	.shared .align 16 .b8 sB[256];
	.shared .align 16 .b8 sBT[256];

	ld.param.u64 	%rd1, [mma_param_0];
	ld.param.u64 	%rd2, [mma_param_1];
	ld.param.u64 	%rd3, [mma_param_2];
	ld.param.u64 	%rd4, [mma_param_3];
	mov.u32 	%r1, %laneid;
	mul.wide.u32 	%rd5, %r1, 16;
	add.s64 	%rd6, %rd1, %rd5;
	ld.global.v4.u32 	{%r2, %r3, %r4, %r5}, [%rd6];
	mov.u32 	%r6, sA;
	shl.b32 	%r7, %r1, 4;
	add.s32 	%r8, %r6, %r7;
	st.shared.v4.u32 	[%r8], {%r2, %r3, %r4, %r5};
	mul.wide.u32 	%rd7, %r1, 8;
	add.s64 	%rd8, %rd2, %rd7;
	ld.global.v2.u32 	{%r9, %r10}, [%rd8];
	mov.u32 	%r11, sB;
	shl.b32 	%r12, %r1, 3;
	add.s32 	%r13, %r11, %r12;
	st.shared.v2.u32 	[%r13], {%r9, %r10};
	add.s64 	%rd9, %rd3, %rd7;
	ld.global.v2.u32 	{%r9, %r10}, [%rd9];
	mov.u32 	%r14, sBT;
	add.s32 	%r15, %r14, %r12;
	st.shared.v2.u32 	[%r15], {%r9, %r10};
	bar.sync 	0;
	// A: matrix i = lane/8 holds rows 8*(i%2).. and columns 8*(i/2)..
	shr.u32 	%r16, %r1, 3;
	and.b32 	%r17, %r1, 7;
	and.b32 	%r18, %r16, 1;
	shl.b32 	%r19, %r18, 3;
	add.s32 	%r20, %r19, %r17;
	shl.b32 	%r21, %r20, 5;
	shr.u32 	%r22, %r16, 1;
	shl.b32 	%r23, %r22, 4;
	add.s32 	%r24, %r21, %r23;
	add.s32 	%r25, %r6, %r24;
	ldmatrix.sync.aligned.m8n8.x4.shared.b16 	{%r26, %r27, %r28, %r29}, [%r25];
	// B row-major: lane%16 is row k (16 bytes each)
	and.b32 	%r30, %r1, 15;
	shl.b32 	%r31, %r30, 4;
	add.s32 	%r32, %r11, %r31;
	ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 	{%r33, %r34}, [%r32];
	// BT row-major: matrix j = (lane/8)%2 holds k = 8j.., row n = lane%8
	shl.b32 	%r36, %r18, 4;
	shl.b32 	%r37, %r17, 5;
	add.s32 	%r38, %r36, %r37;
	add.s32 	%r39, %r14, %r38;
	ldmatrix.sync.aligned.m8n8.x2.shared.b16 	{%r40, %r41}, [%r39];
	mov.f32 	%f1, 0f3F800000;
	mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f2, %f3, %f4, %f5}, {%r26, %r27, %r28, %r29}, {%r33, %r34}, {%f1, %f1, %f1, %f1};
	mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f6, %f7, %f8, %f9}, {%r26, %r27, %r28, %r29}, {%r40, %r41}, {%f1, %f1, %f1, %f1};
	// D: c0,c1 at (g, 2t..2t+1), c2,c3 at (g+8, 2t..2t+1)
	shr.u32 	%r42, %r1, 2;
	and.b32 	%r43, %r1, 3;
	shl.b32 	%r44, %r42, 3;
	shl.b32 	%r45, %r43, 1;
	add.s32 	%r46, %r44, %r45;
	mul.wide.u32 	%rd10, %r46, 4;
	add.s64 	%rd11, %rd4, %rd10;
	st.global.v2.f32 	[%rd11], {%f2, %f3};
	st.global.v2.f32 	[%rd11+256], {%f4, %f5};
	st.global.v2.f32 	[%rd11+512], {%f6, %f7};
	st.global.v2.f32 	[%rd11+768], {%f8, %f9};
	ret;
}
`

func TestLdmatrixMma(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, mmaPTX)
	rng := rand.New(rand.NewPCG(3, 4))
	var A [16][16]float32
	var B [16][8]float32
	pa, ba := devBuf(t, d, 512)
	pb, bb := devBuf(t, d, 256)
	pbt, bbt := devBuf(t, d, 256)
	for r := range A {
		for c := range A[r] {
			A[r][c] = float32(rng.IntN(9) - 4)
			binary.LittleEndian.PutUint16(ba[2*(16*r+c):], refF16(A[r][c]))
		}
	}
	for k := range B {
		for n := range B[k] {
			B[k][n] = float32(rng.IntN(9) - 4)
			binary.LittleEndian.PutUint16(bb[2*(8*k+n):], refF16(B[k][n]))
			binary.LittleEndian.PutUint16(bbt[2*(16*n+k):], refF16(B[k][n]))
		}
	}
	pd, bd := devBuf(t, d, 1024)
	mustLaunch(t, d, m, "mma", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, params(pa, pb, pbt, pd))
	out := u32s(bd)
	for i, name := range []string{"B via ldmatrix.x2.trans", "BT via ldmatrix.x2"} {
		for r := 0; r < 16; r++ {
			for n := 0; n < 8; n++ {
				want := float32(1)
				for k := 0; k < 16; k++ {
					want += A[r][k] * B[k][n]
				}
				if got := math.Float32frombits(out[128*i+8*r+n]); got != want {
					t.Errorf("%s: D[%d][%d] = %v, want %v", name, r, n, got, want)
				}
			}
		}
	}
}

// Lane 31 arrives last at a vote or redux (after a spin) and exits right
// after it; the other lanes must still count its vote or value, however late
// they read the result. OP is replaced by the collective under test, which
// sets %r3 from %p1 (false only in lane 31) or %r4 (lane+1).
const voteExitPTX = `
.visible .entry voteexit(
	.param .u64 voteexit_param_0
)
{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<10>;
	.reg .b64 	%rd<4>;

	ld.param.u64 	%rd1, [voteexit_param_0];
	mov.u32 	%r1, %laneid;
	add.s32 	%r4, %r1, 1;
	setp.ne.s32 	%p1, %r1, 31;
	selp.u32 	%r2, 0, 20000, %p1;
$L__BB0_1:
	setp.eq.s32 	%p2, %r2, 0;
	@%p2 bra 	$L__BB0_2;
	add.s32 	%r2, %r2, -1;
	bra.uni 	$L__BB0_1;
$L__BB0_2:
	OP
	mul.wide.u32 	%rd2, %r1, 4;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.u32 	[%rd3], %r3;
	ret;
}
`

func TestVoteReduxExitingLane(t *testing.T) {
	for _, tc := range []struct {
		name, op string
		want     uint32
	}{
		{"vote.all", "vote.sync.all.pred %p3, %p1, -1;\n\tselp.u32 %r3, 1, 0, %p3;", 0},
		{"vote.uni", "vote.sync.uni.pred %p3, %p1, -1;\n\tselp.u32 %r3, 1, 0, %p3;", 0},
		{"ballot", "vote.sync.ballot.b32 %r3, %p1, -1;", 0x7fffffff},
		{"redux.add", "redux.sync.add.u32 %r3, %r4, -1;", 32 * 33 / 2},
		{"redux.max", "redux.sync.max.u32 %r3, %r4, -1;", 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDevice()
			m := loadPTX(t, d, strings.Replace(voteExitPTX, "OP", tc.op, 1))
			for iter := 0; iter < 10; iter++ {
				po, bo := devBuf(t, d, 4*32)
				mustLaunch(t, d, m, "voteexit", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, params(po))
				for l, got := range u32s(bo) {
					if got != tc.want {
						t.Fatalf("iteration %d lane %d: %#x, want %#x", iter, l, got, tc.want)
					}
				}
			}
		})
	}
}

// mmah: m16n8k8 with an f16 accumulator. Every lane passes the same
// registers, so A[r][k] is 2^-7 for even k and 2^-16 for odd k, B[k][n]
// 2^-6 and 2^-16, C 1: D = 1 + 4*(2^-13 + 2^-32) = 1 + 2^-11 + 2^-30, just
// above the f16 midpoint 1 + 2^-11, so 0x3c01 rounded once (via float32 it
// becomes the midpoint and rounds to even, 0x3c00).
const mmaF16AccPTX = `
.visible .entry mmah(
	.param .u64 mmah_param_0
)
{
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<4>;

	ld.param.u64 	%rd1, [mmah_param_0];
	mov.b32 	%r1, 0x01002000;
	mov.b32 	%r2, 0x01002400;
	mov.b32 	%r3, 0x3C003C00;
	mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%r4, %r5}, {%r1, %r1}, {%r2}, {%r3, %r3};
	mov.u32 	%r6, %laneid;
	mul.wide.u32 	%rd2, %r6, 8;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.v2.u32 	[%rd3], {%r4, %r5};
	ret;
}
`

func TestMmaF16AccumulatorRounding(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, mmaF16AccPTX)
	po, bo := devBuf(t, d, 8*32)
	mustLaunch(t, d, m, "mmah", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, params(po))
	for i, got := range u32s(bo) {
		if got != 0x3c013c01 {
			t.Fatalf("lane %d d%d = %#08x, want 0x3c013c01", i/2, i%2, got)
		}
	}
}
