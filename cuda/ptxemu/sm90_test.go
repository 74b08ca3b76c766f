package ptxemu

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

// stmPTX: each lane of one warp holds NUM registers, half h of register i
// being lane<<4 | i<<1 | h; stmatrix stores them at sm + 16*lane (matrix i
// at 128*i), the warp copies the 512 bytes to out, and ldmatrix of the same
// form reads them back into back[lane][i].
const stmPTX = `
.shared .align 16 .b8 sm[512];

.visible .entry stm(.param .u64 out, .param .u64 back)
{
	.reg .b32 %r<40>;
	.reg .b64 %rd<10>;

	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [back];
	mov.u32 %r1, %tid.x;
	shl.b32 %r2, %r1, 4;
	mov.u32 %r3, sm;
	add.s32 %r5, %r3, %r2;
VALUES
	bar.warp.sync -1;
	stmatrix.sync.aligned.m8n8.xNUMTRANS.shared.b16 [%r5], {REGS};
	bar.warp.sync -1;
	ld.shared.v4.u32 {%r20, %r21, %r22, %r23}, [%r5];
	cvt.u64.u32 %rd3, %r2;
	add.s64 %rd4, %rd1, %rd3;
	st.global.v4.u32 [%rd4], {%r20, %r21, %r22, %r23};
	ldmatrix.sync.aligned.m8n8.xNUMTRANS.shared.b16 {BACK}, [%r5];
	add.s64 %rd5, %rd2, %rd3;
STBACK
	ret;
}
`

// TestStmatrix checks stmatrix against the PTX ISA's fragment (row l/4,
// columns 2*(l%4)+{0,1} of matrix i in register i; transposed with .trans)
// and against ldmatrix, which must read the registers back.
func TestStmatrix(t *testing.T) {
	for _, tc := range []struct {
		num   int
		trans bool
	}{{1, false}, {2, true}, {4, false}, {4, true}} {
		t.Run(fmt.Sprintf("x%d trans=%v", tc.num, tc.trans), func(t *testing.T) {
			var vals, regs, back, stb []string
			for i := range tc.num {
				vals = append(vals, fmt.Sprintf("\tor.b32 %%r%d, %%r2, %d;\n\tor.b32 %%r%d, %%r2, %d;\n\tprmt.b32 %%r%d, %%r%d, %%r%d, 0x5410;\n",
					30, 2*i, 31, 2*i+1, 10+i, 30, 31))
				regs = append(regs, fmt.Sprintf("%%r%d", 10+i))
				back = append(back, fmt.Sprintf("%%r%d", 24+i))
				stb = append(stb, fmt.Sprintf("\tst.global.u32 [%%rd5+%d], %%r%d;\n", 4*i, 24+i))
			}
			tr := ""
			if tc.trans {
				tr = ".trans"
			}
			body := strings.NewReplacer("VALUES", strings.Join(vals, ""), "NUM", fmt.Sprint(tc.num), "TRANS", tr,
				"REGS", strings.Join(regs, ", "), "BACK", strings.Join(back, ", "), "STBACK", strings.Join(stb, "")).Replace(stmPTX)
			d := NewDevice()
			mod, err := d.Load([]byte(sm90Header + body))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			t.Cleanup(mod.Unload)
			out, ob := devBuf(t, d, 512)
			bk, bb := devBuf(t, d, 512)
			mustLaunch(t, d, mod, "stm", Dim{1, 1, 1}, Dim{32, 1, 1}, 0, params(out, bk))
			for i := range tc.num {
				for r := range 8 {
					for j := range 8 {
						lane, h := 4*r+j/2, j%2 // the fragment's (r, j)
						if tc.trans {
							lane, h = 4*j+r/2, r%2
						}
						want := uint16(lane<<4 | i<<1 | h)
						if got := binary.LittleEndian.Uint16(ob[128*i+16*r+2*j:]); got != want {
							t.Fatalf("matrix %d row %d col %d = %#x, want %#x", i, r, j, got, want)
						}
					}
				}
				for lane := range 32 {
					want := uint32(lane<<4|i<<1) | uint32(lane<<4|i<<1|1)<<16
					if got := binary.LittleEndian.Uint32(bb[16*lane+4*i:]); got != want {
						t.Fatalf("ldmatrix back: lane %d register %d = %#x, want %#x", lane, i, got, want)
					}
				}
			}
		})
	}
}

// snrPTX: warpgroup 0 (warp ODD differing) runs setmaxnreg.dec, the others
// setmaxnreg.inc.
const snrPTX = `
.visible .entry snr()
{
	.reg .b32 %r<10>;
	.reg .pred %p<4>;

	mov.u32 %r1, %tid.x;
	shr.u32 %r2, %r1, 7;
	shr.u32 %r3, %r1, 5;
	setp.eq.u32 %p1, %r2, 0;
	@%p1 bra PROD;
	setmaxnreg.inc.sync.aligned.u32 INC;
	ret;
PROD:
	setp.eq.u32 %p2, %r3, ODD;
	@%p2 bra OTHER;
	setmaxnreg.dec.sync.aligned.u32 DEC;
	ret;
OTHER:
	setmaxnreg.DIR.sync.aligned.u32 OTHERN;
	ret;
}
`

// TestSetmaxnreg: counts the hardware takes pass; a warpgroup that
// disagrees, a block over 64K registers and a bad count fail.
func TestSetmaxnreg(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		threads              int
		inc, dec, other, dir string
		want                 string // error text; "" passes
	}{
		{"producer and two consumers", 384, "232", "40", "40", "dec", ""},
		{"one consumer", 256, "240", "24", "24", "dec", ""},
		{"warps of a warpgroup differ", 256, "232", "40", "48", "dec", "ask for"},
		{"inc and dec in a warpgroup", 256, "232", "40", "40", "inc", "ask for 40 and 40"},
		{"over 64K registers", 384, "240", "56", "56", "dec", "more than the SM's 65536"},
		{"count not a multiple of 8", 256, "236", "40", "40", "dec", "multiple of 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.NewReplacer("INC", tc.inc, "DEC", tc.dec, "OTHERN", tc.other, "DIR", tc.dir, "ODD", "2").Replace(snrPTX)
			d := NewDevice()
			mod, err := d.Load([]byte(sm90Header + body))
			if err == nil {
				t.Cleanup(mod.Unload)
				err = launch(t, d, mod, "snr", Dim{1, 1, 1}, Dim{uint32(tc.threads), 1, 1}, 0, nil)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}
