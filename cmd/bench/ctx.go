package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda/kcheck"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// contextFlags are bench stack's options for steps at depth (--context).
type contextFlags struct {
	depths []int         // sequence lengths to time at; nil: plain bench stack
	jsonl  string        // also write one JSON object per depth here
	warm   time.Duration // GPU: untimed runs at the first depth before it is timed
}

// contextChunk is the prefill chunk at depth when --prefill is not given.
const contextChunk = 2048

// decodeWarm are the untimed decode steps at each depth: the first runs
// eagerly, the second records the CUDA graph of the layout.
const decodeWarm = 2

func addContextFlags(fs *flag.FlagSet, c *contextFlags) {
	fs.Func("context", "time decode steps and a prefill chunk with every sequence at these depths (tokens, e.g. 4K,32K,128K,512K,1M): the cache is filled with random well-formed state first (docs/performance.md, \"Speed at length\")", func(s string) error {
		d, err := parseDepths(s)
		c.depths = d
		return err
	})
	fs.StringVar(&c.jsonl, "jsonl", "", "with --context, also write one JSON object per depth to this file")
	fs.DurationVar(&c.warm, "warm", 3*time.Second, "with --context on a GPU, run the first depth untimed for at least this long first (clocks settle under load)")
}

// parseDepths reads a comma-separated list of token counts, each a number
// or one with a K (1024) or M (1048576) suffix.
func parseDepths(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		p := strings.TrimSpace(part)
		mul := 1
		switch {
		case strings.HasSuffix(p, "K") || strings.HasSuffix(p, "k"):
			mul, p = 1<<10, p[:len(p)-1]
		case strings.HasSuffix(p, "M") || strings.HasSuffix(p, "m"):
			mul, p = 1<<20, p[:len(p)-1]
		}
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > (1<<40)/mul {
			return nil, fmt.Errorf("depth %q: want a positive token count such as 4096, 4K or 1M", part)
		}
		out = append(out, n*mul)
	}
	return out, nil
}

// checkContextFlags validates the --context options against the others;
// without --prefill, the chunk at depth is contextChunk tokens.
func checkContextFlags(fs *flag.FlagSet, f *stackFlags) error {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if f.ctx.depths == nil {
		if set["jsonl"] {
			return errors.New("--jsonl needs --context")
		}
		return nil
	}
	if !set["prefill"] {
		f.prefill = contextChunk
	}
	switch {
	case f.tp > 1 || f.profile || f.variants != nil || f.prefillSeqs > 1:
		return errors.New("--context runs on one device, without --profile, --variants or --prefill-seqs (it times the attention and indexer ops itself)")
	case f.decode < 1:
		return errors.New("--context needs --decode >= 1 (the step it times)")
	case f.ctx.warm < 0:
		return fmt.Errorf("--warm %v: want a duration >= 0", f.ctx.warm)
	case f.layers == 0 && f.preset != "small":
		return errors.New("--context needs --layers N (all layers only on the small preset)")
	}
	return nil
}

