package ptxemu

import (
	"strings"
	"testing"
)

// Parsing: initialised globals, .func calls, errors

const modulePTX = `
.global .align 4 .b8 tab[8] = {1, 2, 3, 4, 5, 6, 7, 8};
.global .align 4 .u32 words[2] = {305419896, 0xfffffffe};
.func  (.param .b32 func_retval0) _Z4add3ii(
	.param .b32 _Z4add3ii_param_0,
	.param .b32 _Z4add3ii_param_1
)
;

.visible .entry usetab(
	.param .u64 usetab_param_0
)
{
	.reg .b16 	%rs<2>;
	.reg .b32 	%r<12>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [usetab_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	cvt.u64.u32 	%rd3, %r1;
	mov.u64 	%rd4, tab;
	add.s64 	%rd5, %rd4, %rd3;
	ld.global.u8 	%rs1, [%rd5];
	cvt.u32.u16 	%r2, %rs1;
	ld.global.u32 	%r3, [words+4];
	{ // callseq 0, 0
	.reg .b32 temp_param_reg;
	.param .b32 param0;
	st.param.b32 	[param0+0], %r2;
	.param .b32 param1;
	st.param.b32 	[param1+0], %r1;
	.param .b32 retval0;
	call.uni (retval0), 
	_Z4add3ii, 
	(
	param0, 
	param1
	);
	ld.param.b32 	%r4, [retval0+0];
	} // callseq 0
	mul.wide.u32 	%rd6, %r1, 8;
	add.s64 	%rd7, %rd2, %rd6;
	st.global.v2.u32 	[%rd7], {%r4, %r3};
	ret;
}

.func  (.param .b32 func_retval0) _Z4add3ii(
	.param .b32 _Z4add3ii_param_0,
	.param .b32 _Z4add3ii_param_1
)
{
	.reg .b32 	%r<5>;

	ld.param.u32 	%r1, [_Z4add3ii_param_0];
	ld.param.u32 	%r2, [_Z4add3ii_param_1];
	mul.lo.s32 	%r3, %r1, 10;
	add.s32 	%r4, %r3, %r2;
	st.param.b32 	[func_retval0+0], %r4;
	ret;
}
`

func TestModuleGlobalsAndCalls(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, modulePTX)
	if _, err := m.Function("_Z4add3ii"); err == nil {
		t.Error("Function found a .func, want only entries")
	}
	po, bo := devBuf(t, d, 64)
	mustLaunch(t, d, m, "usetab", Dim{1, 1, 1}, Dim{8, 1, 1}, 0, params(po))
	out := u32s(bo)
	for i := 0; i < 8; i++ {
		if want := uint32(10*(i+1) + i); out[2*i] != want {
			t.Errorf("thread %d: call result %d, want %d", i, out[2*i], want)
		}
		if out[2*i+1] != 0xfffffffe {
			t.Errorf("thread %d: words[1] = %#x, want 0xfffffffe", i, out[2*i+1])
		}
	}
}

