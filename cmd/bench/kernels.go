package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/kcheck"
)

// denseShapes are the FP8 linears of each model (name, N, K) as
// scripts/torch_baseline.py times them: attention projections and the shared
// expert (gate|up fused, down).
var denseShapes = map[string][]struct {
	name string
	n, k int
}{
	"flash": {{"wq_a", 1024, 4096}, {"wq_b", 32768, 1024}, {"wkv", 512, 4096}, {"wo_b", 4096, 8192}, {"shared_w13", 4096, 4096}, {"shared_w2", 4096, 2048}},
	"pro":   {{"wq_a", 1536, 7168}, {"wq_b", 65536, 1536}, {"wkv", 512, 7168}, {"wo_b", 7168, 16384}, {"shared_w13", 6144, 7168}, {"shared_w2", 7168, 3072}},
}

// gemvShapes are the grouped FP8 GEMVs of each model (wo_a: o_groups x
// o_lora_rank rows, each group reading heads*head_dim/o_groups values).
var gemvShapes = map[string]struct{ n, k, r int }{
	"flash": {8 * 1024, 64 * 512 / 8, 1024},
	"pro":   {16 * 1024, 128 * 512 / 16, 1024},
}

// kernelRecord is one JSON line of `bench kernels --json`.
type kernelRecord struct {
	Kind   string  `json:"kind"` // "ours" or "copy"
	Model  string  `json:"model,omitempty"`
	Op     string  `json:"op,omitempty"`    // linear_fp8 | moe_fp4 | gemv_fp8
	Path   string  `json:"path,omitempty"`  // kernel path: dec, tiled, wg; the auto choice has Auto set
	Auto   bool    `json:"auto,omitempty"`  // the path the launcher picks by itself
	Shape  string  `json:"shape"`           // shape name (wq_a, expert_w13 mxfp4, ...)
	Tokens int     `json:"m,omitempty"`     // tokens (MoE: before top-k)
	N      int     `json:"n,omitempty"`     //
	K      int     `json:"k,omitempty"`     //
	Us     float64 `json:"us"`              // median kernel time
	GBs    float64 `json:"gbs"`             // bytes actually moved / time
	TFLOPs float64 `json:"tflops"`          //
	Pass   bool    `json:"pass"`            // the sampled rows matched the CPU twin
	Err    string  `json:"error,omitempty"` //
}

