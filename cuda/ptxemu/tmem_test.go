package ptxemu

import (
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
