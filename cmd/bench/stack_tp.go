package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/parallel"
)

// stackParallel is `bench stack --tensor-parallel N`: the layer stack split
// over N ranks (model.Parallel), with the time the ranks spend inside their
// collectives broken out (rank 0; NCCL calls are followed by a stream sync
// so that their time is theirs).
func stackParallel(f *stackFlags, full *checkpoint.Config, stdout io.Writer) error {
	c, err := f.cut(full, f.layers)
	if err != nil {
		return err
	}
	w, err := checkpoint.RandomWeights(c, f.format, f.seed)
	if err != nil {
		return err
	}
	bes := make([]backend.Backend, f.tp)
	var comms []parallel.Comm
	kind := "cpu"
	if f.device == "cuda" {
		gs := make([]*gpu.Backend, f.tp)
		for r := range gs {
			g, err := gpu.New(gpu.Options{Device: r})
			if err != nil {
				return fmt.Errorf("--tensor-parallel %d: GPU %d: %w", f.tp, r, err)
			}
			defer g.Close()
			gs[r], bes[r] = g, g
		}
		nc, closeAll, err := gpu.NewNCCLComms(gs)
		if err != nil {
			return fmt.Errorf("--tensor-parallel %d: %w", f.tp, err)
		}
		defer closeAll()
		comms, kind = nc, "cuda (NCCL)"
	} else {
		for r := range bes {
			bes[r] = cpu.New(cpu.Options{Threads: max(1, f.threads/f.tp)})
		}
		_, lc, err := parallel.NewLocal(f.tp)
		if err != nil {
			return err
		}
		comms = lc
	}
	timed := make([]*timedComm, f.tp)
	for r := range comms {
		timed[r] = &timedComm{Comm: comms[r]}
		if g, ok := bes[r].(*gpu.Backend); ok {
			timed[r].sync = g.Sync
		}
		comms[r] = timed[r]
	}
	opts := model.Options{Numerics: f.numerics, CacheBytes: cacheFor(c, f)}
	t0 := time.Now()
	p, err := model.NewParallelComms(w, bes, comms, opts)
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	fmt.Fprintf(stdout, "preset %s  layers %d/%d  format %s  device %s  numerics %s  tensor-parallel %d\n",
		f.preset, c.Layers, full.Layers, f.format, kind, f.numerics, f.tp)
	fmt.Fprintf(stdout, "weights %s (checkpoint bytes, all ranks)  load %v\n",
		gib(checkpoint.TotalBytes(checkpoint.Tensors(c, formatsOf(f.format)))), time.Since(t0).Round(time.Millisecond))
	r, err := runPlan(p, f, nil, func() {
		for _, t := range timed {
			t.reset()
		}
	})
	if err != nil {
		return err
	}
	r.print(stdout, f)
	t := timed[0]
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(stdout, "collectives on rank 0: %d all-reduce %.3f ms, %d all-gather %.3f ms in %d forwards (%.3f ms per forward)\n",
		t.reduces, ms(t.reduceTime), t.gathers, ms(t.gatherTime), f.batch+len(r.steps), ms(t.reduceTime+t.gatherTime)/float64(f.batch+len(r.steps)))
	return nil
}

func formatsOf(format string) checkpoint.FormatFunc {
	if format == checkpoint.GenNVFP4 {
		return checkpoint.NVFP4Formats
	}
	return checkpoint.OfficialFormats
}

// timedComm charges the wall time of every collective (and, for GPU ranks,
// the stream sync after it) to its kind.
type timedComm struct {
	parallel.Comm
	sync                   func() error
	mu                     sync.Mutex
	reduces, gathers       int
	reduceTime, gatherTime time.Duration
}

func (t *timedComm) reset() {
	t.mu.Lock()
	t.reduces, t.gathers, t.reduceTime, t.gatherTime = 0, 0, 0, 0
	t.mu.Unlock()
}

func (t *timedComm) timed(count *int, total *time.Duration, f func() error) error {
	t0 := time.Now()
	err := f()
	if err == nil && t.sync != nil {
		err = t.sync()
	}
	t.mu.Lock()
	*count++
	*total += time.Since(t0)
	t.mu.Unlock()
	return err
}

func (t *timedComm) AllReduceSum(be backend.Backend, x backend.Tensor) error {
	return t.timed(&t.reduces, &t.reduceTime, func() error { return t.Comm.AllReduceSum(be, x) })
}

func (t *timedComm) AllGatherRows(be backend.Backend, part, out backend.Tensor) error {
	return t.timed(&t.gathers, &t.gatherTime, func() error { return t.Comm.AllGatherRows(be, part, out) })
}