// runKernels times our GEMM kernels at the real shapes and token counts (each
// run also checks sampled rows against the CPU twin) next to the device's
// copy bandwidth; --json writes the records scripts/perf_report.py reads.
func runKernels(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench kernels", flag.ContinueOnError)
	fs.SetOutput(stderr)
	models := fs.String("model", "flash,pro", "models whose shapes to time")
	tokens := fs.String("tokens", "1,8,64,512,4096", "token counts")
	reps := fs.Int("reps", 20, "timed launches per case (median)")
	only := fs.String("only", "", "run only shapes whose op or name contains this")
	allPaths := fs.Bool("paths", false, "time every kernel path that applies to a shape, not only the one picked")
	onlyPath := fs.String("path", "", fmt.Sprintf("with --paths: time only this path (dec, decsk, deccta, decf16, decmap, decpre, decwg, tiled, or a wgmma variant: %v)", cuda.WGPaths()))
	torchPath := fs.String("torch", "", "JSON lines of scripts/torch_baseline.py: each FP8 linear's share of torch._scaled_mm's speed, and with --paths the fastest path of each shape")
	jsonPath := fs.String("json", "", "also write one JSON record per line to this file")
	flushMode := fs.String("flush", "write", "how L2 is emptied before each timed launch: write (a 128 MiB memset: L2 left dirty) or read (a 128 MiB read: L2 left clean)")
	ixDepths := []int{32 << 10, 128 << 10, 1 << 20}
	fs.Func("context", "depths (tokens, e.g. 32K,128K,1M) of the indexer cases (op indexer: scores, topk, scores+topk; default 32K,128K,1M)", func(v string) error {
		d, err := parseDepths(v)
		ixDepths = d
		return err
	})
	ixBatch := fs.String("batch", "1,8", "sequences of the indexer cases (one decode row each)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	flush, err := kcheck.ParseFlush(*flushMode)
	if err != nil {
		return fmt.Errorf("--flush: %w", err)
	}
	toks, err := parseTokenCounts(*tokens)
	if err != nil {
		return err
	}
	if *reps < 1 {
		return errors.New("--reps must be >= 1")
	}
	var ixBatches []int
	for _, v := range strings.Split(*ixBatch, ",") {
		b, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || b < 1 || b > 1024 {
			return fmt.Errorf("--batch: %q is not a count in [1, 1024]", v)
		}
		ixBatches = append(ixBatches, b)
	}
	for _, d := range ixDepths {
		if d < ixRatio || d > 1<<24 {
			return fmt.Errorf("--context: %d tokens, want %d to %d", d, ixRatio, 1<<24)
		}
	}
	var torch map[torchKey]float64
	if *torchPath != "" {
		if torch, err = loadTorchFP8(*torchPath); err != nil {
			return err
		}
	}
	var ms []kcheck.Model
	for _, name := range strings.Split(*models, ",") {
		switch name {
		case "flash":
			ms = append(ms, kcheck.Flash)
		case "pro":
			ms = append(ms, kcheck.Pro)
		default:
			return fmt.Errorf("--model %q, want flash and/or pro", name)
		}
	}
	ses, err := cuda.OpenSession(0)
	if err != nil {
		return err
	}
	defer ses.Close()
	drv, dev, ctx, s := ses.Driver, ses.Device, ses.Ctx, ses.S
	if err := ctx.LoadModules(); err != nil {
		return err
	}
	var out io.Writer = io.Discard
	if *jsonPath != "" {
		f, err := os.Create(*jsonPath)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	enc := json.NewEncoder(out)
	fmt.Fprintf(stdout, "device: %s, %d SMs, driver CUDA %d.%d, %s\n", dev.Name, dev.SMs, drv.Version()/1000, drv.Version()%1000/10, time.Now().UTC().Format(time.RFC3339))
	gbs, err := copyBandwidth(ctx, s, *reps)
	if err != nil {
		return fmt.Errorf("copy bandwidth: %w", err)
	}
	fmt.Fprintf(stdout, "device-to-device copy: %.0f GB/s (1 GiB, read + write); L2 flushed by a 128 MiB %s before each launch\n", gbs, *flushMode)
	if err := enc.Encode(kernelRecord{Kind: "copy", Shape: "1 GiB d2d", GBs: gbs, Pass: true}); err != nil {
		return err
	}
	env := &kcheck.Env{Ctx: ctx, S: s, Reps: *reps, Seed: uint64(time.Now().UnixNano()), ShareWeights: true, Flush: flush}
	defer env.Close()
	failed := 0
	var linRecs []kernelRecord // for the fastest-path summary
	for _, m := range ms {
		type job struct {
			op, shape string
			t, n, k   int
			paths     []cuda.Path
			c         kcheck.Case
		}
		var jobs []job
		for _, d := range denseShapes[m.Name] {
			for _, t := range toks {
				jobs = append(jobs, job{"linear_fp8", d.name, t, d.n, d.k, ctx.LinearPaths(t, d.n, d.k), kcheck.LinearCase(t, d.n, d.k, 8)})
			}
		}
		if g, ok := gemvShapes[m.Name]; ok {
			for _, t := range toks {
				if t <= 8 { // the decode GEMV's rows
					jobs = append(jobs, job{"gemv_fp8", "wo_a", t, g.n, g.k, []cuda.Path{cuda.PathDec}, kcheck.GemvFP8Case(t, g.n, g.k, g.r)})
				}
				if t <= cuda.BF16DecMaxRows { // linear_bf16_dec, what faithful decode runs
					jobs = append(jobs, job{"gemv_mma", "wo_a", t, g.n, g.k, []cuda.Path{cuda.PathDec}, kcheck.GemvMMACase(t, g.n, g.k, g.r, cuda.WeightFP8Block)})
				}
			}
		}
		// The head (fp32 linear, bf16 weights): the SIMT GEMV (gemv1 at one
		// token, gemvr's pick at 2-8: what the backend runs), gemvr's other
		// variants, and linear_bf16x3_dec (the backend's path at 9-32).
		for _, t := range toks {
			if t <= 8 {
				jobs = append(jobs, job{"gemv_f32", "head_simt", t, kcheck.HeadVocab, m.D, []cuda.Path{cuda.PathDec}, kcheck.GemvF32Case(t, kcheck.HeadVocab, m.D, false)})
			}
			for i, g := range cuda.GemvRowsVariants(t) {
				if i > 0 {
					jobs = append(jobs, job{"gemv_f32", "head_rows_" + g.String(), t, kcheck.HeadVocab, m.D, []cuda.Path{cuda.PathDec}, kcheck.GemvRowsCase(t, kcheck.HeadVocab, m.D, g)})
				}
			}
			if cuda.BF16x3DecFits(cuda.LinearShape{M: t, N: kcheck.HeadVocab, K: m.D, R: kcheck.HeadVocab, LdX: m.D, Format: cuda.WeightBF16}, 0, 0) {
				jobs = append(jobs, job{"gemv_f32", "head_x3", t, kcheck.HeadVocab, m.D, []cuda.Path{cuda.PathDec}, kcheck.GemvF32Case(t, kcheck.HeadVocab, m.D, true)})
			}
		}
		for _, f := range []cuda.FP4Format{cuda.MXFP4, cuda.NVFP4} {
			for _, t := range toks {
				rows := t * m.K
				for _, p := range []struct {
					name string
					n, k int
				}{{"expert_w13 ", 2 * m.Inter, m.D}, {"expert_w2 ", m.D, m.Inter}} {
					sh := cuda.MoEShape{Experts: m.Experts, Rows: rows, N: p.n, K: p.k, Format: f}
					jobs = append(jobs, job{"moe_fp4", p.name + f.String(), t, p.n, p.k, ctx.MoEPaths(sh),
						kcheck.MoECase(m.Experts, rows, p.n, p.k, f, kcheck.RouteUniform, 8)})
				}
			}
		}
		sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].op < jobs[j].op })
		for _, j := range jobs {
			if *only != "" && !strings.Contains(j.op+" "+j.shape, *only) {
				continue
			}
			paths := j.paths[:1]
			if *allPaths {
				paths = j.paths
			}
			for i, path := range paths {
				if *onlyPath != "" && string(path) != *onlyPath {
					continue
				}
				kc := cuda.KernelChoice{Linear: path}
				if j.op == "moe_fp4" {
					kc = cuda.KernelChoice{MoE: path}
				}
				if err := ctx.SetKernelChoice(kc); err != nil {
					return err
				}
				r := kcheck.Run(env, j.c)
				rec := kernelRecord{Kind: "ours", Model: m.Name, Op: j.op, Path: string(path), Auto: i == 0, Shape: j.shape, Tokens: j.t, N: j.n, K: j.k,
					Us: r.TimeUs, GBs: r.GBs, TFLOPs: r.TFLOPs, Pass: r.Pass}
				if r.Err != nil {
					rec.Err = r.Err.Error()
				}
				if !r.Pass {
					failed++
				}
				vsTorch := ""
				if j.op == "linear_fp8" {
					linRecs = append(linRecs, rec)
					if pc := torchPct(torch, m.Name, j.shape, j.t, r.TimeUs); pc > 0 {
						vsTorch = fmt.Sprintf(" (%5.1f%% of torch fp8)", pc)
					}
				}
				fmt.Fprintf(stdout, "%-5s %-10s %-5s %-18s tokens %5d  n %6d k %6d  %9.1f us %7.0f GB/s (%4.1f%% of copy) %6.1f TF/s%s  %s\n",
					m.Name, j.op, path, j.shape, j.t, j.n, j.k, r.TimeUs, r.GBs, 100*r.GBs/gbs, r.TFLOPs, vsTorch, passStr(r))
				if err := enc.Encode(rec); err != nil {
					return err
				}
			}
		}
		if err := ctx.SetKernelChoice(cuda.KernelChoice{}); err != nil {
			return err
		}
		n, err := runIndexerCases(env, m.Name, ixDepths, ixBatches, gbs, *only, stdout, enc)
		if err != nil {
			return err
		}
		failed += n
	}
	if *allPaths {
		writeBestPaths(stdout, linRecs, torch)
	}
	if failed > 0 {
		return fmt.Errorf("%d kernel cases failed their check against the CPU twin", failed)
	}
	return nil
}

