// Command bench measures MegaMoE.
//
// `bench http [flags]` (also `bench` alone) drives an OpenAI-compatible
// server through streaming /v1/completions: prompts of exact token lengths at
// several concurrency levels, a fixed output length (ignore_eos), and prints
// TTFT and TPOT percentiles, output tokens/s and requests/s as a table and
// JSON lines. With --serve it serves the model itself, after timing bench
// stack's decode steps on the same model (http.go, httpserve.go).
//
// `bench stack [flags]` instead runs the real layer stack of a preset (small,
// flash, pro) with random weights on the CPU or GPU backend: one prefill chunk
// per sequence and batched decode steps, checking that all logits are finite
// and printing tokens/s (stack.go).
//
// `bench prefix [flags]` measures the prefix cache: TTFT and prefill tokens
// computed of requests sharing a long prefix and of a multi-turn conversation,
// with the cache off and on, on one model of a preset (prefix.go).
//
// `bench spec [flags]` measures the MTP drafts' acceptance on a trained model
// (the embedded small one by default): chat prompts answered through the
// engine with N drafts per step at temperatures 0 and 1 (spec.go).
//
// `bench kernels [flags]` times our GEMM kernels (FP8 dense, FP4 grouped MoE)
// at the Flash and Pro shapes and 1 to 4096 tokens next to the measured copy
// bandwidth, each case also checked against its CPU twin (kernels.go);
// scripts/bench-device.sh adds torch's numbers and writes the report.
package main

import (
	"fmt"
	"io"
	"os"
	"slices"
)

func main() {
	cmds := map[string]func([]string, io.Writer, io.Writer) error{
		"http": runHTTP, "stack": runStack, "kernels": runKernels, "kv": runKV, "prefix": runPrefix, "roofline": runRoofline, "spec": runSpec,
	}
	name, args := "http", os.Args[1:]
	if len(args) > 0 && cmds[args[0]] != nil {
		name, args = args[0], args[1:]
	}
	if err := cmds[name](args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", name, err)
		os.Exit(1)
	}
}

// pct is the nearest-rank percentile (0 for no data).
func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
