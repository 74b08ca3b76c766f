package ptxemu

import "testing"

// An inline asm block inlined twice declares the same predicate and labels
// twice; each copy must branch within itself. A scoped %rs<2> shadows the
// function's %rs1, and a nested scope sees its parent's names.
const scopePTX = `
.visible .entry scopes(.param .u64 out)
{
	.reg .b32 %r<8>;
	.reg .b16 %rs<3>;
	.reg .b64 %rd<4>;

	ld.param.u64 %rd1, [out];
	mov.u32 %r1, %tid.x;
	mov.u16 %rs1, 7;
	mov.u32 %r2, 0;
	{
	.reg .pred P1;
	setp.lt.u32 P1, %r1, 16;
	@P1 bra DONE;
	add.u32 %r2, %r2, 1;
	DONE:
	}
	{
	.reg .pred P1;
	setp.ge.u32 P1, %r1, 8;
	@!P1 bra DONE;
	add.u32 %r2, %r2, 10;
	DONE:
	}
	{
	.reg .b16 %rs<2>;
	mov.u16 %rs1, 100;
	{
	.reg .b32 t;
	cvt.u32.u16 t, %rs1;
	add.u32 %r2, %r2, t;
	}
	}
	cvt.u32.u16 %r3, %rs1;
	add.u32 %r2, %r2, %r3;
	mul.wide.u32 %rd2, %r1, 4;
	add.s64 %rd3, %rd1, %rd2;
	st.global.u32 [%rd3], %r2;
	ret;
}
`

func TestInlineAsmScopes(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, scopePTX)
	out, ob := devBuf(t, d, 32*4)
	mustLaunch(t, d, m, "scopes", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, params(out))
	for tid, g := range u32s(ob) {
		want := uint32(107)
		if tid >= 16 {
			want++
		}
		if tid >= 8 {
			want += 10
		}
		if g != want {
			t.Errorf("thread %d = %d, want %d", tid, g, want)
		}
	}
}
