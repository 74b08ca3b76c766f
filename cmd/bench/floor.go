package main

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda/kcheck"
	"github.com/megamoe/megamoe/model"
)

// decodeFloorBytes is the least a decode step of batch sequences must read
// from device memory: every weight once (the head too), except the
// embedding and hash tables, of which it reads a row per token, and the
// routed experts, of which it reads those the tokens route to: E·(1-(1-k/E)^B)
// distinct experts per layer on average when routing is uniform (random
// weights).
func decodeFloorBytes(c *checkpoint.Config, formats checkpoint.FormatFunc, batch int) int64 {
	var total int64
	for _, s := range checkpoint.Tensors(c, formats) {
		total += floorTensorBytes(c, s, batch)
	}
	return total
}

// floorTensorBytes is what a decode step of batch sequences must read of
// tensor s (decodeFloorBytes).
func floorTensorBytes(c *checkpoint.Config, s checkpoint.TensorSpec, batch int) int64 {
	switch {
	case s.Name == "embed.weight" || strings.HasSuffix(s.Name, ".tid2eid"):
		return 0
	case strings.Contains(s.Name, ".ffn.experts.") && c.Experts > 0:
		e, k := float64(c.Experts), float64(c.TopK)
		return int64(float64(s.Bytes()) * (1 - math.Pow(1-k/e, float64(batch))))
	}
	return s.Bytes()
}

// floorSplit is a decode step's floor bytes in two parts: the main layers'
// and the head's (its weight, norm and hc_head). The MTP block is in
// neither: a plain decode step does not run it.
type floorSplit struct{ layers, head int64 }

func decodeFloorSplit(c *checkpoint.Config, formats checkpoint.FormatFunc, batch int) floorSplit {
	var f floorSplit
	for _, s := range checkpoint.Tensors(c, formats) {
		switch {
		case strings.HasPrefix(s.Name, "layers."):
			f.layers += floorTensorBytes(c, s, batch)
		case !strings.HasPrefix(s.Name, "mtp."):
			f.head += floorTensorBytes(c, s, batch)
		}
	}
	return f
}

// floorReport holds what the decode floor lines need besides the steps.
type floorReport struct {
	cut, full *checkpoint.Config // the stack built, and the whole model
	formats   checkpoint.FormatFunc
	batch     int
	copyGBs   float64
	// headMs is the head alone timed on the device (timeHead); 0: not
	// measured, and the head's floor stands in for its time.
	headMs float64
}

// print writes the step median against the weight-read floor, then the
// layers alone (the step minus the head) against theirs and the whole
// model's step projected from the time a layer takes.
func (fr *floorReport) print(out io.Writer, steps []time.Duration) {
	if fr.copyGBs <= 0 || len(steps) == 0 {
		return
	}
	sec := func(b int64) float64 { return float64(b) / (fr.copyGBs * 1e9) }
	fb := decodeFloorBytes(fr.cut, fr.formats, fr.batch)
	floor := sec(fb)
	s := slices.Clone(steps)
	slices.Sort(s)
	step := s[len(s)/2].Seconds()
	fmt.Fprintf(out, "decode floor: %s of weights per step at the copy rate %.0f GB/s = %.3f ms; step median %.2f× the floor\n",
		gib(fb), fr.copyGBs, floor*1e3, step/floor)

	cut, full := decodeFloorSplit(fr.cut, fr.formats, fr.batch), decodeFloorSplit(fr.full, fr.formats, fr.batch)
	head, how := fr.headMs/1e3, fmt.Sprintf("measured alone on the device; floor %.3f ms", sec(cut.head)*1e3)
	if fr.headMs <= 0 {
		head, how = sec(cut.head), "not measured: its floor"
	}
	layers := step - head
	if layers <= 0 || cut.layers <= 0 {
		fmt.Fprintf(out, "layers alone: not measured (the step median %.3f ms is not longer than the head, %.3f ms)\n", step*1e3, head*1e3)
		return
	}
	fmt.Fprintf(out, "layers alone: %.3f ms against %.3f ms floor (%.2f×): the step minus the head, %.3f ms (%s)\n",
		layers*1e3, sec(cut.layers)*1e3, layers/sec(cut.layers), head*1e3, how)
	perLayer := layers / float64(fr.cut.Layers)
	proj, projFloor := head+perLayer*float64(fr.full.Layers), sec(full.layers+full.head)
	fmt.Fprintf(out, "projected full step (%d layers at %.3f ms each, and the head): %.3f ms against its floor %.3f ms (%.2f×)\n",
		fr.full.Layers, perLayer*1e3, proj*1e3, projFloor*1e3, proj/projFloor)
}

// timeHead is the median time in ms of the head alone (gather, hc_head, norm
// and head linear) on batch rows of random streams, between CUDA events on
// the model's stream with its weights read cold (kcheck.Time).
func timeHead(m *model.Model, g *gpu.Backend, batch int) (float64, error) {
	be, c := m.Backend(), m.Config()
	x := be.Empty(batch, c.HcDim(), backend.F32)
	defer be.Free(x)
	v := make([]float32, batch*c.HcDim())
	rng := rand.New(rand.NewPCG(uint64(batch), 0x68656164))
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	if err := be.Upload(x, v); err != nil {
		return 0, fmt.Errorf("head alone: %w", err)
	}
	rows := make([]int, batch)
	for i := range rows {
		rows[i] = i
	}
	env := &kcheck.Env{Ctx: g.Context(), S: g.Stream(), Reps: 10}
	defer env.Close()
	us, err := kcheck.Time(env, func() error {
		lg, err := m.HeadLogits(x, rows)
		if err == nil {
			be.Free(lg)
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("head alone: %w", err)
	}
	return us / 1e3, nil
}
