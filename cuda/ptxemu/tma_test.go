package ptxemu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// tmaPTX loads one box with cp.async.bulk.tensor into a 1024-aligned
// buffer, waits on the mbarrier its bytes complete, and copies the buffer
// out. Thread 0 issues; the other 31 only wait, so a copy that lands
// before the phase completes, or a barrier that completes early, shows.
const tmaPTX = `
.shared .align 1024 .b8 sm[16384];
.shared .align 8 .b64 bar;

.visible .entry tmaload(.param .u64 out, .param .u64 tmap, .param .u32 c0, .param .u32 c1, .param .u32 c2, .param .u32 tx, .param .u32 n)
{
	.reg .b32 %r<20>;
	.reg .b64 %rd<10>;
	.reg .pred %p<4>;

	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [tmap];
	ld.param.u32 %r11, [c0];
	ld.param.u32 %r12, [c1];
	ld.param.u32 %r13, [c2];
	ld.param.u32 %r14, [tx];
	ld.param.u32 %r15, [n];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, bar;
	mov.u32 %r3, sm;
	setp.ne.s32 %p1, %r1, 0;
	@%p1 bra SYNC;
	mbarrier.init.shared::cta.b64 [%r2], 1;
	fence.mbarrier_init.release.cluster;
	fence.proxy.async.shared::cta;
SYNC:
	bar.sync 0;
	@%p1 bra WAIT;
	mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r2], %r14;
	COPY
WAIT:
	mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r2], 0;
	@!%p2 bra WAIT;
	shl.b32 %r4, %r1, 2;
LOOP:
	setp.ge.u32 %p3, %r4, %r15;
	@%p3 bra DONE;
	add.s32 %r5, %r3, %r4;
	ld.shared.u32 %r6, [%r5];
	cvt.u64.u32 %rd3, %r4;
	add.s64 %rd4, %rd1, %rd3;
	st.global.u32 [%rd4], %r6;
	add.s32 %r4, %r4, 128;
	bra.uni LOOP;
DONE:
	ret;
}
`

func tmaKernel(rank int) string {
	co := []string{"%r11", "%r12", "%r13"}[:rank]
	cp := fmt.Sprintf("cp.async.bulk.tensor.%dd.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%%r3], [%%rd2, {%s}], [%%r2];",
		rank, strings.Join(co, ", "))
	return strings.Replace(tmaPTX, "COPY", cp, 1)
}

// TestTMALoad checks box loads against an independent model of the
// shared-memory image (CUTLASS cute/atom/copy_traits_sm90_tma_swizzle.hpp:
// the 128-byte swizzle XORs a row's 16-byte chunk index with row % 8, the
// 64-byte swizzle with (row/2) % 4, for rows of the swizzle's width),
// out-of-bounds elements zero, and 4-bit 16U4_ALIGN16B elements unpacked to
// 8 data bytes and 8 zero bytes per 16.
func TestTMALoad(t *testing.T) {
	for _, tc := range []struct {
		name   string
		m      TensorMap
		coords [3]int32
	}{
		{"2d 128B swizzle, edge", TensorMap{DType: TMAUint8, Rank: 2, Dims: [5]uint64{200, 40}, Strides: [5]uint64{0, 208}, Box: [5]uint32{128, 16}, Swizzle: 3}, [3]int32{128, 32, 0}},
		{"2d 64B swizzle", TensorMap{DType: TMAUint8, Rank: 2, Dims: [5]uint64{64, 24}, Strides: [5]uint64{0, 64}, Box: [5]uint32{64, 16}, Swizzle: 2}, [3]int32{0, 3, 0}},
		{"3d no swizzle, negative start", TensorMap{DType: 1, Rank: 3, Dims: [5]uint64{24, 5, 6}, Strides: [5]uint64{0, 48, 240}, Box: [5]uint32{16, 4, 3}}, [3]int32{-8, 2, 4}},
		{"2d e2m1 unpacked, 128B swizzle", TensorMap{DType: TMA16U4Align16, Rank: 2, Dims: [5]uint64{256, 20}, Strides: [5]uint64{0, 128}, Box: [5]uint32{128, 16}, Swizzle: 3}, [3]int32{128, 8, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDevice()
			mod := loadPTX100(t, d, tmaKernel(tc.m.Rank))
			m := tc.m
			size := int(m.Strides[m.Rank-1] * m.Dims[m.Rank-1])
			gp, gb := devBuf(t, d, size)
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			for i := range gb {
				gb[i] = byte(rng.Uint32())
			}
			m.Addr = gp
			enc, err := EncodeTensorMap(m)
			if err != nil {
				t.Fatal(err)
			}
			mp, mb := devBuf(t, d, 128)
			copy(mb, enc[:])
			want, tx := tmaModel(m, gb, tc.coords)
			out, ob := devBuf(t, d, len(want))
			mustLaunch(t, d, mod, "tmaload", Dim{1, 1, 1}, Dim{32, 1, 1}, 0,
				params(out, mp, uint32(tc.coords[0]), uint32(tc.coords[1]), uint32(tc.coords[2]), uint32(tx), uint32(len(want))))
			for i := range want {
				if ob[i] != want[i] {
					t.Fatalf("shared byte %d = %#x, want %#x", i, ob[i], want[i])
				}
			}
			// a wrong byte count leaves the phase open: the waiters deadlock
			err = launch(t, d, mod, "tmaload", Dim{1, 1, 1}, Dim{32, 1, 1}, 0,
				params(out, mp, uint32(tc.coords[0]), uint32(tc.coords[1]), uint32(tc.coords[2]), uint32(tx+16), uint32(len(want))))
			if err == nil || !strings.Contains(err.Error(), "deadlock") {
				t.Errorf("expect_tx of %d bytes for a %d-byte box: %v, want a deadlock", tx+16, tx, err)
			}
		})
	}
}