// stackContext is bench stack --context: a model of random weights whose
// sequences are put at each depth by model.FillCache, then timed there.
func stackContext(f *stackFlags, full *checkpoint.Config, stdout io.Writer) error {
	c, err := f.cut(full, f.layers)
	if err != nil {
		return err
	}
	steps := decodeWarm + f.decode + 1 // the last one times the attention ops
	for _, n := range f.ctx.depths {
		switch {
		case c.MaxPositions > 0 && n > c.MaxPositions:
			return fmt.Errorf("--context %d exceeds the model's max_position_embeddings %d", n, c.MaxPositions)
		case n < 2*f.prefill || n <= steps:
			return fmt.Errorf("--context %d: want at least two prefill chunks (2 × %d tokens) and more than the %d decode steps", n, f.prefill, steps)
		}
	}
	num, _ := backend.ParseNumerics(f.numerics)
	layout, err := kvcache.LayoutFromConfig(c, kvcache.DefaultBlockTokens, model.StoreFor(num))
	if err != nil {
		return err
	}
	seqs := f.batch + 1 // the batch and the prefill sequence
	longest := slices.Max(f.ctx.depths)
	capacity := int64(seqs) * kvcache.NewManager(layout, 0).BytesFor(longest)
	formats := formatsOf(f.format)

	var jl io.Writer = io.Discard
	if f.ctx.jsonl != "" {
		fh, err := os.Create(f.ctx.jsonl)
		if err != nil {
			return fmt.Errorf("--jsonl: %w", err)
		}
		defer fh.Close()
		jl = fh
	}
	be, closeBE, err := openBackend(f)
	if err != nil {
		return err
	}
	defer closeBE()
	dt := &depthTimer{Backend: be, time: wallTime}
	copyGBs := 0.0
	if g, ok := be.(*gpu.Backend); ok {
		if err := fitsDevice(g, c, formats, layout, f, capacity); err != nil {
			return err
		}
		if copyGBs, err = copyBandwidth(g.Context(), g.Stream(), 5); err != nil {
			return fmt.Errorf("copy bandwidth: %w", err)
		}
		env := &kcheck.Env{Ctx: g.Context(), S: g.Stream(), Reps: 5}
		defer env.Close()
		dt.time = func(run func() error) (float64, error) { return kcheck.Time(env, run) }
	} else {
		copyGBs = hostCopyRate()
	}

	t0 := time.Now()
	w, err := checkpoint.RandomWeights(c, f.format, f.seed)
	if err != nil {
		return err
	}
	m, err := model.New(w, dt, model.Options{Numerics: f.numerics, Threads: f.threads, TraceNonFinite: f.trace, CacheBytes: capacity, MaxSeqs: seqs})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	fmt.Fprintf(stdout, "preset %s  layers %d/%d  mtp %v  format %s  device %s  numerics %s  batch %d\n",
		f.preset, c.Layers, full.Layers, c.MTPLayers > 0, f.format, be.Name(), f.numerics, f.batch)
	fmt.Fprintf(stdout, "weights %s (checkpoint bytes)  kv cache %s (%d sequences of %d tokens, %s store)  generate and load %v  copy rate %.0f GB/s\n",
		gib(checkpoint.TotalBytes(checkpoint.Tensors(c, formats))), gib(capacity), seqs, longest, layout.Store, time.Since(t0).Round(time.Millisecond), copyGBs)
	fmt.Fprintf(stdout, "per depth N: the batch filled to N-%d, %d untimed + %d timed decode steps (median), 1 step timing attention and indexer ops alone; prefill: chunk of %d tokens ending at N, after an untimed one\n",
		steps, decodeWarm, f.decode, f.prefill)

	if _, ok := be.(*gpu.Backend); ok && f.ctx.warm > 0 {
		// A GPU idle while the weights were generated runs the first depth
		// slower than the same depth after sustained load: settle it first.
		t := time.Now()
		for time.Since(t) < f.ctx.warm {
			if _, err := runDepth(m, dt, f, f.ctx.depths[0]); err != nil {
				return fmt.Errorf("--warm at %d tokens: %w", f.ctx.depths[0], err)
			}
		}
		fmt.Fprintf(stdout, "warm-up: the first depth run untimed for %v\n", time.Since(t).Round(time.Millisecond))
	}
	printDepthHeader(stdout)
	var first float64
	for i, n := range f.ctx.depths {
		r, err := runDepth(m, dt, f, n)
		if err != nil {
			return fmt.Errorf("--context %d: %w", n, err)
		}
		r.setFloor(layout, c, copyGBs)
		if i == 0 {
			first = r.stepMs()
		}
		r.print(stdout, first)
		row := r.json(be.Name(), f.preset, c.Layers)
		if err := json.NewEncoder(jl).Encode(row); err != nil {
			return fmt.Errorf("--jsonl: %w", err)
		}
	}
	if g, ok := be.(*gpu.Backend); ok && f.graphs {
		st := g.GraphStats()
		fmt.Fprintf(stdout, "cuda graphs: %d recorded, %d steps replayed, %d eager\n", st.Recorded, st.Replayed, st.Eager)
	}
	return nil
}

// fitsDevice refuses a shape whose weights, cache and step workspace do not
// fit in the GPU's free memory, naming the longest context that would.
func fitsDevice(g *gpu.Backend, c *checkpoint.Config, formats checkpoint.FormatFunc, layout kvcache.Layout, f *stackFlags, capacity int64) error {
	seqs := f.batch + 1
	ws, err := g.StepWorkspace(c, gpu.StepShape{Rows: max(f.prefill, f.batch), Seqs: seqs, Context: slices.Max(f.ctx.depths), Graphs: f.graphs})
	if err != nil {
		return err
	}
	free, _, err := g.Context().MemInfo()
	if err != nil {
		return err
	}
	// Pool size classes add a few % to the weights; the store sets aside
	// every slot's state beside the blocks; the fill's random inputs and
	// the op timing's L2 flush take a few hundred MiB more.
	m := deviceMemory{free: int64(free), weights: int64(1.03 * float64(checkpoint.TotalBytes(checkpoint.Tensors(c, formats)))),
		cache: capacity, other: ws + int64(seqs)*layout.StateBytes + 1<<30}
	return m.check(layout, f, g.Device().Name)
}

// deviceMemory is what bench stack --context needs of a device, in bytes.
type deviceMemory struct{ free, weights, cache, other int64 }

// check returns nil when everything fits in free, else an error naming the
// longest depth that fits at f's batch.
func (m deviceMemory) check(layout kvcache.Layout, f *stackFlags, device string) error {
	if m.weights+m.cache+m.other <= m.free {
		return nil
	}
	seqs, longest := f.batch+1, slices.Max(f.ctx.depths)
	fit := kvcache.NewManager(layout, max(m.free-m.weights-m.other, 0)).MaxTokens(seqs)
	return fmt.Errorf("--context %d at --batch %d does not fit on %s: weights %s + KV cache %s (%d sequences of %d tokens) + step workspace and scratch %s > %s free; at most %d tokens a sequence fit (lower --context, --batch or --layers)",
		longest, f.batch, device, gib(m.weights), gib(m.cache), seqs, longest, gib(m.other), gib(m.free), fit)
}

// hostCopyRate is the host's memmove rate in GB/s, read and write counted
// (as the GPU's copy rate is).
func hostCopyRate() float64 {
	const n = 64 << 20
	src, dst := make([]byte, n), make([]byte, n)
	copy(dst, src) // fault the pages in
	best := time.Duration(1 << 62)
	for range 3 {
		t := time.Now()
		copy(dst, src)
		best = min(best, time.Since(t))
	}
	return 2 * n / best.Seconds() / 1e9
}
