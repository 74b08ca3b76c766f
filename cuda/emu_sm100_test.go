//go:build megamoe_emu

package cuda_test

import (
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/cuda"
)

// emuTMAPTX loads box (0, row0) of a tensor map passed as a 128-byte
// __grid_constant__ parameter, as NVCC passes CUtensorMap, and copies the
// swizzled shared-memory image out.
const emuTMAPTX = `.version 8.7
.target sm_100a
.address_size 64

.shared .align 1024 .b8 sm[4096];
.shared .align 8 .b64 bar;

.visible .entry tmabox(.param .u64 out, .param .align 64 .b8 tmap[128], .param .u32 row0, .param .u32 bytes)
{
	.reg .b32 %r<16>;
	.reg .b64 %rd<8>;
	.reg .pred %p<4>;

	ld.param.u64 %rd1, [out];
	mov.u64 %rd2, tmap;
	cvta.param.u64 %rd3, %rd2;
	ld.param.u32 %r10, [row0];
	ld.param.u32 %r11, [bytes];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, bar;
	mov.u32 %r3, sm;
	setp.ne.s32 %p1, %r1, 0;
	@%p1 bra SYNC;
	mbarrier.init.shared::cta.b64 [%r2], 1;
	fence.mbarrier_init.release.cluster;
SYNC:
	bar.sync 0;
	@%p1 bra WAIT;
	mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r2], %r11;
	mov.u32 %r12, 0;
	cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r3], [%rd3, {%r12, %r10}], [%r2];
WAIT:
	mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r2], 0;
	@!%p2 bra WAIT;
	shl.b32 %r4, %r1, 2;
LOOP:
	setp.ge.u32 %p3, %r4, %r11;
	@%p3 bra DONE;
	add.s32 %r5, %r3, %r4;
	ld.shared.u32 %r6, [%r5];
	cvt.u64.u32 %rd4, %r4;
	add.s64 %rd5, %rd1, %rd4;
	st.global.u32 [%rd5], %r6;
	add.s32 %r4, %r4, 128;
	bra.uni LOOP;
DONE:
	ret;
}
`

// TestEmuTMA: a map from Context.TensorMapBytes2D (the emulated
// cuTensorMapEncodeTiled) drives the emulated TMA: rows of 128 bytes land
// with the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ r%8),
// rows past the tensor as zeros.
func TestEmuTMA(t *testing.T) {
	ctx, s := emuSessionAs(t, "sm_100a")
	const rows, cols, boxRows, row0 = 20, 256, 16, 8
	src := make([]byte, rows*cols)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	g, err := ctx.Alloc(len(src))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Free)
	out, err := ctx.Alloc(boxRows * 128)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(out.Free)
	if err := s.CopyHtoD(g.Ptr, src); err != nil {
		t.Fatal(err)
	}
	m, err := ctx.TensorMapBytes2D(g.Ptr, rows, cols, boxRows, 128)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := ctx.LoadModule("emu_tma", []byte(emuTMAPTX))
	if err != nil {
		t.Fatal(err)
	}
	f, err := mod.Function("tmabox")
	if err != nil {
		t.Fatal(err)
	}
	a := new(cuda.Args).Ptr(out.Ptr).Map(&m).I32(row0).I32(boxRows * 128)
	if err := emuReturns(t, func() error { return s.Launch(f, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 32, Y: 1, Z: 1}, 0, a) }); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, boxRows*128)
	if err := s.CopyDtoH(got, out.Ptr); err != nil {
		t.Fatal(err)
	}
	for r := range boxRows {
		for kb := range 128 {
			var want byte
			if row0+r < rows {
				want = src[(row0+r)*cols+kb]
			}
			if g := got[r*128+(kb/16^r%8)*16+kb%16]; g != want {
				t.Fatalf("row %d byte %d = %#x, want %#x", r, kb, g, want)
			}
		}
	}
}
