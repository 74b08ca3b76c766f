package ptxemu

import (
	"fmt"
	"strings"
	"testing"
)

// Four warps store 4 columns of their lane quarter (32x32b.x4: thread i
// reaches lane 32*(warp%4)+i) and load them back. A register loaded by
// tcgen05.ld keeps its old value until tcgen05.wait::ld (PTX ISA: the
// destination is undefined until then).
const tmemPTX = `
.shared .align 4 .b32 tbase;

.visible .entry ldst(.param .u64 out)
{
	.reg .b32 %r<30>;
	.reg .b64 %rd<8>;
	.reg .pred %p<4>;

	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %tid.x;
	shr.u32 %r2, %r1, 5;
	mov.u32 %r3, tbase;
	setp.ne.s32 %p1, %r2, 0;
	@%p1 bra ALLOCD;
	tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r3], 64;
ALLOCD:
	tcgen05.fence::before_thread_sync;
	bar.sync 0;
	tcgen05.fence::after_thread_sync;
	ld.shared.u32 %r4, [%r3];
	shl.b32 %r5, %r2, 21;
	add.s32 %r6, %r4, %r5;
	add.s32 %r6, %r6, 32;
	shl.b32 %r7, %r1, 4;
	add.s32 %r8, %r7, 1;
	add.s32 %r9, %r7, 2;
	add.s32 %r10, %r7, 3;
	tcgen05.st.sync.aligned.32x32b.x4.b32 [%r6], {%r7, %r8, %r9, %r10};
	tcgen05.wait::st.sync.aligned;
	mov.u32 %r11, 7;
	mov.u32 %r12, 7;
	mov.u32 %r13, 7;
	mov.u32 %r14, 7;
	tcgen05.ld.sync.aligned.32x32b.x4.b32 {%r11, %r12, %r13, %r14}, [%r6];
	mov.u32 %r15, %r11;
	tcgen05.wait::ld.sync.aligned;
	mul.wide.u32 %rd2, %r1, 32;
	add.s64 %rd3, %rd1, %rd2;
	st.global.v4.u32 [%rd3], {%r11, %r12, %r13, %r14};
	st.global.u32 [%rd3+16], %r15;
	tcgen05.fence::before_thread_sync;
	bar.sync 0;
	@%p1 bra END;
	tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r4, 64;
	tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;
END:
	ret;
}
`

func TestTmemLdSt(t *testing.T) {
	d := NewDevice()
	m := loadPTX100(t, d, tmemPTX)
	out, ob := devBuf(t, d, 128*32)
	mustLaunch(t, d, m, "ldst", Dim{1, 1, 1}, Dim{128, 1, 1}, 0, params(out))
	got := u32s(ob)
	for tid := range 128 {
		want := []uint32{uint32(16 * tid), uint32(16*tid + 1), uint32(16*tid + 2), uint32(16*tid + 3), 7}
		for i, w := range want {
			if g := got[tid*8+i]; g != w {
				t.Errorf("thread %d value %d = %d, want %d", tid, i, g, w)
			}
		}
	}
}

