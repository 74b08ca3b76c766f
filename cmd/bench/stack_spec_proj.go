package main

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/megamoe/megamoe/backend/gpu"
)

// specGraphLines counts how the steps with drafts ran between two
// GraphStats: the verifications and the MTP passes apart.
func specGraphLines(before, after gpu.GraphStats) string {
	d := func(kind string) gpu.GraphCounts {
		a, b := after.Kinds[kind], before.Kinds[kind]
		return gpu.GraphCounts{Recorded: a.Recorded - b.Recorded, Replayed: a.Replayed - b.Replayed, Eager: a.Eager - b.Eager}
	}
	v, m := d("verify"), d("mtp")
	return fmt.Sprintf("cuda graphs of the steps with drafts: verifications %d recorded, %d replayed, %d eager; MTP passes %d recorded, %d replayed, %d eager\n",
		v.Recorded, v.Replayed, v.Eager, m.Recorded, m.Replayed, m.Eager)
}

// median is the median of d in seconds (0 for none).
func median(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2].Seconds()
}

// project prints the parts of a step with drafts and the tokens/s ratio
// projected for the whole model: the verification and the plain step grow
// by their time per layer (each minus the head over its rows, over the
// layers built), the MTP passes and the rest stay.
func (r *specStackResult) project(out io.Writer, f *stackFlags, plain *stackResult, fr *floorReport) {
	if len(r.steps) == 0 || len(plain.steps) == 0 || fr.cut.Layers <= 0 {
		return
	}
	l, full := fr.cut.Layers, fr.full.Layers
	m, v, rest := median(r.mtp), median(r.verify), median(r.rest)
	hv, hp := r.headMs/1e3, fr.headMs/1e3
	how := "measured alone on the device"
	if r.headMs <= 0 || fr.headMs <= 0 {
		hv, hp, how = 0, 0, "not measured: counted with the layers"
	}
	a := float64(r.emitted) / float64(len(r.steps)*f.batch)
	p := median(plain.steps)
	pf := hp + (p-hp)/float64(l)*float64(full)
	vf := hv + (v-hv)/float64(l)*float64(full)
	fmt.Fprintf(out, "parts of a step with drafts (medians): MTP passes %.3f ms (%d a step), verification %.3f ms, rest %.3f ms (snapshots, rollbacks, host); head over %d rows %.3f ms, over %d rows %.3f ms (%s)\n",
		m*1e3, f.spec.NumTokens, v*1e3, rest*1e3, f.batch*(f.spec.NumTokens+1), hv*1e3, f.batch, hp*1e3, how)
	fmt.Fprintf(out, "projected %d-layer ratio = A × P / (M + V + R) = %.3f × %.3f / (%.3f + %.3f + %.3f) = %.2fx, "+
		"where A is the mean acceptance length, P = head + (plain step − head)/%d × %d and V = head_v + (verification − head_v)/%d × %d (ms), M the MTP passes and R the rest as measured\n",
		full, a, pf*1e3, m*1e3, vf*1e3, rest*1e3, a*pf/(m+vf+rest), l, full, l, full)
}