func passStr(r kcheck.Result) string {
	if r.Pass {
		return "PASS"
	}
	if r.Err != nil {
		return "FAIL " + r.Err.Error()
	}
	return fmt.Sprintf("FAIL rel=%.2e nonfinite=%d mismatch=%d", r.RelErr, r.NonFinite, r.Mismatch)
}

// copyBandwidth is the median device-to-device copy rate of 1 GiB, counting
// the read and the write.
func copyBandwidth(ctx *cuda.Context, s *cuda.Stream, reps int) (float64, error) {
	const n = 1 << 30
	src, err := ctx.Alloc(n)
	if err != nil {
		return 0, err
	}
	defer src.Free()
	dst, err := ctx.Alloc(n)
	if err != nil {
		return 0, err
	}
	defer dst.Free()
	if err := s.Memset8(src.Ptr, 0x5a, n); err != nil {
		return 0, err
	}
	env := &kcheck.Env{Ctx: ctx, S: s, Reps: reps}
	defer env.Close()
	us, err := kcheck.Time(env, func() error { return s.CopyDtoD(dst.Ptr, src.Ptr, n) })
	if err != nil {
		return 0, err
	}
	return 2 * n / us / 1e3, nil
}

// parseTokenCounts reads --tokens: a comma-separated list of counts in
// [1, 65536].
func parseTokenCounts(list string) ([]int, error) {
	var toks []int
	for _, s := range strings.Split(list, ",") {
		t, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || t < 1 || t > 65536 {
			return nil, fmt.Errorf("--tokens: %q is not a count in [1, 65536]", s)
		}
		toks = append(toks, t)
	}
	return toks, nil
}