// Tensor-memory misuse fails the launch with a message naming it.
func TestTmemFaults(t *testing.T) {
	const alloc = "setp.ne.s32 %p1, %r2, 0;\n\t@%p1 bra A;\n\ttcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r3], 32;\n" +
		"A:\n\tbar.sync 0;\n\tld.shared.u32 %r4, [%r3];\n\t"
	const dealloc = "\n\tbar.sync 0;\n\tsetp.ne.s32 %p1, %r2, 0;\n\t@%p1 bra END;\n\ttcgen05.dealloc.cta_group::1.sync.aligned.b32 %r4, 32;"
	for _, tc := range []struct{ name, body, want string }{
		{"lane quarter", alloc + "tcgen05.ld.sync.aligned.32x32b.x1.b32 {%r5}, [%r4];" + dealloc, "reaches lanes 32..63 only"},
		{"unallocated column", alloc + "shl.b32 %r5, %r2, 21;\n\tadd.s32 %r5, %r5, %r4;\n\tadd.s32 %r5, %r5, 40;\n\t" +
			"tcgen05.ld.sync.aligned.32x32b.x1.b32 {%r6}, [%r5];" + dealloc, "column 40 is not allocated"},
		{"no dealloc", alloc, "dealloc missing"},
		{"not a power of two", "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r3], 48;", "power of two"},
		{"after relinquish", "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n\t" + alloc, "after tcgen05.relinquish_alloc_permit"},
		{"over capacity", "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r3], 512;\n\t" +
			"tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r3], 32;", "with 512 of 512 allocated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := ".shared .align 4 .b32 tbase;\n.visible .entry k()\n{\n\t.reg .b32 %r<8>;\n\t.reg .pred %p<2>;\n" +
				"\tmov.u32 %r1, %tid.x;\n\tshr.u32 %r2, %r1, 5;\n\tmov.u32 %r3, tbase;\n\t" + tc.body + "\nEND:\n\tret;\n}\n"
			d := NewDevice()
			m := loadPTX100(t, d, src)
			err := launch(t, d, m, "k", Dim{1, 1, 1}, Dim{64, 1, 1}, 0, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("launch error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// ldShapePTX fills 64 columns of lanes 0..31 with lane*1000+column
// (32x32b.x64), then loads SHAPE at lane 16 (0 for 32x32b), column 4 and
// writes the registers out.
const ldShapePTX = `
.shared .align 4 .b32 tbase;

.visible .entry shape(.param .u64 out)
{
	.reg .b32 %r<200>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %tid.x;
	mov.u32 %r3, tbase;
	tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r3], 64;
	bar.sync 0;
	ld.shared.u32 %r4, [%r3];
	mul.lo.u32 %r5, %r1, 1000;
	FILL
	tcgen05.st.sync.aligned.32x32b.x64.b32 [%r4], {STREGS};
	tcgen05.wait::st.sync.aligned;
	tcgen05.fence::before_thread_sync;
	bar.sync 0;
	tcgen05.fence::after_thread_sync;
	add.s32 %r6, %r4, ADDR;
	tcgen05.ld.sync.aligned.SHAPE.b32 {LDREGS}, [%r6];
	tcgen05.wait::ld.sync.aligned;
	mul.wide.u32 %rd2, %r1, 64;
	add.s64 %rd3, %rd1, %rd2;
	STORES
	bar.sync 0;
	tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r4, 64;
	ret;
}
`

// TestTmemLdShapes checks each load shape against CUTLASS's thread/value
// layouts (cute/atom/copy_traits_sm100.hpp, Copy_Traits<SM100_TMEM_LOAD_*>
// DstLayout), written here as the bit each (thread, value) reads: bit i of
// the rows-by-bits block, lane i / bits, column (i % bits) / 32.
func TestTmemLdShapes(t *testing.T) {
	for _, tc := range []struct {
		shape string
		regs  int
		bits  int // row bits of the whole .xN block
		bit   func(t, j int) int
	}{
		{"32x32b.x2", 2, 64, func(t, j int) int { return 64*t + 32*j }},
		{"16x64b.x1", 1, 64, func(t, j int) int { return 512*(t%2) + 32*(t/2%2) + 64*(t/4) }},
		{"16x128b.x1", 2, 128, func(t, j int) int { return 32*(t%4) + 128*(t/4) + 1024*j }},
		{"16x128b.x2", 4, 256, func(t, j int) int { return 32*(t%4) + 256*(t/4) + 2048*(j%2) + 128*(j/2) }},
		{"16x256b.x1", 4, 256, func(t, j int) int { return 64*(t%4) + 256*(t/4) + 32*(j%2) + 2048*(j/2) }},
		{"16x256b.x2", 8, 512, func(t, j int) int { return 64*(t%4) + 512*(t/4) + 32*(j%2) + 4096*(j/2%2) + 256*(j/4) }},
	} {
		t.Run(tc.shape, func(t *testing.T) {
			var fill, st, ld, stores strings.Builder
			for c := range 64 {
				fmt.Fprintf(&fill, "add.s32 %%r%d, %%r5, %d;\n\t", 100+c, c)
				if c > 0 {
					st.WriteString(", ")
				}
				fmt.Fprintf(&st, "%%r%d", 100+c)
			}
			for j := range tc.regs {
				if j > 0 {
					ld.WriteString(", ")
				}
				fmt.Fprintf(&ld, "%%r%d", 10+j)
				fmt.Fprintf(&stores, "st.global.u32 [%%rd3+%d], %%r%d;\n\t", 4*j, 10+j)
			}
			base, addr := 16, "0x100004"
			if strings.HasPrefix(tc.shape, "32x32b") {
				base, addr = 0, "4"
			}
			src := strings.NewReplacer("ADDR", addr, "FILL", fill.String(), "STREGS", st.String(), "SHAPE", tc.shape, "LDREGS", ld.String(),
				"STORES", stores.String()).Replace(ldShapePTX)
			d := NewDevice()
			m := loadPTX100(t, d, src)
			out, ob := devBuf(t, d, 32*64)
			mustLaunch(t, d, m, "shape", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, params(out))
			got := u32s(ob)
			for th := range 32 {
				for j := range tc.regs {
					i := tc.bit(th, j)
					want := uint32((base+i/tc.bits)*1000 + 4 + i%tc.bits/32)
					if g := got[th*16+j]; g != want {
						t.Errorf("thread %d register %d = %d, want %d", th, j, g, want)
					}
				}
			}
		})
	}
}

// cpPTX fills 4 KB of shared memory from global memory, copies it into
// tensor memory with tcgen05.cp SHAPE (no swizzle, LBO 128, SBO 256) and
// commits; each thread then loads 8 columns of its lane.
const cpPTX = `
.shared .align 1024 .b8 sm[4096];
.shared .align 8 .b64 bar;
.shared .align 4 .b32 tbase;

.visible .entry cp(.param .u64 out, .param .u64 in)
{
	.reg .b32 %r<40>;
	.reg .b64 %rd<10>;
	.reg .pred %p<4>;

	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [in];
	mov.u32 %r1, %tid.x;
	shr.u32 %r2, %r1, 5;
	mov.u32 %r3, sm;
	mov.u32 %r5, bar;
	mov.u32 %r6, tbase;
	shl.b32 %r7, %r1, 2;
CP:
	setp.ge.u32 %p1, %r7, 4096;
	@%p1 bra CPD;
	cvt.u64.u32 %rd3, %r7;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.u32 %r8, [%rd4];
	add.s32 %r9, %r3, %r7;
	st.shared.u32 [%r9], %r8;
	add.s32 %r7, %r7, 512;
	bra.uni CP;
CPD:
	setp.ne.s32 %p2, %r2, 0;
	@%p2 bra ALLOCD;
	tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r6], 32;
ALLOCD:
	setp.ne.s32 %p3, %r1, 0;
	@%p3 bra INITD;
	mbarrier.init.shared::cta.b64 [%r5], 1;
INITD:
	fence.proxy.async.shared::cta;
	tcgen05.fence::before_thread_sync;
	bar.sync 0;
	tcgen05.fence::after_thread_sync;
	ld.shared.u32 %r11, [%r6];
	@%p3 bra WAIT;
	cvt.u64.u32 %rd5, %r3;
	shr.u64 %rd5, %rd5, 4;
	mov.b64 %rd6, 0x401000080000;
	or.b64 %rd7, %rd5, %rd6;
	tcgen05.cp.cta_group::1.SHAPE [%r11], %rd7;
	tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%r5];
WAIT:
	mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r5], 0;
	@!%p1 bra WAIT;
	tcgen05.fence::after_thread_sync;
	shl.b32 %r12, %r2, 21;
	add.s32 %r13, %r11, %r12;
	tcgen05.ld.sync.aligned.32x32b.x8.b32 {%r20, %r21, %r22, %r23, %r24, %r25, %r26, %r27}, [%r13];
	tcgen05.wait::ld.sync.aligned;
	mul.wide.u32 %rd8, %r1, 32;
	add.s64 %rd9, %rd1, %rd8;
	st.global.v4.u32 [%rd9], {%r20, %r21, %r22, %r23};
	st.global.v4.u32 [%rd9+16], {%r24, %r25, %r26, %r27};
	tcgen05.fence::before_thread_sync;
	bar.sync 0;
	@%p2 bra END;
	tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r11, 32;
END:
	ret;
}
`

// TestTmemCp: row r of the copied matrix lands in lane r (the 32 rows
// repeated in each lane quarter with .warpx4), 4 bytes a column, its
// 16-byte chunks read from the PTX ISA's no-swizzle canonical layout (8x16
// -byte core matrices, LBO apart along the row, SBO apart every 8 rows).
func TestTmemCp(t *testing.T) {
	for _, tc := range []struct {
		shape       string
		rows, bytes int
	}{
		{"128x256b", 128, 32},
		{"128x128b", 128, 16},
		{"32x128b.warpx4", 32, 16},
	} {
		t.Run(tc.shape, func(t *testing.T) {
			d := NewDevice()
			m := loadPTX100(t, d, strings.ReplaceAll(cpPTX, "SHAPE", tc.shape))
			in, ib := devBuf(t, d, 4096)
			for i := range ib {
				ib[i] = byte(i*7 + i>>8)
			}
			out, ob := devBuf(t, d, 128*32)
			mustLaunch(t, d, m, "cp", Dim{1, 1, 1}, Dim{128, 1, 1}, 0, params(out, in))
			for lane := range 128 {
				r := lane % tc.rows
				for kb := range tc.bytes {
					want := ib[r/8*256+kb/16*128+r%8*16+kb%16]
					if g := ob[lane*32+kb]; g != want {
						t.Fatalf("lane %d byte %d = %#x, want %#x", lane, kb, g, want)
					}
				}
			}
		})
	}
}
