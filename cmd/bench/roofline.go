package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda/kcheck"
)

// `bench roofline` projects the GEMMs' times from bytes and FLOPs alone (no
// GPU): max(bytes / bandwidth, FLOPs / peak) per Flash and Pro shape, for a
// GPU and for H100 beside it, and a decode step's weight-read floor for the
// full model. The peak is the rate of the MMA our kernel runs on that GPU:
// FP8 for the dense linears; on Blackwell FP8 for MXFP4 experts
// (kind::mxf8f6f4) and BF16 for NVFP4 (kind::f16, docs/blackwell.md); on
// Hopper BF16 for both (moe_fp4_wg). The FP4 column is the rate kind::mxf4
// would give with FP4 activations. The expert w13 GEMM writes bf16 g and u,
// or on Blackwell, whose epilogue fuses the SwiGLU and the re-quantisation,
// h in FP8 with its scales.

type gpuPeaks struct {
	name                string
	tbs, bf16, fp8, fp4 float64 // TB/s, dense PFLOP/s
	moeFP8              bool    // MXFP4 experts multiply at the FP8 rate (else BF16)
	fusedSwiGLU         bool    // the expert w13 GEMM writes FP8 h (moe_fp4_tc_swiglu), not bf16 g and u
}

var rooflineGPUs = map[string]gpuPeaks{
	"b200": {"B200", 8, 2.25, 4.5, 9, true, true},
	"h100": {"H100 SXM", 3.35, 0.989, 1.979, 0, false, false},
	"h200": {"H200", 4.8, 0.989, 1.979, 0, false, false},
}

// moePeak is the MMA rate of our expert GEMM for the format on g.
func (g gpuPeaks) moePeak(nvfp4 bool) float64 {
	if g.moeFP8 && !nvfp4 {
		return g.fp8
	}
	return g.bf16
}

// roofRow is one projected GEMM.
type roofRow struct {
	op, shape         string
	tokens            int
	bytes, flops      float64
	us, usFP4, usBase float64
	bound             string
}

// gemmRoof is max(bytes/bw, flops/peak) in µs and which bound it is.
func gemmRoof(bytes, flops, tbs, pf float64) (float64, string) {
	tm, tc := bytes/(tbs*1e12)*1e6, flops/(pf*1e15)*1e6
	if tc > tm {
		return tc, "compute"
	}
	return tm, "memory"
}

// rooflineRows are the dense FP8 linears (weights, 128x128 scales, FP8
// activations in, bf16 out) and the MXFP4 expert GEMMs (the experts the
// tokens route to under uniform routing, codes and scales per 32) of m.
func rooflineRows(m kcheck.Model, toks []int, g, base gpuPeaks) []roofRow {
	var rows []roofRow
	add := func(op, shape string, t int, bytes, baseBytes, flops, peak, basePeak float64, fp4 bool) {
		r := roofRow{op: op, shape: shape, tokens: t, bytes: bytes, flops: flops}
		r.us, r.bound = gemmRoof(bytes, flops, g.tbs, peak)
		r.usFP4 = r.us
		if fp4 && g.fp4 > 0 {
			r.usFP4, _ = gemmRoof(bytes, flops, g.tbs, g.fp4)
		}
		r.usBase, _ = gemmRoof(baseBytes, flops, base.tbs, basePeak)
		rows = append(rows, r)
	}
	for _, d := range denseShapes[m.Name] {
		for _, t := range toks {
			n, k, tt := float64(d.n), float64(d.k), float64(t)
			bytes := n*k + math.Ceil(n/128)*(k/128) + tt*k*(1+1.0/128) + 2*tt*n
			add("linear_fp8", d.name, t, bytes, bytes, 2*tt*n*k, g.fp8, base.fp8, false)
		}
	}
	e := float64(m.Experts)
	for _, nv := range []bool{false, true} {
		op, group := "moe_mxfp4", 32.0
		if nv {
			op, group = "moe_nvfp4", 16
		}
		for _, t := range toks {
			rows_ := float64(t * m.K)
			active := e * (1 - math.Pow(1-float64(m.K)/e, float64(t)))
			for _, p := range []struct {
				name string
				n, k int
			}{{"expert_w13", 2 * m.Inter, m.D}, {"expert_w2", m.D, m.Inter}} {
				n, k := float64(p.n), float64(p.k)
				in := active*(n*k/2+n*k/group) + rows_*k*(1+1.0/128)
				out := func(gp gpuPeaks) float64 {
					if gp.fusedSwiGLU && p.name == "expert_w13" {
						return rows_ * n / 2 * (1 + 1.0/128) // h: e4m3 and a scale per 128
					}
					return 2 * rows_ * n
				}
				add(op, p.name, t, in+out(g), in+out(base), 2*rows_*n*k, g.moePeak(nv), base.moePeak(nv), true)
			}
		}
	}
	return rows
}

