package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/engine"
)

// variant is one run of --variants: noSide runs every op on the main stream;
// moe, linear and attn force the MoE GEMM's, the FP8 linear's and the sparse
// attention's kernel paths (cuda.KernelChoice) where they apply; unfused runs
// RopeHadamardFP4 and ExpertsCombinePost as their parts
// (gpu.Backend.SetSplitFused).
type variant struct {
	label   string
	noSide  bool
	moe     cuda.Path
	linear  cuda.Path
	attn    cuda.Path
	unfused bool
}

// parseVariants reads --variants: runs separated by ';', each "label=names"
// or just "names" (its own label), names "no-side" (no side stream),
// "moe-decf16" (moe_fp4_decf16 for the decode MoE GEMMs), "moe-dec"
// (moe_fp4_dec after the tile_map launch, instead of the default decmap),
// "moe-decpre" (decmap with its weight loads started before the PDL wait),
// "dense-decsk" (linear_fp8_dsk on every decode FP8 linear it can run),
// "dense-deccta" (the decode FP8 linears without linear_fp8_dsk: K split
// inside a CTA only, linear_fp8_dec or the TMA kernels), "unfused" (the
// indexer's q epilogue and the MoE's hc post as separate launches), "attn-row", "attn-cluster", "attn-split" (every sparse
// attention call on that path: one CTA per row and head group, the keys over
// 8-CTA clusters, the keys over a plain grid) or "" or "default" (the
// default run).
func parseVariants(list string) ([]variant, error) {
	var vs []variant
	for _, item := range strings.Split(list, ";") {
		item = strings.TrimSpace(item)
		label, names, ok := strings.Cut(item, "=")
		if !ok {
			names = item
		}
		label = strings.TrimSpace(label)
		var v variant
		for _, n := range strings.Split(names, ",") {
			switch n = strings.TrimSpace(n); n {
			case "", "default":
			case "no-side":
				v.noSide = true
			case "moe-decf16":
				v.moe = cuda.PathDecF16
			case "moe-dec":
				v.moe = cuda.PathDec
			case "moe-decpre":
				v.moe = cuda.PathDecPre
			case "dense-decsk":
				v.linear = cuda.PathDecSK
			case "dense-deccta":
				v.linear = cuda.PathDecCTA
			case "unfused":
				v.unfused = true
			case "attn-row":
				v.attn = cuda.PathAttnRow
			case "attn-cluster":
				v.attn = cuda.PathAttnCluster
			case "attn-split":
				v.attn = cuda.PathAttnSplit
			default:
				return nil, fmt.Errorf("--variants %q: unknown %q (want no-side, moe-decf16, moe-dec, moe-decpre, dense-decsk, dense-deccta, unfused, attn-row, attn-cluster, attn-split or default)", item, n)
			}
		}
		if v.label = label; v.label == "" {
			v.label = "default"
		}
		vs = append(vs, v)
	}
	return vs, nil
}

// runVariants times the plan once per variant on one model: the weights are
// generated and uploaded once, and every variant runs in the same process
// (fresh sequences, its own warm-up and graph recordings).
func runVariants(m engine.Stepper, g *gpu.Backend, f *stackFlags, fr *floorReport, stdout io.Writer) error {
	var errs []error
	for _, v := range f.variants {
		if err := g.SetSideStream(!v.noSide); err != nil {
			return err
		}
		if err := g.SetSplitFused(v.unfused); err != nil {
			return err
		}
		attn := v.attn
		if attn == cuda.PathAuto {
			attn = f.attnPath
		}
		if err := g.Context().SetKernelChoice(cuda.KernelChoice{MoE: v.moe, Linear: v.linear, Attn: attn}); err != nil {
			return err
		}
		if err := g.DropGraphs(); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "variant %s\n", v.label)
		before := g.GraphStats()
		r, err := runPlan(m, f, nil, nil)
		if err != nil {
			fmt.Fprintf(stdout, "variant %s failed: %v\n", v.label, err)
			errs = append(errs, fmt.Errorf("variant %s: %w", v.label, err))
		} else {
			r.print(stdout, f)
			fr.print(stdout, r.steps)
		}
		if st := g.GraphStats(); f.graphs {
			fmt.Fprintf(stdout, "cuda graphs: %d recorded, %d steps replayed, %d eager (the prefills too)\n",
				st.Recorded-before.Recorded, st.Replayed-before.Replayed, st.Eager-before.Eager)
			for _, e := range st.Failed {
				fmt.Fprintln(stdout, "cuda graph not recorded: "+e)
			}
		}
	}
	return errors.Join(errs...)
}
