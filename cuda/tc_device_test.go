package cuda_test

import (
	"testing"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/kcheck"
)

// The sm_100a tcgen05 kernels (FP8 linear; MoE over MXFP4 and NVFP4 experts;
// the w1/w3 GEMM with the SwiGLU epilogue, also bit for bit against the
// unfused path) against their CPU twins at small shapes: token
// tails, column tails, experts without rows, rows no expert owns, several
// experts, every token tile (16 to 128), one accumulator stage (128 tokens
// of gate and up). It runs on a compute capability
// 10.x GPU, or on the emulated one (scripts/emu-test.sh with
// MEGAMOE_EMU=sm_100a), which runs the committed PTX fixtures.
func TestTCKernels(t *testing.T) {
	ses, err := cuda.OpenSession(0)
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	t.Cleanup(ses.Close)
	if !ses.Ctx.HasTC() {
		t.Skipf("%s (compute %d.%d) has no sm_100a tcgen05 path", ses.Device.Name, ses.Device.Major, ses.Device.Minor)
	}
	cases := []kcheck.Case{
		kcheck.LinearCase(1, 128, 128, 1),
		kcheck.LinearCase(5, 264, 256, 5),
		kcheck.LinearCase(20, 128, 128, 20),
		kcheck.LinearCase(40, 136, 384, 40),
		kcheck.MoECase(4, 6, 128, 256, cuda.MXFP4, kcheck.RouteUniform, 6),
		kcheck.MoECase(8, 40, 264, 128, cuda.MXFP4, kcheck.RouteSkewed, 40),
		kcheck.MoECase(3, 150, 136, 256, cuda.MXFP4, kcheck.RouteGap, 150),
		kcheck.MoECase(4, 6, 128, 256, cuda.NVFP4, kcheck.RouteUniform, 6),
		kcheck.MoECase(8, 40, 264, 128, cuda.NVFP4, kcheck.RouteSkewed, 40),
		kcheck.MoECase(3, 150, 136, 256, cuda.NVFP4, kcheck.RouteGap, 150),
		kcheck.MoEGateUpCase(4, 6, 256, 256, cuda.MXFP4, kcheck.RouteUniform, true, true, 0),
		kcheck.MoEGateUpCase(8, 40, 128, 128, cuda.NVFP4, kcheck.RouteSkewed, false, true, 0),
		kcheck.MoEGateUpCase(3, 70, 128, 256, cuda.MXFP4, kcheck.RouteGap, false, false, 30),
		kcheck.MoEGateUpCase(3, 150, 256, 128, cuda.NVFP4, kcheck.RouteGap, true, true, 40),
		kcheck.MoEGateUpCase(2, 300, 128, 128, cuda.MXFP4, kcheck.RouteUniform, true, true, 40),
		kcheck.MoEGateUpCase(2, 300, 128, 128, cuda.NVFP4, kcheck.RouteUniform, false, true, 40),
	}
	if !testing.Short() {
		cases = append(cases, kcheck.LinearCase(130, 256, 256, 130), kcheck.MoECase(2, 300, 128, 128, cuda.MXFP4, kcheck.RouteWideScales, 300),
			kcheck.MoECase(2, 300, 128, 128, cuda.NVFP4, kcheck.RouteWideScales, 300))
	}
	env := &kcheck.Env{Ctx: ses.Ctx, S: ses.S, Seed: 38}
	defer env.Close()
	for _, c := range cases {
		t.Run(c.Component+" "+c.Shape, func(t *testing.T) {
			r := kcheck.Run(env, c)
			t.Log(kcheck.Row(r))
			if r.Err != nil || !r.Pass {
				t.Errorf("%s", kcheck.Row(r))
			}
		})
	}
}
