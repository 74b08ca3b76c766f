package ptxemu

import (
	"strings"
	"testing"
)

// Faults: each launch must fail promptly with the right kind of error

const faultPTX = `
.visible .entry oob(
	.param .u64 oob_param_0
)
{
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [oob_param_0];
	ld.global.u32 	%r1, [%rd1+4096];
	st.global.u32 	[%rd1], %r1;
	ret;
}

.visible .entry twobars(
	.param .u64 twobars_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<2>;

	mov.u32 	%r1, %tid.x;
	setp.lt.u32 	%p1, %r1, 32;
	@%p1 bra 	$L__BB1_2;
	bar.sync 	1;
	ret;
$L__BB1_2:
	bar.sync 	0;
	ret;
}

.visible .entry halfexit(
	.param .u64 halfexit_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<2>;

	mov.u32 	%r1, %tid.x;
	setp.lt.u32 	%p1, %r1, 32;
	@%p1 bra 	$L__BB2_2;
	bar.sync 	1, 64;
$L__BB2_2:
	exit;
}

.visible .entry shflbar(
	.param .u64 shflbar_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<3>;

	mov.u32 	%r1, %tid.x;
	setp.ne.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB3_2;
	shfl.sync.idx.b32 	%r2, %r1, 0, 31, -1;
$L__BB3_2:
	bar.sync 	0;
	ret;
}

.visible .entry spin(
	.param .u64 spin_param_0
)
{
	.reg .b32 	%r<2>;

	mov.u32 	%r1, 0;
$L__BB4_1:
	add.s32 	%r1, %r1, 1;
	bra.uni 	$L__BB4_1;
}

.visible .entry misaligned(
	.param .u64 misaligned_param_0
)
{
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<2>;

	ld.param.u64 	%rd1, [misaligned_param_0];
	ld.global.v2.u32 	{%r1, %r2}, [%rd1+4];
	st.global.u32 	[%rd1], %r1;
	ret;
}

.visible .entry traps(
	.param .u64 traps_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<2>;

	mov.u32 	%r1, %tid.x;
	setp.ne.s32 	%p1, %r1, 5;
	@%p1 bra 	$L__BB5_2;
	trap;
$L__BB5_2:
	bar.sync 	0;
	ret;
}
`

func TestFaults(t *testing.T) {
	d := NewDevice()
	d.MaxSteps = 1000
	d.Parallel = 2
	m := loadPTX(t, d, faultPTX)
	p, _ := devBuf(t, d, 16)
	for _, tc := range []struct {
		kernel            string
		grid              uint32
		illegal, deadlock bool
		inst, msg         string
	}{
		{kernel: "oob", grid: 1, illegal: true, inst: "ld.global.u32", msg: "illegal address"},
		{kernel: "misaligned", grid: 1, illegal: true, inst: "ld.global.v2.u32", msg: "misaligned address"},
		{kernel: "twobars", grid: 3, deadlock: true, inst: "bar.sync", msg: "deadlock"},
		{kernel: "halfexit", grid: 3, deadlock: true, msg: "deadlock"},
		{kernel: "shflbar", grid: 1, deadlock: true, msg: "deadlock"},
		{kernel: "spin", grid: 4, inst: "", msg: "step limit"},
		{kernel: "traps", grid: 2, inst: "trap", msg: "trap"},
	} {
		t.Run(tc.kernel, func(t *testing.T) {
			err := launch(t, d, m, tc.kernel, Dim{tc.grid, 1, 1}, Dim{64, 1, 1}, 0, params(p))
			if err == nil {
				t.Fatal("launch succeeded")
			}
			le := asLaunchError(t, err)
			if le.Kernel != tc.kernel || le.Illegal != tc.illegal || le.Deadlock != tc.deadlock {
				t.Errorf("kernel %q illegal %v deadlock %v, want %q %v %v (%v)", le.Kernel, le.Illegal, le.Deadlock, tc.kernel, tc.illegal, tc.deadlock, err)
			}
			if !strings.Contains(le.Inst, tc.inst) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q (inst %q), want inst %q and %q", err, le.Inst, tc.inst, tc.msg)
			}
		})
	}
}