// tmaModel is the expected shared-memory image of a box and the bytes it
// completes on the barrier.
func tmaModel(m TensorMap, g []byte, c [3]int32) ([]byte, int) {
	four := m.DType == TMA16U4Align16
	esz := 1
	if m.DType == 1 {
		esz = 2
	}
	rowB := int(m.Box[0]) * esz
	rows := int(m.Box[1])
	if m.Rank == 3 {
		rows *= int(m.Box[2])
	}
	img := make([]byte, rows*rowB)
	for r := range rows {
		y, z := int(c[1])+r%int(m.Box[1]), int(c[2])+r/int(m.Box[1])
		for i := range int(m.Box[0]) {
			x := int(c[0]) + i
			if x < 0 || x >= int(m.Dims[0]) || y < 0 || y >= int(m.Dims[1]) || m.Rank == 3 && (z < 0 || z >= int(m.Dims[2])) {
				continue
			}
			row := y*int(m.Strides[1]) + z*int(m.Strides[2])
			if four {
				nib := g[row+x/2] >> (4 * (x % 2)) & 15
				img[r*rowB+16*(i/16)+i%16/2] |= nib << (4 * (i % 2))
				continue
			}
			copy(img[r*rowB+i*esz:r*rowB+(i+1)*esz], g[row+x*esz:])
		}
	}
	tx := len(img)
	if four {
		tx /= 2
	}
	out := make([]byte, len(img))
	for r := range rows {
		for kb := range rowB {
			chunk := kb / 16
			switch m.Swizzle {
			case 3:
				chunk ^= r % 8
			case 2:
				chunk ^= r / 2 % 4
			}
			out[r*rowB+chunk*16+kb%16] = img[r*rowB+kb]
		}
	}
	return out, tx
}

