// Command gpucheck verifies MegaMoE's CUDA kernels.
//
//	gpucheck --compile-only [--arch sm_80,sm_90a,sm_100a] [--dump DIR] [--ptxas-v]
//	    compiles every embedded kernel with NVRTC (no GPU needed) and prints a
//	    table; --ptxas-v also prints ptxas's messages per kernel (registers,
//	    spills, wgmma serialisation such as C7514).
//	gpucheck --compile-only --arch sm_100a --ptx-out cuda/kernels/sm100
//	    also writes the sm_100a PTX of the tcgen05 kernels, with the hash of
//	    their sources, as the committed fixtures the emulator tests run
//	    (provisional, and marked so, where NVRTC is older than 12.8).
//	gpucheck [--model flash,pro] [--reps 20] [--moe-path decf16]
//	    runs every kernel at the real DeepSeek-V4 Flash/Pro dimensions against
//	    its CPU twin and prints component, shape, cosine, relative error, max
//	    abs error, non-finite count and time; then (--ops, default on) runs
//	    every backend op of backend/gpu against backend/cpu at the same
//	    dimensions on fresh random inputs (faithful numerics; --exact adds
//	    exact), one row per comparison. --moe-path forces the MoE GEMM's kernel
//	    path for the kernel cases where it applies (cuda.KernelChoice).
//
// The exit status is non-zero if anything fails or misses its threshold.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/kcheck"
)

