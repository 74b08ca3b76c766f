package main

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/cuda/kcheck"
)

func TestRoofline(t *testing.T) {
	b200, h100 := rooflineGPUs["b200"], rooflineGPUs["h100"]
	rows := rooflineRows(kcheck.Flash, []int{1, 4096}, b200, h100)
	find := func(op, shape string, tok int) roofRow {
		for _, r := range rows {
			if r.op == op && r.shape == shape && r.tokens == tok {
				return r
			}
		}
		t.Fatalf("no row %s %s %d", op, shape, tok)
		return roofRow{}
	}
	for _, tc := range []struct {
		op, shape string
		tok       int
		us        float64
		bound     string
	}{
		// 2·4096·4096·8192 FLOP at 4.5 PFLOP/s.
		{"linear_fp8", "wo_b", 4096, 2 * 4096 * 4096 * 8192 / 4.5e15 * 1e6, "compute"},
		// NVFP4 at 4096 tokens on B200: the BF16 MMA bounds it (2·24576·4096·4096 FLOP at 2.25 PFLOP/s).
		{"moe_nvfp4", "expert_w13", 4096, 2 * 24576 * 4096 * 4096 / 2.25e15 * 1e6, "compute"},
		// One token: 6 experts of 4096x4096 FP4 codes + per-32 scales, at 8 TB/s (+ the token's bytes
		// and h: 2048 FP8 values and their scales a row, the SwiGLU being fused).
		{"moe_mxfp4", "expert_w13", 1, (6*(4096*4096/2+4096*4096/32) + 6*4096*(1+1.0/128) + 6*2048*(1+1.0/128)) / 8e12 * 1e6, "memory"},
		{"moe_mxfp4", "expert_w2", 1, (6*(4096*2048/2+4096*2048/32) + 6*2048*(1+1.0/128) + 2*6*4096) / 8e12 * 1e6, "memory"},
	} {
		r := find(tc.op, tc.shape, tc.tok)
		if math.Abs(r.us-tc.us) > 1e-6*tc.us || r.bound != tc.bound {
			t.Errorf("%s %s %d tokens: %.4f µs %s, want %.4f µs %s", tc.op, tc.shape, tc.tok, r.us, r.bound, tc.us, tc.bound)
		}
		if r.usBase <= r.us {
			t.Errorf("%s %s: H100 %.2f µs not slower than B200 %.2f", tc.op, tc.shape, r.usBase, r.us)
		}
	}
	// H100 (moe_fp4_wg, moe_swiglu_q apart) writes bf16 g and u.
	if r, want := find("moe_mxfp4", "expert_w13", 1), (6*(4096*4096/2+4096*4096/32)+6*4096*(1+1.0/128)+2*6*4096)/3.35e12*1e6; math.Abs(r.usBase-want) > 1e-6*want {
		t.Errorf("H100 expert_w13 at 1 token: %.4f µs, want %.4f", r.usBase, want)
	}
	var out bytes.Buffer
	if err := runRoofline([]string{"--model", "flash", "--tokens", "1"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "flash decode step floor, batch 1") {
		t.Errorf("no decode projection in:\n%s", out.String())
	}
	if err := runRoofline([]string{"--gpu", "x"}, &out, &out); err == nil {
		t.Error("unknown GPU accepted")
	}
}