func TestEncodeTensorMapChecks(t *testing.T) {
	ok := TensorMap{DType: TMAUint8, Rank: 2, Addr: 1 << 20, Dims: [5]uint64{256, 64}, Strides: [5]uint64{0, 256}, Box: [5]uint32{128, 64}, Swizzle: 3}
	if _, err := EncodeTensorMap(ok); err != nil {
		t.Fatalf("valid map: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*TensorMap)
		want string
	}{
		{"misaligned", func(m *TensorMap) { m.Addr += 8 }, "16-byte aligned"},
		{"stride", func(m *TensorMap) { m.Strides[1] = 200 }, "multiple of 16"},
		{"box", func(m *TensorMap) { m.Box[1] = 300 }, "outside 1..256"},
		{"swizzle span", func(m *TensorMap) { m.Box[0] = 256 }, "swizzle span"},
		{"rank", func(m *TensorMap) { m.Rank = 6 }, "rank"},
		{"dtype", func(m *TensorMap) { m.DType = 15 }, "data type"},
	} {
		m := ok
		tc.edit(&m)
		if _, err := EncodeTensorMap(m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// A 2-CTA cluster: rank 0 multicasts one box to both CTAs (each expects
// the bytes on its own barrier at the same offset), then rank 1 arrives on
// rank 0's second barrier through mapa, which rank 0 waits for.
const multicastPTX = `
.shared .align 1024 .b8 sm[2048];
.shared .align 8 .b64 bar;
.shared .align 8 .b64 bar2;

.visible .entry mc(.param .u64 out, .param .u64 tmap)
.explicitcluster
.reqnctapercluster 2, 1, 1
{
	.reg .b32 %r<20>;
	.reg .b64 %rd<10>;
	.reg .pred %p<6>;
	.reg .b16 %rs<2>;

	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [tmap];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, bar;
	mov.u32 %r3, sm;
	mov.u32 %r4, bar2;
	mov.u32 %r5, %cluster_ctarank;
	setp.ne.s32 %p1, %r1, 0;
	@%p1 bra SYNC;
	mbarrier.init.shared::cta.b64 [%r2], 1;
	mbarrier.init.shared::cta.b64 [%r4], 1;
	fence.mbarrier_init.release.cluster;
	mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r2], 2048;
SYNC:
	barrier.cluster.arrive.release.aligned;
	barrier.cluster.wait.acquire.aligned;
	@%p1 bra WAIT;
	setp.ne.s32 %p2, %r5, 0;
	@%p2 bra REMOTE;
	mov.u32 %r6, 0;
	mov.u16 %rs1, 3;
	cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%r3], [%rd2, {%r6, %r6}], [%r2], %rs1;
W2:
	mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r4], 0;
	@!%p3 bra W2;
	bra.uni WAIT;
REMOTE:
	mapa.shared::cluster.u32 %r7, %r4, 0;
	mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r7];
WAIT:
	mbarrier.try_wait.parity.shared::cta.b64 %p4, [%r2], 0;
	@!%p4 bra WAIT;
	shl.b32 %r8, %r1, 2;
	mul.wide.u32 %rd3, %r5, 2048;
	add.s64 %rd4, %rd1, %rd3;
LOOP:
	setp.ge.u32 %p5, %r8, 2048;
	@%p5 bra DONE;
	add.s32 %r9, %r3, %r8;
	ld.shared.u32 %r10, [%r9];
	cvt.u64.u32 %rd5, %r8;
	add.s64 %rd6, %rd4, %rd5;
	st.global.u32 [%rd6], %r10;
	add.s32 %r8, %r8, 128;
	bra.uni LOOP;
DONE:
	ret;
}
`

func TestTMAMulticast(t *testing.T) {
	d := NewDevice()
	mod := loadPTX100(t, d, multicastPTX)
	m := TensorMap{DType: TMAUint8, Rank: 2, Dims: [5]uint64{128, 16}, Strides: [5]uint64{0, 128}, Box: [5]uint32{128, 16}, Swizzle: 3}
	gp, gb := devBuf(t, d, 2048)
	for i := range gb {
		gb[i] = byte(i * 13)
	}
	m.Addr = gp
	want, _ := tmaModel(m, gb, [3]int32{})
	out, ob := devBuf(t, d, 2*2048)
	mustLaunch(t, d, mod, "mc", Dim{4, 1, 1}, Dim{32, 1, 1}, 0, params(out, upMap(t, d, m)))
	for rank := range 2 {
		for i, w := range want {
			if g := ob[rank*2048+i]; g != w {
				t.Fatalf("CTA %d byte %d = %#x, want %#x", rank, i, g, w)
			}
		}
	}
}

// bulkStorePTX brings 2 KB into shared memory with the 1-D bulk copy, then
// writes it as a 128x16 box (128-byte swizzle) at row row0 with a TMA
// tensor store.
const bulkStorePTX = `
.shared .align 1024 .b8 sm[2048];
.shared .align 8 .b64 bar;

.visible .entry bs(.param .u64 src, .param .u64 tmap, .param .u32 row0)
{
	.reg .b32 %r<10>;
	.reg .b64 %rd<4>;
	.reg .pred %p<2>;

	ld.param.u64 %rd1, [src];
	ld.param.u64 %rd2, [tmap];
	ld.param.u32 %r4, [row0];
	mov.u32 %r2, bar;
	mov.u32 %r3, sm;
	mbarrier.init.shared::cta.b64 [%r2], 1;
	mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r2], 2048;
	cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r3], [%rd1], 2048, [%r2];
W:
	mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r2], 0;
	@!%p1 bra W;
	mov.u32 %r5, 0;
	cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%rd2, {%r5, %r4}], [%r3];
	cp.async.bulk.commit_group;
	cp.async.bulk.wait_group.read 0;
	ret;
}
`

// TestBulkCopyAndTMAStore: the box's row r, 16-byte chunk c is read from
// shared chunk c ^ r%8 of row r; rows past the tensor are not written.
func TestBulkCopyAndTMAStore(t *testing.T) {
	d := NewDevice()
	mod := loadPTX100(t, d, bulkStorePTX)
	sp, sb := devBuf(t, d, 2048)
	for i := range sb {
		sb[i] = byte(i*5 + i>>7)
	}
	const rows, row0 = 20, 8
	gp, gb := devBuf(t, d, rows*128)
	m := TensorMap{DType: TMAUint8, Rank: 2, Addr: gp, Dims: [5]uint64{128, rows}, Strides: [5]uint64{0, 128}, Box: [5]uint32{128, 16}, Swizzle: 3}
	mustLaunch(t, d, mod, "bs", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(sp, upMap(t, d, m), uint32(row0)))
	for y := range rows {
		for kb := range 128 {
			want := byte(0xff)
			if r := y - row0; r >= 0 {
				want = sb[r*128+(kb/16^r%8)*16+kb%16]
			}
			if g := gb[y*128+kb]; g != want {
				t.Fatalf("global row %d byte %d = %#x, want %#x", y, kb, g, want)
			}
		}
	}
	// the box's shared source overwritten before its group's reads complete
	early := strings.Replace(bulkStorePTX, "cp.async.bulk.commit_group;", "st.shared.u32 [%r3+640], %r4;\n\tcp.async.bulk.commit_group;", 1)
	mod = loadPTX100(t, d, early)
	err := launch(t, d, mod, "bs", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(sp, upMap(t, d, m), uint32(row0)))
	if err == nil || !strings.Contains(err.Error(), "changed before") {
		t.Errorf("source overwritten before wait_group.read: %v, want a failure", err)
	}
}