func runRoofline(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench roofline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gpu := fs.String("gpu", "b200", "projected GPU: b200, h100 or h200")
	baseName := fs.String("vs", "h100", "GPU projected beside it")
	models := fs.String("model", "flash,pro", "models whose shapes to project")
	tokens := fs.String("tokens", "1,8,64,512,4096", "token counts")
	if err := fs.Parse(args); err != nil {
		return err
	}
	g, ok := rooflineGPUs[*gpu]
	base, ok2 := rooflineGPUs[*baseName]
	if !ok || !ok2 {
		return fmt.Errorf("--gpu %q / --vs %q: want b200, h100 or h200", *gpu, *baseName)
	}
	toks, err := parseTokenCounts(*tokens)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "roofline: %s %.2f TB/s, %.3g PFLOP/s BF16, %.3g FP8, %.3g FP4; beside %s %.2f TB/s, %.3g BF16, %.3g FP8\n",
		g.name, g.tbs, g.bf16, g.fp8, g.fp4, base.name, base.tbs, base.bf16, base.fp8)
	for _, name := range strings.Split(*models, ",") {
		var m kcheck.Model
		switch name {
		case "flash":
			m = kcheck.Flash
		case "pro":
			m = kcheck.Pro
		default:
			return fmt.Errorf("--model %q, want flash and/or pro", name)
		}
		fmt.Fprintf(stdout, "\n%-5s %-10s %-11s %6s %10s %10s %10s %10s %10s %8s\n", "model", "op", "shape", "tokens", "MB", "GFLOP",
			g.name+" µs", "FP4-MMA µs", base.name+" µs", "bound")
		for _, r := range rooflineRows(m, toks, g, base) {
			fmt.Fprintf(stdout, "%-5s %-10s %-11s %6d %10.2f %10.2f %10.2f %10.2f %10.2f %8s\n", m.Name, r.op, r.shape, r.tokens,
				r.bytes/1e6, r.flops/1e9, r.us, r.usFP4, r.usBase, r.bound)
		}
		if err := printDecodeProjection(stdout, name, g, base); err != nil {
			return err
		}
	}
	return nil
}

// printDecodeProjection prints the full model's decode-step floor (every
// weight read once, the routed experts the batch reaches) on both GPUs.
func printDecodeProjection(out io.Writer, preset string, g, base gpuPeaks) error {
	c, err := checkpoint.PresetConfig(preset)
	if err != nil {
		return err
	}
	if c == nil {
		return errors.New("no config")
	}
	for _, batch := range []int{1, 8, 64} {
		b := float64(decodeFloorBytes(c, checkpoint.OfficialFormats, batch))
		fmt.Fprintf(out, "%s decode step floor, batch %d, %d layers: %.2f GB -> %s %.3f ms, %s %.3f ms\n",
			preset, batch, c.Layers, b/1e9, g.name, b/(g.tbs*1e12)*1e3, base.name, b/(base.tbs*1e12)*1e3)
	}
	return nil
}
