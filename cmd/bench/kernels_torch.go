package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// torchKey names one torch._scaled_mm timing of scripts/torch_baseline.py.
type torchKey struct {
	model, shape string
	m            int
}

// loadTorchFP8 reads the fp8 records of scripts/torch_baseline.py's JSON
// lines (us by model, shape and tokens); other records are skipped.
func loadTorchFP8(path string) (map[torchKey]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--torch: %w", err)
	}
	defer f.Close()
	out := map[torchKey]float64{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(b) == 0 || b[0] == '#' {
			continue
		}
		var r struct {
			Kind, Model, Shape string
			M                  int
			Us                 float64
		}
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("--torch %s line %d: %w", path, line, err)
		}
		if r.Kind == "fp8" && r.Us > 0 {
			out[torchKey{r.Model, r.Shape, r.M}] = r.Us
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--torch %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--torch %s: no fp8 records", path)
	}
	return out, nil
}

// torchPct is torch's time over ours in percent (ours' share of torch's
// speed), 0 where torch has no record.
func torchPct(torch map[torchKey]float64, model, shape string, m int, us float64) float64 {
	t, ok := torch[torchKey{model, shape, m}]
	if !ok || us <= 0 {
		return 0
	}
	return 100 * t / us
}

// writeBestPaths prints, for every linear_fp8 shape and token count timed on
// several paths, the auto path and the fastest one with their share of
// torch's speed (in the order timed): what cuda's wgPicks table takes.
func writeBestPaths(w io.Writer, recs []kernelRecord, torch map[torchKey]float64) {
	type key struct {
		model, shape string
		m            int
	}
	var keys []key
	by := map[key][]kernelRecord{}
	for _, r := range recs {
		if r.Op != "linear_fp8" || !r.Pass || r.Us <= 0 {
			continue
		}
		k := key{r.Model, r.Shape, r.Tokens}
		if by[k] == nil {
			keys = append(keys, k)
		}
		by[k] = append(by[k], r)
	}
	fmt.Fprintln(w, "linear_fp8, fastest path (% of torch fp8 speed):")
	for _, k := range keys {
		rs := by[k]
		if len(rs) < 2 {
			continue
		}
		best, auto := rs[0], kernelRecord{}
		for _, r := range rs {
			if r.Us < best.Us {
				best = r
			}
			if r.Auto {
				auto = r
			}
		}
		fmt.Fprintf(w, "%-5s %-10s tokens %5d  auto %-8s %8.1f us %5.1f%%  best %-8s %8.1f us %5.1f%%\n", k.model, k.shape, k.m,
			auto.Path, auto.Us, torchPct(torch, k.model, k.shape, k.m, auto.Us), best.Path, best.Us, torchPct(torch, k.model, k.shape, k.m, best.Us))
	}
}
