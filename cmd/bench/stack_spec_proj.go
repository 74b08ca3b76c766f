package main

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/megamoe/megamoe/backend/gpu"
)

// specGraphLines counts how the steps with drafts ran between two
// GraphStats: the verifications and the draft passes apart (MTP: kind
// "mtp"; DSpark: every kind but plain steps and verifications). DSpark
// passes that do not go through RecordStep run eagerly and are counted
// nowhere.
func specGraphLines(before, after gpu.GraphStats, dspark bool) string {
	d := func(kind string) gpu.GraphCounts {
		a, b := after.Kinds[kind], before.Kinds[kind]
		return gpu.GraphCounts{Recorded: a.Recorded - b.Recorded, Replayed: a.Replayed - b.Replayed, Eager: a.Eager - b.Eager}
	}
	v, m := d("verify"), d("mtp")
	passes := fmt.Sprintf("MTP passes %d recorded, %d replayed, %d eager", m.Recorded, m.Replayed, m.Eager)
	if dspark {
		m = gpu.GraphCounts{}
		for kind := range after.Kinds {
			if kind != "step" && kind != "verify" {
				k := d(kind)
				m.Recorded, m.Replayed, m.Eager = m.Recorded+k.Recorded, m.Replayed+k.Replayed, m.Eager+k.Eager
			}
		}
		passes = fmt.Sprintf("DSpark passes %d recorded, %d replayed, %d eager", m.Recorded, m.Replayed, m.Eager)
		if m == (gpu.GraphCounts{}) {
			passes = "DSpark passes not recorded (they run eagerly)"
		}
	}
	return fmt.Sprintf("cuda graphs of the steps with drafts: verifications %d recorded, %d replayed, %d eager; %s\n",
		v.Recorded, v.Replayed, v.Eager, passes)
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
	heads := fmt.Sprintf("head over %d rows %.3f ms, over %d rows %.3f ms (%s)", f.batch*(f.spec.NumTokens+1), hv*1e3, f.batch, hp*1e3, how)
	if f.dspark() {
		r.projectDSpark(out, f, fr, dsparkProj{a: a, p: pf, d: m, v: v, vf: vf, rest: rest, heads: heads})
		return
	}
	fmt.Fprintf(out, "parts of a step with drafts (medians): MTP passes %.3f ms (%d a step), verification %.3f ms, rest %.3f ms (rewinds, host); %s\n",
		m*1e3, f.spec.NumTokens, v*1e3, rest*1e3, heads)
	fmt.Fprintf(out, "projected %d-layer ratio = A × P / (M + V + R) = %.3f × %.3f / (%.3f + %.3f + %.3f) = %.2fx, "+
		"where A is the mean acceptance length, P = head + (plain step − head)/%d × %d and V = head_v + (verification − head_v)/%d × %d (ms), M the MTP passes and R the rest as measured\n",
		full, a, pf*1e3, m*1e3, vf*1e3, rest*1e3, a*pf/(m+vf+rest), l, full, l, full)
}