func main() {
	compileOnly := flag.Bool("compile-only", false, "compile the kernels with NVRTC and exit")
	archs := flag.String("arch", "sm_80,sm_90a,sm_100a", "targets for --compile-only")
	dump := flag.String("dump", "", "with --compile-only: write <kernel>.<arch>.cubin files here")
	ptxasV := flag.Bool("ptxas-v", false, "with --compile-only: print ptxas's resource and performance messages")
	ptxOut := flag.String("ptx-out", "", "with --compile-only: write the sm_100a PTX fixtures of the tcgen05 kernels here")
	models := flag.String("model", "flash,pro", "models whose dimensions to check")
	reps := flag.Int("reps", 20, "timed launches per case (median reported)")
	ordinal := flag.Int("device", 0, "CUDA device ordinal")
	filter := flag.String("only", "", "run only components (kernel cases and op groups) containing this string")
	ops := flag.Bool("ops", true, "after the kernel cases, compare every backend op GPU vs CPU")
	exact := flag.Bool("exact", false, "with --ops: also run the ops in exact numerics")
	seed := flag.Uint64("seed", 0, "random seed (0 = from the clock)")
	verbose := flag.Bool("v", false, "print the op comparisons' log lines")
	moePath := flag.String("moe-path", "", "force the MoE GEMM path of the kernel cases (dec, decf16, decmap, decpre, tiled, wg); default: the planner's")
	flag.Parse()
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	var err error
	if *compileOnly {
		err = compileAll(strings.Split(*archs, ","), *dump, *ptxasV)
		if *ptxOut != "" {
			err = errors.Join(err, writeSM100PTX(*ptxOut))
		}
	} else {
		err = checkAll(*ordinal, strings.Split(*models, ","), *reps, *filter, *seed, cuda.Path(*moePath))
		if *ops {
			err = errors.Join(err, checkOps(*ordinal, strings.Split(*models, ","), *exact, *filter, *seed, *verbose))
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck:", err)
		os.Exit(1)
	}
}

func compileAll(archs []string, dump string, ptxasV bool) error {
	n, err := cuda.LoadNVRTC()
	if err != nil {
		return err
	}
	fmt.Printf("NVRTC %d.%d (%s), options %v\n", n.Major, n.Minor, n.Path(), cuda.CompileOptions("<arch>"))
	if dump != "" {
		if err := os.MkdirAll(dump, 0o755); err != nil {
			return err
		}
	}
	fmt.Printf("%-12s %-8s %-6s %10s %9s  %s\n", "kernel", "arch", "status", "cubin", "time", "note")
	failed := 0
	for _, name := range cuda.KernelSources() {
		src, err := cuda.KernelSource(name)
		if err != nil {
			return err
		}
		for _, arch := range archs {
			t0 := time.Now()
			compile := n.Compile
			if ptxasV {
				compile = n.CompileVerbose
			}
			cubin, log, err := compile(src, arch)
			el := time.Since(t0)
			status, note := "ok", firstLine(log)
			if err != nil {
				status, note = "FAIL", firstLine(err.Error()+" "+log)
				failed++
			}
			fmt.Printf("%-12s %-8s %-6s %10d %8.2fs  %s\n", name, arch, status, len(cubin), el.Seconds(), note)
			if ptxasV && err == nil {
				fmt.Println(strings.TrimSpace(log))
			}
			if err == nil && dump != "" {
				if werr := os.WriteFile(filepath.Join(dump, name+"."+arch+".cubin"), cubin, 0o644); werr != nil {
					return werr
				}
			}
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d compilations failed", failed)
	}
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " …"
	}
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

func checkAll(ordinal int, models []string, reps int, filter string, seed uint64, moePath cuda.Path) error {
	ses, err := cuda.OpenSession(ordinal)
	if err != nil {
		return err
	}
	defer ses.Close()
	drv, dev, ctx, s := ses.Driver, ses.Device, ses.Ctx, ses.S
	if err := ctx.SetKernelChoice(cuda.KernelChoice{MoE: moePath}); err != nil {
		return fmt.Errorf("--moe-path: %w", err)
	}
	free, total, err := ctx.MemInfo()
	if err != nil {
		return err
	}
	fmt.Printf("device %d: %s, sm_%d%d (%s), %d SMs, %.1f GiB total, %.1f GiB free, driver CUDA %d.%d\n",
		ordinal, dev.Name, dev.Major, dev.Minor, dev.Arch(), dev.SMs,
		float64(total)/(1<<30), float64(free)/(1<<30), drv.Version()/1000, drv.Version()%1000/10)

	// Compile (or load from cache) every module up front so times exclude it.
	t0 := time.Now()
	if err := ctx.LoadModules(); err != nil {
		return err
	}
	fmt.Printf("modules ready in %.2fs\n", time.Since(t0).Seconds())
	for _, k := range [][2]string{{"rmsnorm", "rmsnorm_bf16"}, {"quant", "quant_fp8_act"}, {"linear_fp8", "linear_fp8"},
		{"moe_fp4", "moe_tile_map"}, {"moe_fp4", "moe_fp4_gemm"}, {"moe_fp4_dec", "moe_fp4_dec"}, {"moe_fp4_dec", "moe_fp4_dec_nv"}, {"moe_fp4_dec", "moe_fp4_decm"}, {"moe_fp4_dec", "moe_fp4_decm_nv"},
		{"moe_fp4_decf16", "moe_fp4_decf16"}, {"moe_fp4_decf16", "moe_fp4_decf16_nv"}, {"swiglu", "swiglu_bf16"},
		{"linear_fp8_dsk", "linear_fp8_dsk1_4"}, {"linear_fp8_dsk", "linear_fp8_dsk2_2"}} {
		f, err := ctx.Kernel(k[0], k[1])
		if err != nil {
			return err
		}
		regs, local, smem, err := f.Resources()
		if err != nil {
			return err
		}
		fmt.Printf("  %-14s %3d regs, %d local bytes, %d static smem\n", k[1], regs, local, smem)
	}

	env := &kcheck.Env{Ctx: ctx, S: s, Reps: reps, Seed: seed}
	defer env.Close()
	var rows []string
	failed := 0
	for _, name := range models {
		var m kcheck.Model
		switch strings.TrimSpace(name) {
		case "flash":
			m = kcheck.Flash
		case "pro":
			m = kcheck.Pro
		default:
			return fmt.Errorf("unknown model %q (flash, pro)", name)
		}
		for _, c := range kcheck.ModelCases(m) {
			if filter != "" && !strings.Contains(c.Component, filter) {
				continue
			}
			t1 := time.Now()
			r := kcheck.Run(env, c)
			row := m.Name + " " + kcheck.Row(r)
			fmt.Printf("%s  [%.1fs]\n", row, time.Since(t1).Seconds())
			rows = append(rows, row)
			if !r.Pass {
				failed++
			}
			if err := ctx.Pool().Trim(); err != nil {
				return err
			}
			if r.Err != nil && errors.Is(r.Err, cuda.ErrNoCGO) {
				return r.Err
			}
		}
	}
	fmt.Println("\nsummary")
	for _, r := range rows {
		fmt.Println(r)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d cases failed", failed, len(rows))
	}
	fmt.Printf("all %d cases passed\n", len(rows))
	return nil
}

// writeSM100PTX writes kernels/sm100/<name>.ptx for every tcgen05 kernel.
func writeSM100PTX(dir string) error {
	n, err := cuda.LoadNVRTC()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, name := range cuda.SM100Kernels {
		ptx, err := cuda.SM100PTX(n, name)
		if err != nil {
			return err
		}
		f := filepath.Join(dir, name+".ptx")
		if err := os.WriteFile(f, []byte(ptx), 0o644); err != nil {
			return err
		}
		fmt.Printf("wrote %s (%d bytes, NVRTC %d.%d)\n", f, len(ptx), n.Major, n.Minor)
	}
	return nil
}