func TestLoadErrors(t *testing.T) {
	entry := func(body string) string {
		return ".visible .entry k(.param .u64 k_param_0)\n{\n\t.reg .b32 %r<4>;\n" + body + "\n\tret;\n}\n"
	}
	for _, tc := range []struct{ name, src, want string }{
		{"unknown register", entry("\tadd.s32 %r1, %r9, 1;"), "%r9"},
		{"unknown label", entry("\tbra.uni $L__nowhere;"), "$L__nowhere"},
		{"unknown symbol", entry("\tmov.u32 %r1, nosuchsym;"), "nosuchsym"},
		{"unbalanced braces", ".visible .entry k()\n{\n\tret;\n", "unbalanced"},
		{"bad module statement", ".bogus .u32 x;\n", "unknown module statement"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDevice().Load([]byte(ptxHeader + tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// Instructions the emulator does not run (unknown ones, sm_90's integer
// wgmma, sm_100's CTA pairs) load, so the module's other kernels run; a thread that
// reaches one fails the launch with the instruction named.
func TestUnsupportedFailsAtRun(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"unknown instruction", "\tfrobnicate.u32 %r1, %r2;", "frobnicate"},
		{"sm_90 integer wgmma", "\twgmma.mma_async.sync.aligned.m64n8k32.s32.s8.s8 {%r1, %r2, %r3, %r3}, %rd1, %rd1, 1;", "wgmma.mma_async inputs .s8.s8"},
		{"sm_100 CTA pair", "\ttcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32 [%r1], 32;", "cta_group::2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := ".visible .entry k(.param .u64 k_param_0)\n{\n\t.reg .b32 %r<4>;\n\t.reg .b64 %rd<2>;\n\t.reg .pred %p<2>;\n" +
				"\tmov.u32 %r1, %tid.x;\n\tsetp.ne.s32 %p1, %r1, 0;\n\t@%p1 bra $L_skip;\n" + tc.body + "\n$L_skip:\n\tret;\n}\n" +
				".visible .entry fine(.param .u64 fine_param_0)\n{\n\tret;\n}\n"
			d := NewDevice()
			m := loadPTX(t, d, src)
			if err := launch(t, d, m, "fine", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, make([]byte, 8)); err != nil {
				t.Fatalf("a kernel without the instruction failed: %v", err)
			}
			err := launch(t, d, m, "k", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, make([]byte, 8))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("launch error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// A .func that names module shared symbols (static and dynamic) must see
// them where its caller put them, even though the entry lays out another
// symbol first.
const funcSharedPTX = `
.shared .align 4 .b8 sa[256];
.shared .align 4 .b8 sb[256];
.extern .shared .align 16 .b8 dyn[];

.func  (.param .b32 func_retval0) peek(
	.param .b32 peek_param_0
)
{
	.reg .b32 	%r<10>;

	ld.param.u32 	%r1, [peek_param_0];
	shl.b32 	%r2, %r1, 2;
	mov.u32 	%r3, sb;
	add.s32 	%r4, %r3, %r2;
	ld.shared.u32 	%r5, [%r4];
	mov.u32 	%r6, dyn;
	add.s32 	%r7, %r6, %r2;
	ld.shared.u32 	%r8, [%r7];
	add.s32 	%r9, %r5, %r8;
	st.param.b32 	[func_retval0+0], %r9;
	ret;
}

.visible .entry fshared(
	.param .u64 fshared_param_0
)
{
	.reg .b32 	%r<12>;
	.reg .b64 	%rd<4>;

	ld.param.u64 	%rd1, [fshared_param_0];
	mov.u32 	%r1, %tid.x;
	shl.b32 	%r2, %r1, 2;
	mov.u32 	%r3, sa;
	add.s32 	%r4, %r3, %r2;
	st.shared.u32 	[%r4], 1;
	mov.u32 	%r5, sb;
	add.s32 	%r6, %r5, %r2;
	mul.lo.s32 	%r7, %r1, 100;
	st.shared.u32 	[%r6], %r7;
	mov.u32 	%r8, dyn;
	add.s32 	%r9, %r8, %r2;
	st.shared.u32 	[%r9], %r1;
	bar.sync 	0;
	{
	.param .b32 param0;
	st.param.b32 	[param0+0], %r1;
	.param .b32 retval0;
	call.uni (retval0), peek, (param0);
	ld.param.b32 	%r10, [retval0+0];
	}
	mul.wide.u32 	%rd2, %r1, 4;
	add.s64 	%rd3, %rd1, %rd2;
	st.global.u32 	[%rd3], %r10;
	ret;
}
`

func TestFuncSharedLayout(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, funcSharedPTX)
	po, bo := devBuf(t, d, 256)
	mustLaunch(t, d, m, "fshared", Dim{1, 1, 1}, Dim{64, 1, 1}, 256, params(po))
	for i, got := range u32s(bo) {
		if want := uint32(101 * i); got != want {
			t.Fatalf("thread %d: %d, want %d", i, got, want)
		}
	}
}

// Instruction forms the emulator does not implement must fail (at load, or
// when reached) instead of running as a different instruction: SIMD .s16x2
// as a plain add, min.xorsign.abs as min, cvt.pack as cvt, tf32 as an
// integer, .rz packing as .rn.
func TestRejectedForms(t *testing.T) {
	entry := func(body string) string {
		return ".visible .entry k(.param .u64 k_param_0)\n{\n\t.reg .b32 %r<8>;\n\t.reg .f32 %f<8>;\n" + body + "\n\tret;\n}\n"
	}
	for _, tc := range []struct{ name, body string }{
		{"add.s16x2", "\tadd.s16x2 %r1, %r2, %r3;"},
		{"min.xorsign.abs.f32", "\tmin.xorsign.abs.f32 %f1, %f2, %f3;"},
		{"cvt.pack", "\tcvt.pack.sat.s8.s32.b32 %r1, %r2, %r3, %r4;"},
		{"cvt.rna.tf32.f32", "\tcvt.rna.tf32.f32 %r1, %f1;"},
		{"cvt.rz.f16x2.f32", "\tcvt.rz.f16x2.f32 %r1, %f1, %f2;"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDevice()
			m, err := d.Load([]byte(ptxHeader + entry(tc.body)))
			if err != nil {
				return // rejected at load
			}
			defer m.Unload()
			p, _ := devBuf(t, d, 16)
			if err := launch(t, d, m, "k", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(p)); err == nil {
				t.Errorf("%s loaded and ran", tc.name)
			}
		})
	}
}

// Each call sequence declares its own param0, param1 and retval0: here .b32
// for the first call and .b64 for the second. The slots must fit the wider
// declarations (they were laid out for the first only: param1 then
// overlapped param0 and retval0 ran past the buffer).
const callParamsPTX = `
.func  (.param .b32 func_retval0) add32(.param .b32 add32_param_0, .param .b32 add32_param_1)
{
	.reg .b32 %r<4>;
	ld.param.u32 %r1, [add32_param_0];
	ld.param.u32 %r2, [add32_param_1];
	add.s32 %r3, %r1, %r2;
	st.param.b32 [func_retval0+0], %r3;
	ret;
}
.func  (.param .b64 func_retval0) add64(.param .b64 add64_param_0, .param .b64 add64_param_1)
{
	.reg .b64 %rd<4>;
	ld.param.u64 %rd1, [add64_param_0];
	ld.param.u64 %rd2, [add64_param_1];
	add.s64 %rd3, %rd1, %rd2;
	st.param.b64 [func_retval0+0], %rd3;
	ret;
}
.visible .entry calls(.param .u64 calls_param_0)
{
	.reg .b32 %r<4>;
	.reg .b64 %rd<8>;
	ld.param.u64 %rd1, [calls_param_0];
	{
	.param .b32 param0;
	st.param.b32 [param0+0], 5;
	.param .b32 param1;
	st.param.b32 [param1+0], 7;
	.param .b32 retval0;
	call.uni (retval0), add32, (param0, param1);
	ld.param.b32 %r1, [retval0+0];
	}
	{
	.param .b64 param0;
	st.param.b64 [param0+0], 0x100000000;
	.param .b64 param1;
	st.param.b64 [param1+0], 0x300000000;
	.param .b64 retval0;
	call.uni (retval0), add64, (param0, param1);
	ld.param.b64 %rd2, [retval0+0];
	}
	st.global.u32 [%rd1], %r1;
	st.global.u64 [%rd1+8], %rd2;
	ret;
}
`

func TestCallParamsRedeclared(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, callParamsPTX)
	po, bo := devBuf(t, d, 16)
	mustLaunch(t, d, m, "calls", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(po))
	if o := u32s(bo); o[0] != 12 || o[2] != 0 || o[3] != 4 {
		t.Errorf("add32(5, 7) = %d, add64(2^32, 3*2^32) = %#x; want 12, 0x400000000", o[0], uint64(o[3])<<32|uint64(o[2]))
	}
}
