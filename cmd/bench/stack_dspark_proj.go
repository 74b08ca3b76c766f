package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/megamoe/megamoe/checkpoint"
)

// dsparkFloor is what a DSpark draft pass of batch sequences and blocks of
// k rows must read from device memory, by floorTensorBytes' rules: the
// stages (with the context's main_proj and wkv, which the block reads
// again, the drafter's norm and hc_head, and the routed experts that
// batch·k rows route to), markov_w2 once per draft position (a MarkovBias
// call each; markov_w1 is an embedding, a row per token) and the target's
// head once for the blocks' base logits. The confidence head is not
// evaluated.
type dsparkFloor struct{ stages, markov, head int64 }

func dsparkFloorBytes(c *checkpoint.Config, formats checkpoint.FormatFunc, batch, k int) dsparkFloor {
	var f dsparkFloor
	for _, s := range checkpoint.Tensors(c, formats) {
		switch {
		case strings.Contains(s.Name, ".markov_w2."):
			f.markov += int64(k) * s.Bytes()
		case strings.Contains(s.Name, ".markov_w1.") || strings.Contains(s.Name, ".confidence_head."):
		case s.Name == "head.weight":
			f.head += s.Bytes()
		case strings.HasPrefix(s.Name, "mtp."):
			b := floorTensorBytes(c, s, batch*k)
			if strings.Contains(s.Name, ".attn.wkv.") {
				b *= 2 // the context's entries, then the block's
			}
			f.stages += b
		}
	}
	return f
}

func (f dsparkFloor) total() int64 { return f.stages + f.markov + f.head }

// dsparkProj holds the medians and projections (seconds) of project.
type dsparkProj struct {
	a, p, d, v, vf, rest float64 // acceptance length, plain step projected, DSpark pass, verification, projected
	heads                string  // the heads' timings
}

// projectDSpark prints project's lines for DSpark drafts: the parts (the
// DSpark pass split into context, block and Markov positions), the
// projected ratio, and the DSpark pass against its floor.
func (r *specStackResult) projectDSpark(out io.Writer, f *stackFlags, fr *floorReport, x dsparkProj) {
	k, l, full := f.spec.NumTokens, fr.cut.Layers, fr.full.Layers
	part := func(get func(dsparkParts) time.Duration) float64 {
		d := make([]time.Duration, len(r.ds))
		for i, p := range r.ds {
			d[i] = get(p)
		}
		return median(d) * 1e3
	}
	parts := fmt.Sprintf("block %.3f ms, Markov head %.3f ms over %d positions", part(func(p dsparkParts) time.Duration { return p.block }),
		part(func(p dsparkParts) time.Duration { return p.markov }), k)
	if len(r.ds) > 0 && r.ds[0].drawn {
		parts = fmt.Sprintf("block with the Markov head's %d positions drawn on the device %.3f ms", k, part(func(p dsparkParts) time.Duration { return p.block }))
	}
	fmt.Fprintf(out, "parts of a step with drafts (medians): DSpark pass %.3f ms (context %.3f ms, %s), verification %.3f ms, rest %.3f ms (rewinds, host); %s\n",
		x.d*1e3, part(func(p dsparkParts) time.Duration { return p.context }), parts, x.v*1e3, x.rest*1e3, x.heads)
	ratio := func(d float64) float64 { return x.a * x.p / (d + x.vf + x.rest) }
	fmt.Fprintf(out, "projected %d-layer ratio = A × P / (D + V + R) = %.3f × %.3f / (%.3f + %.3f + %.3f) = %.2fx, "+
		"where A is the mean acceptance length, P = head + (plain step − head)/%d × %d and V = head_v + (verification − head_v)/%d × %d (ms), "+
		"D the DSpark pass and R the rest as measured: the DSpark pass does not grow with the layers (its %d stages and the head read the same bytes for any number)\n",
		full, x.a, x.p*1e3, x.d*1e3, x.vf*1e3, x.rest*1e3, ratio(x.d), l, full, l, full, fr.cut.DSparkLayers())
	fl := dsparkFloorBytes(fr.cut, fr.formats, f.batch, k)
	line := fmt.Sprintf("DSpark pass floor: %s of weights (%d stages %s with the experts of %d rows, markov_w2 read %d times %s, head %s)",
		gib(fl.total()), fr.cut.DSparkLayers(), gib(fl.stages), f.batch*k, k, gib(fl.markov), gib(fl.head))
	if fr.copyGBs > 0 {
		d := float64(fl.total()) / (fr.copyGBs * 1e9)
		line += fmt.Sprintf(" at the copy rate %.0f GB/s = %.3f ms; the pass took %.2f× that; with the pass at its floor the projected ratio is %.2fx",
			fr.copyGBs, d*1e3, x.d/d, ratio(d))
	}
	fmt.Fprintln(out, line)
}
