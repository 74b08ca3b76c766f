package ptxemu

import (
	"strings"
	"testing"
)

const sm100Header = ".version 8.7\n.target sm_100a\n.address_size 64\n\n"

func loadPTX100(t *testing.T, d *Device, body string) *Module {
	t.Helper()
	m, err := d.Load([]byte(sm100Header + body))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(m.Unload)
	return m
}

// Two phases of one barrier (PTX ISA "mbarrier"): 64 arrivals complete
// phase 0; phase 1 also needs the 256 transaction bytes thread 0 expects,
// which the threads complete 4 each after writing data[tid]. A thread that
// passes a wait early reads a neighbour's slot still zero.
const mbarPTX = `
.shared .align 8 .b64 bar;
.shared .align 4 .b8 data[256];

.visible .entry phases(.param .u64 out)
{
	.reg .b32 %r<20>;
	.reg .b64 %rd<10>;
	.reg .pred %p<8>;

	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, bar;
	setp.ne.s32 %p1, %r1, 0;
	@%p1 bra INITED;
	mbarrier.init.shared::cta.b64 [%r2], 64;
INITED:
	bar.sync 0;
	mbarrier.test_wait.parity.shared::cta.b64 %p2, [%r2], 1;
	selp.u32 %r3, 1, 0, %p2;
	mbarrier.arrive.shared::cta.b64 %rd2, [%r2];
W0:
	mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r2], 0;
	@!%p3 bra W0;
	@%p1 bra ARRIVE;
	mbarrier.arrive.expect_tx.shared::cta.b64 %rd3, [%r2], 256;
	bra.uni WRITE;
ARRIVE:
	mbarrier.arrive.release.cta.shared::cta.b64 %rd3, [%r2];
WRITE:
	mov.u32 %r4, data;
	shl.b32 %r5, %r1, 2;
	add.s32 %r6, %r4, %r5;
	add.s32 %r7, %r1, 1;
	st.shared.u32 [%r6], %r7;
	mbarrier.complete_tx.shared::cta.b64 [%r2], 4;
W1:
	mbarrier.try_wait.shared::cta.b64 %p4, [%r2], %rd3;
	@!%p4 bra W1;
	add.s32 %r8, %r1, 1;
	and.b32 %r8, %r8, 63;
	shl.b32 %r8, %r8, 2;
	add.s32 %r8, %r4, %r8;
	ld.shared.u32 %r9, [%r8];
	mbarrier.test_wait.parity.shared::cta.b64 %p5, [%r2], 0;
	selp.u32 %r10, 1, 0, %p5;
	cvt.u32.u64 %r11, %rd2;
	cvt.u32.u64 %r12, %rd3;
	mul.wide.u32 %rd4, %r1, 20;
	add.s64 %rd5, %rd1, %rd4;
	st.global.u32 [%rd5], %r3;
	st.global.u32 [%rd5+4], %r11;
	st.global.u32 [%rd5+8], %r12;
	st.global.u32 [%rd5+12], %r9;
	st.global.u32 [%rd5+16], %r10;
	ret;
}
`

func TestMbarrierPhases(t *testing.T) {
	d := NewDevice()
	m := loadPTX100(t, d, mbarPTX)
	out, ob := devBuf(t, d, 64*20)
	mustLaunch(t, d, m, "phases", Dim{1, 1, 1}, Dim{64, 1, 1}, 0, params(out))
	got := u32s(ob)
	for tid := range 64 {
		// parity 1 (the phase before the first) tests complete at once;
		// the arrive tokens carry parities 0 and 1; the neighbour's data;
		// the current phase (2) has parity 0, so parity 0 tests pending
		want := []uint32{1, 0, 1, uint32((tid+1)%64 + 1), 0}
		for i, w := range want {
			if g := got[tid*5+i]; g != w {
				t.Errorf("thread %d value %d = %d, want %d", tid, i, g, w)
			}
		}
	}
}

// Misuse fails the launch with a message naming it.
func TestMbarrierFaults(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"before init", "mbarrier.arrive.shared::cta.b64 %rd1, [%r2];", "before mbarrier.init"},
		{"over-arrival", "mbarrier.init.shared::cta.b64 [%r2], 1;\n\tmbarrier.arrive.shared::cta.b64 %rd1, [%r2], 2;", "2 arrivals with 1 pending"},
		{"bad count", "mbarrier.init.shared::cta.b64 [%r2], 0;", "count 0"},
		{"never completes", "mbarrier.init.shared::cta.b64 [%r2], 2;\n\tmbarrier.arrive.shared::cta.b64 %rd1, [%r2];\n" +
			"W:\n\tmbarrier.try_wait.parity.shared::cta.b64 %p1, [%r2], 0;\n\t@!%p1 bra W;", "deadlock"},
		{"tx overflow", "mbarrier.init.shared::cta.b64 [%r2], 1;\n\tmbarrier.expect_tx.shared::cta.b64 [%r2], 1048576;", "tx-count"},
		{"misaligned", "add.s32 %r2, %r2, 4;\n\tmbarrier.init.shared::cta.b64 [%r2], 1;", "8-byte aligned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := ".shared .align 8 .b64 bar;\n.visible .entry k()\n{\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<4>;\n\t.reg .pred %p<2>;\n" +
				"\tmov.u32 %r2, bar;\n\t" + tc.body + "\n\tret;\n}\n"
			d := NewDevice()
			m := loadPTX100(t, d, src)
			err := launch(t, d, m, "k", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("launch error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// elect.sync names the lowest lane of the member mask as leader, on every
// member lane, and sets the predicate on the leader only.
func TestElect(t *testing.T) {
	src := `.visible .entry el(.param .u64 out)
{
	.reg .b32 %r<8>;
	.reg .b64 %rd<4>;
	.reg .pred %p<3>;

	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %tid.x;
	and.b32 %r2, %r1, 31;
	mov.u32 %r3, 0xf;
	setp.lt.u32 %p1, %r2, 4;
	@%p1 bra ALL;
	mov.u32 %r3, 0xfffffff0;
ALL:
	elect.sync %r4|%p2, %r3;
	selp.u32 %r5, 1, 0, %p2;
	mul.wide.u32 %rd2, %r1, 8;
	add.s64 %rd3, %rd1, %rd2;
	st.global.v2.u32 [%rd3], {%r4, %r5};
	ret;
}
`
	d := NewDevice()
	m := loadPTX100(t, d, src)
	out, ob := devBuf(t, d, 64*8)
	mustLaunch(t, d, m, "el", Dim{1, 1, 1}, Dim{64, 1, 1}, 0, params(out))
	got := u32s(ob)
	for tid := range 64 {
		lane, leader := tid%32, uint32(4)
		if lane < 4 {
			leader = 0
		}
		if got[2*tid] != leader || got[2*tid+1] != b2u32(uint32(lane) == leader) {
			t.Errorf("thread %d: leader %d elected %d, want %d %v", tid, got[2*tid], got[2*tid+1], leader, uint32(lane) == leader)
		}
	}
}

func b2u32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
