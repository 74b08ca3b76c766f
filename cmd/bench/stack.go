package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/backend/observe"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
)

// stackFlags are the options of `bench stack`.
type stackFlags struct {
	preset, format, device, numerics string
	layers, prefill, decode, batch   int
	prefillSeqs, warmup              int
	threads                          int
	seed                             uint64
	mtp, trace, profile, graphs, pdl bool
	draw                             bool
	spec                             engine.SpecConfig
	acceptRate                       float64 // forced draft acceptance (< 0: by the logits)
	timeGraphs, side                 bool
	tp                               int
	reserveGiB                       float64
	variants                         []variant // --variants
	attnPath                         cuda.Path // --attn-path
	ctx                              contextFlags
	// corrupt, if set (tests), edits the weights before the model is built.
	corrupt func(*checkpoint.Weights)
}

func parseStack(args []string, stderr io.Writer) (*stackFlags, error) {
	var f stackFlags
	fs := flag.NewFlagSet("bench stack", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.preset, "preset", "flash", "architecture: small | flash | pro")
	fs.IntVar(&f.layers, "layers", 0, "main layers to build (0 = as many as fit in free GPU memory; all on the small preset)")
	fs.StringVar(&f.format, "format", checkpoint.GenOfficial, "official | nvfp4 (routed experts)")
	fs.StringVar(&f.device, "device", "cuda", "cpu | cuda")
	fs.IntVar(&f.prefill, "prefill", 512, "prefill tokens per sequence (one chunk)")
	fs.IntVar(&f.decode, "decode", 16, "decode steps")
	fs.IntVar(&f.batch, "batch", 1, "sequences")
	fs.IntVar(&f.prefillSeqs, "prefill-seqs", 1, "sequences prefilled in one step (an engine step of prefill-seqs × prefill tokens; the warm-up takes the same shape)")
	fs.IntVar(&f.warmup, "warmup", 1, "untimed prefills of --prefill tokens before the timed ones (first-use costs: module loads, memory pool growth, tensor maps)")
	fs.Uint64Var(&f.seed, "seed", 1, "weight and token seed")
	fs.StringVar(&f.numerics, "numerics", "faithful", "faithful | exact")
	fs.IntVar(&f.threads, "threads", 0, "CPU backend workers (0 = GOMAXPROCS)")
	fs.BoolVar(&f.draw, "draw", false, "decode steps take the greedy token drawn on the device (only ids come back, as serve --device-sampling does) instead of downloading every logits row; their logits are then not checked for NaN (with --speculative-config also the drafts and the verifying rows)")
	fs.Func("speculative-config", `also time decode steps with drafts, e.g. {"method":"mtp","num_speculative_tokens":2} (builds the MTP block) or {"method":"dspark","num_speculative_tokens":3} (builds the published DSpark drafter over the last three layers built)`, func(v string) (err error) {
		f.spec, err = engine.ParseSpecConfig(v)
		return err
	})
	fs.Float64Var(&f.acceptRate, "accept-rate", -1, "with --speculative-config: accept each draft with this probability regardless of the logits (a test hook: random weights accept ~nothing); default: greedy verification")
	fs.BoolVar(&f.timeGraphs, "time-graphs", false, "time every replayed decode step on the device (two CUDA events a step) and print its median next to the step's wall time: the rest is host work and transfers")
	fs.BoolVar(&f.mtp, "mtp", false, "also build (and upload) the MTP block")
	fs.BoolVar(&f.trace, "trace-nonfinite", false, "check every sub-layer for NaN/Inf from the start (otherwise only on a rerun after a failure)")
	fs.BoolVar(&f.graphs, "cuda-graphs", true, "record decode steps as CUDA graphs and replay them (not with --profile)")
	fs.BoolVar(&f.pdl, "pdl", true, "launch kernels with programmatic dependent launch (sm_90+)")
	fs.BoolVar(&f.side, "side-stream", true, "run independent ops of steps up to 64 rows on a second stream (the shared expert beside the routed ones, the kv epilogue, compressors and indexer weights beside the q path)")
	fs.BoolVar(&f.profile, "profile", false, "time every backend op (synchronised) and print the prefill and decode breakdowns")
	fs.IntVar(&f.tp, "tensor-parallel", 1, "ranks (GPUs 0..N-1 over NCCL with --device cuda, else CPU backends); needs --layers unless --preset small or small-tp")
	fs.Float64Var(&f.reserveGiB, "reserve-gib", 8, "GPU memory kept free for activations when --layers is 0")
	synth := fs.String("model", "", "synth:PRESET[:LAYERS], serve's name of the model: sets --preset and --layers")
	fs.Func("attn-path", "force the sparse attention's path on the GPU: row (one CTA per row and head group), cluster (the keys over 8-CTA clusters, sm_90) or split (the keys over a plain grid); default: the launcher's rule", func(v string) error {
		switch p := cuda.Path(v); p {
		case cuda.PathAttnRow, cuda.PathAttnCluster, cuda.PathAttnSplit:
			f.attnPath = p
			return nil
		}
		return fmt.Errorf("want row, cluster or split, not %q", v)
	})
	addContextFlags(fs, &f.ctx)
	vars := fs.String("variants", "", "time the plan once per variant on one model (weights generated once): runs separated by ';', each 'label=names' or 'names', names 'no-side' (every op on the main stream), 'moe-decf16' (moe_fp4_decf16 for the decode MoE GEMMs), 'moe-dec' (moe_fp4_dec after a tile_map launch, not decmap), 'moe-decpre' (decmap with its first weight loads before the PDL wait), 'dense-decsk' (linear_fp8_dsk on every decode FP8 linear it runs), 'dense-deccta' (the decode FP8 linears without linear_fp8_dsk), 'unfused' (the indexer's q epilogue and the MoE's hc post as separate launches), 'attn-row', 'attn-cluster' or 'attn-split' (the sparse attention's path: one CTA per row and head group, 8-CTA clusters, a plain grid of splits) or '' or 'default' (the defaults); e.g. 'default;no-side;default'")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := f.setSynth(*synth); err != nil {
		return nil, err
	}
	if *vars != "" {
		var err error
		if f.variants, err = parseVariants(*vars); err != nil {
			return nil, err
		}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if !f.dspark() {
		f.mtp = f.mtp || f.spec.Enabled()
	}
	sideSet := false
	fs.Visit(func(fl *flag.Flag) { sideSet = sideSet || fl.Name == "side-stream" })
	switch {
	case f.layers < 0:
		return nil, errors.New("--layers must be >= 0")
	case f.prefill < 1 || f.batch < 1 || f.decode < 0 || f.warmup < 0:
		return nil, errors.New("--prefill and --batch must be >= 1, --decode and --warmup >= 0")
	case f.prefillSeqs < 1 || f.prefillSeqs > f.batch:
		return nil, errors.New("--prefill-seqs must be in [1, --batch]")
	case f.threads < 0 || f.reserveGiB < 0:
		return nil, errors.New("--threads and --reserve-gib must be >= 0")
	case f.tp < 1 || f.tp > 64:
		return nil, errors.New("--tensor-parallel must be in [1, 64]")
	case f.tp > 1 && f.layers == 0 && !strings.HasPrefix(f.preset, "small"):
		return nil, errors.New("--tensor-parallel > 1 needs --layers N")
	case f.tp > 1 && (f.profile || f.trace):
		return nil, errors.New("--profile and --trace-nonfinite run on one rank only")
	case f.acceptRate >= 0 && !f.spec.Enabled() || f.acceptRate > 1:
		return nil, errors.New("--accept-rate needs --speculative-config and must be in [0, 1]")
	case f.spec.Enabled() && (f.tp > 1 || f.variants != nil):
		return nil, errors.New("--speculative-config runs on one rank, without --variants")
	case f.variants != nil && (f.tp > 1 || f.profile || f.trace || f.device != "cuda" || sideSet):
		return nil, errors.New("--variants runs on one CUDA device, without --profile, --trace-nonfinite or --side-stream (each variant sets its own)")
	}
	if err := checkContextFlags(fs, &f); err != nil {
		return nil, err
	}
	if f.dspark() {
		if err := f.checkDSpark(); err != nil {
			return nil, err
		}
	}
	if f.format != checkpoint.GenOfficial && f.format != checkpoint.GenNVFP4 {
		return nil, fmt.Errorf("--format %q, want %s or %s", f.format, checkpoint.GenOfficial, checkpoint.GenNVFP4)
	}
	if f.device != "cpu" && f.device != "cuda" {
		return nil, fmt.Errorf("--device %q, want cpu or cuda", f.device)
	}
	if _, ok := backend.ParseNumerics(f.numerics); !ok {
		return nil, fmt.Errorf("--numerics %q, want faithful or exact", f.numerics)
	}
	return &f, nil
}

// runStack builds a random-weight model of a preset on a backend, runs one
// prefill chunk per sequence and batched decode steps, checks that every
// logits row is finite and prints the throughput.
func runStack(args []string, stdout, stderr io.Writer) error {
	f, err := parseStack(args, stderr)
	if err != nil {
		return err
	}
	return stack(f, stdout, stderr)
}

func stack(f *stackFlags, stdout, stderr io.Writer) error {
	full, err := checkpoint.PresetConfig(f.preset)
	if err != nil {
		return fmt.Errorf("--preset: %w", err)
	}
	if f.tp > 1 {
		return stackParallel(f, full, stdout)
	}
	if f.ctx.depths != nil {
		return stackContext(f, full, stdout)
	}
	formats := formatsOf(f.format)

	be, closeBE, err := openBackend(f)
	if err != nil {
		return err
	}
	layers := f.layers
	if layers == 0 {
		if layers, err = autoLayers(f, full, formats, be); err != nil {
			closeBE()
			return err
		}
	}
	c, err := f.cut(full, layers)
	if err != nil {
		closeBE()
		return err
	}

	t0 := time.Now()
	w, err := checkpoint.RandomWeights(c, f.format, f.seed)
	if err != nil {
		closeBE()
		return err
	}
	gen := time.Since(t0)
	if f.corrupt != nil {
		f.corrupt(w)
	}
	runtime.GC() // report live bytes, not the generator's garbage
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	weightBytes := checkpoint.TotalBytes(checkpoint.Tensors(c, formats))
	cacheBytes := cacheFor(c, f)

	var prof *timedBackend
	if f.profile {
		sync := func() error { return nil }
		if g, ok := be.(*gpu.Backend); ok {
			sync = g.Sync
		}
		prof = newTimed(sync)
	}
	build := func(be backend.Backend, trace bool) (*model.Model, error) {
		if prof != nil {
			be = observe.Wrap(be, prof)
		}
		return model.New(w, be, model.Options{Numerics: f.numerics, Threads: f.threads, TraceNonFinite: trace, CacheBytes: cacheBytes,
			DSparkRows: f.spec.DSparkRows(), Drafts: f.spec.Drafts()})
	}
	t1 := time.Now()
	m, err := build(be, f.trace)
	if err != nil {
		closeBE()
		return fmt.Errorf("load: %w", err)
	}
	load := time.Since(t1)

	fmt.Fprintf(stdout, "preset %s  layers %d/%d  mtp %v  format %s  device %s  numerics %s\n",
		f.preset, c.Layers, full.Layers, c.MTPLayers > 0, f.format, be.Name(), f.numerics)
	if c.HasDSpark() {
		fmt.Fprint(stdout, dsparkLine(c, full, m.DSparkRows()))
	}
	fmt.Fprintf(stdout, "weights %s (checkpoint bytes)  host heap %s  kv cache %s\n",
		gib(weightBytes), gib(int64(ms.HeapAlloc)), gib(cacheBytes))
	if g, ok := be.(*gpu.Backend); ok {
		st := g.Context().Pool().Stats()
		free, total, err := g.Context().MemInfo()
		if err == nil {
			fmt.Fprintf(stdout, "device in use %s  free %s of %s\n", gib(st.InUse), gib(int64(free)), gib(int64(total)))
		}
	}
	fmt.Fprintf(stdout, "generate %v  load %v\n", gen.Round(time.Millisecond), load.Round(time.Millisecond))

	copyGBs := 0.0
	if g, ok := be.(*gpu.Backend); ok {
		if copyGBs, err = copyBandwidth(g.Context(), g.Stream(), 5); err != nil {
			closeBE()
			return fmt.Errorf("copy bandwidth: %w", err)
		}
	}
	g, onGPU := be.(*gpu.Backend)
	fr := &floorReport{cut: c, full: full, formats: formats, batch: f.batch, copyGBs: copyGBs}
	if f.variants != nil {
		defer closeBE()
		if !onGPU {
			return errors.New("--variants needs the cuda device")
		}
		if fr.headMs, err = timeHead(m, g, f.batch); err != nil {
			return err
		}
		return runVariants(m, g, f, fr, stdout)
	}
	r, err := runPlan(m, f, prof, nil)
	var sr *specStackResult
	var specGraphs string // how the steps with drafts ran
	if err == nil && f.spec.Enabled() {
		var before gpu.GraphStats
		if onGPU {
			before = g.GraphStats()
		}
		sr, err = runSpecPlan(m, f, prof)
		if onGPU && f.graphs && err == nil {
			specGraphs = specGraphLines(before, g.GraphStats(), f.dspark())
		}
	}
	if err == nil && onGPU && f.decode > 0 {
		fr.headMs, err = timeHead(m, g, f.batch)
	}
	if err == nil && onGPU && sr != nil && f.decode > 0 { // the head over a verification's rows
		sr.headMs, err = timeHead(m, g, f.batch*(f.spec.NumTokens+1))
	}
	graphs := ""
	if onGPU {
		graphs = fmt.Sprintf("programmatic dependent launch: %v (steps of <= 16 rows)\n", g.PDL())
	}
	if onGPU && f.graphs {
		st := g.GraphStats()
		graphs += fmt.Sprintf("cuda graphs: %d recorded (%d nodes), %d steps replayed, %d eager\n", st.Recorded, st.Nodes, st.Replayed, st.Eager)
		graphs += specGraphs
		for _, e := range st.Failed {
			graphs += "cuda graph not recorded: " + e + "\n"
		}
		if len(st.ReplayMs) > 0 {
			d := slices.Clone(st.ReplayMs)
			slices.Sort(d)
			graphs += fmt.Sprintf("replayed steps on the device (inputs' copy and graph): median %.3f ms  min %.3f ms  max %.3f ms over %d\n",
				d[len(d)/2], d[0], d[len(d)-1], len(d))
		}
	}
	if err != nil && !f.trace && errors.As(err, new(*nonFinite)) {
		// Rerun the identical plan with the tracer to name the component.
		fmt.Fprintf(stderr, "bench stack: %v; rerunning with the non-finite tracer\n", err)
		closeBE()
		first := err
		if be, closeBE, err = openBackend(f); err != nil {
			return fmt.Errorf("%v; traced rerun: %w", first, err)
		}
		if m, err = build(be, true); err != nil {
			closeBE()
			return fmt.Errorf("%v; traced rerun: load: %w", first, err)
		}
		_, err = runPlan(m, f, nil, nil)
		if err == nil {
			err = fmt.Errorf("%v; none on the traced rerun", first)
		}
	}
	closeBE()
	if err != nil {
		return err
	}
	if prof != nil && prof.err != nil {
		return fmt.Errorf("profile: %w", prof.err)
	}
	r.print(stdout, f)
	if sr != nil {
		sr.print(stdout, f, r)
		sr.project(stdout, f, r, fr)
	}
	fr.print(stdout, r.steps)
	fmt.Fprint(stdout, graphs)
	if prof != nil {
		fmt.Fprintln(stdout, r.profiles)
		if sr != nil {
			fmt.Fprintln(stdout, sr.profile)
		}
	}
	return nil
}

func openBackend(f *stackFlags) (backend.Backend, func(), error) {
	if f.device == "cpu" {
		return cpu.New(cpu.Options{Threads: f.threads}), func() {}, nil
	}
	g, err := gpu.New(gpu.Options{Graphs: f.graphs, NoPDL: !f.pdl, TimeReplays: f.timeGraphs, NoSideStream: !f.side})
	if err != nil {
		return nil, nil, fmt.Errorf("--device cuda: %w", err)
	}
	if err := g.Context().SetKernelChoice(cuda.KernelChoice{Attn: f.attnPath}); err != nil {
		g.Close()
		return nil, nil, fmt.Errorf("--attn-path: %w", err)
	}
	return g, func() { g.Close() }, nil
}

// cacheFor sizes the KV cache for batch sequences of prefill+decode tokens
// plus the warm-up's --prefill-seqs scratch sequences, in the store the model
// picks for the numerics.
func cacheFor(c *checkpoint.Config, f *stackFlags) int64 {
	n, ok := backend.ParseNumerics(f.numerics)
	if !ok {
		return 0 // model.New reports the same error
	}
	layout, err := kvcache.LayoutFromConfig(c, kvcache.DefaultBlockTokens, model.StoreFor(n))
	if err != nil {
		return 0 // model.New reports the same error
	}
	per := kvcache.NewManager(layout, 0).BytesFor(f.prefill + f.decode)
	k := f.spec.NumTokens
	if k == 0 && f.spec.Method == "dspark" {
		k = c.DSparkBlockSize
	}
	if k > 0 { // steps with drafts take up to k+1 tokens, one more untimed, and k slack rows
		layout = layout.WithSlack(k)
		per = max(kvcache.NewManager(layout, 0).BytesFor(f.prefill+f.decode), kvcache.NewManager(layout, 0).BytesFor(f.prefill+(f.decode+1)*(k+1)+k+1))
	}
	return int64(f.batch+f.prefillSeqs) * per
}

// autoLayers is the number of main layers whose weights fit in the free GPU
// memory next to the embedding, head, MTP block or DSpark drafter, KV cache
// and a reserve.
func autoLayers(f *stackFlags, full *checkpoint.Config, formats checkpoint.FormatFunc, be backend.Backend) (int, error) {
	g, ok := be.(*gpu.Backend)
	if !ok {
		if f.preset == "small" {
			return full.Layers, nil
		}
		return 0, fmt.Errorf("--layers 0 needs --device cuda (free memory) or the small preset; give --layers N")
	}
	free, _, err := g.Context().MemInfo()
	if err != nil {
		return 0, fmt.Errorf("--layers 0: %w", err)
	}
	perLayer := make([]int64, full.Layers)
	var fixed int64
	all, least := full, 1 // least: the fewest layers a stack can have
	if f.dspark() {
		if all, err = f.cut(full, full.Layers); err != nil {
			return 0, err
		}
		least = len(all.DSparkTargetLayers)
	}
	for _, s := range checkpoint.Tensors(all, formats) {
		if rest, ok := strings.CutPrefix(s.Name, "layers."); ok {
			i, _ := strconv.Atoi(rest[:strings.IndexByte(rest, '.')])
			perLayer[i] += s.Bytes()
		} else if f.mtp || all.HasDSpark() || !strings.HasPrefix(s.Name, "mtp.") {
			fixed += s.Bytes()
		}
	}
	budget := float64(free) - f.reserveGiB*(1<<30)
	n := 0
	for ; n < full.Layers; n++ {
		c, err := f.cut(full, max(n+1, least))
		if err != nil {
			return 0, err
		}
		var w int64
		for _, b := range perLayer[:n+1] {
			w += b
		}
		// Pool size classes add up to 25% on odd sizes (a few % in practice);
		// the KV store may take its capacity twice (slots and blocks).
		if 1.03*float64(fixed+w)+2*float64(cacheFor(c, f)) > budget {
			break
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("--layers 0: not even one layer fits in %s free (reserve %.0f GiB)", gib(int64(free)), f.reserveGiB)
	}
	return n, nil
}

// nonFinite is a non-finite logit found by runPlan.
type nonFinite struct {
	phase     string // "prefill" or "decode step N"
	seq, idx  int
	value     float32
	positions int
}

func (e *nonFinite) Error() string {
	return fmt.Sprintf("%s: sequence %d (after %d positions): logit %d is %g", e.phase, e.seq, e.positions, e.idx, e.value)
}

func checkFinite(phase string, seq, positions int, row []float32) error {
	for i, v := range row {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return &nonFinite{phase: phase, seq: seq, idx: i, value: v, positions: positions}
		}
	}
	return nil
}

type stackResult struct {
	prefill time.Duration
	steps   []time.Duration
	tokens  []int32 // last decoded token per sequence
	drawn   int     // decode steps whose tokens were drawn on the device
	// profiles holds the per-op breakdowns (--profile).
	profiles string
}

// runPlan prefills batch sequences of random tokens (one Forward each) and
// runs the decode steps with all sequences in one batch, feeding back the
// argmax token. The same flags always give the same plan. With prof, the
// prefill and the decode steps each get an op breakdown.
// warmed, if set, runs after the warm-up (to clear counters that must not
// include it).
func runPlan(m engine.Stepper, f *stackFlags, prof *timedBackend, warmed func()) (*stackResult, error) {
	c := m.Config()
	rng := rand.New(rand.NewPCG(f.seed, 0x737461636b))
	seqs := make([]*kvcache.Sequence, f.batch)
	for i := range seqs {
		seqs[i] = m.Cache().NewSequence()
		defer m.FreeSequence(seqs[i])
	}
	if err := warmUp(m, f); err != nil {
		return nil, err
	}
	if prof != nil {
		prof.reset()
	}
	if warmed != nil {
		warmed()
	}
	r := &stackResult{tokens: make([]int32, f.batch)}
	t0 := time.Now()
	for i0 := 0; i0 < len(seqs); i0 += f.prefillSeqs {
		b := &model.Batch{}
		for _, s := range seqs[i0:min(i0+f.prefillSeqs, len(seqs))] {
			b.Items = append(b.Items, model.BatchItem{Seq: s, Tokens: randTokens(rng, f.prefill, c.Vocab)})
		}
		out, err := m.Forward(b)
		if err != nil {
			return nil, fmt.Errorf("prefill sequences %d..%d: %w", i0, i0+len(b.Items)-1, err)
		}
		for j, it := range b.Items {
			last := out.Last(j)
			if err := checkFinite("prefill", i0+j, it.Seq.Len(), last); err != nil {
				return nil, err
			}
			r.tokens[i0+j] = engine.Argmax(last)
		}
	}
	r.prefill = time.Since(t0)
	var pb strings.Builder
	if prof != nil {
		prof.print(&pb, "prefill", f.batch, r.prefill)
		prof.reset()
	}
	for step := range f.decode {
		b := &model.Batch{}
		for i, s := range seqs {
			it := model.BatchItem{Seq: s, Tokens: []int32{r.tokens[i]}}
			if f.draw {
				it.Draw = &backend.Draw{} // greedy
			}
			b.Items = append(b.Items, it)
		}
		t := time.Now()
		out, err := m.Forward(b)
		if err != nil {
			return nil, fmt.Errorf("decode step %d: %w", step, err)
		}
		r.steps = append(r.steps, time.Since(t))
		if out.IDs != nil {
			copy(r.tokens, out.IDs)
			r.drawn++
			continue
		}
		for i, s := range seqs {
			last := out.Last(i)
			if err := checkFinite(fmt.Sprintf("decode step %d", step), i, s.Len(), last); err != nil {
				return nil, err
			}
			r.tokens[i] = engine.Argmax(last)
		}
	}
	if prof != nil && f.decode > 0 {
		var wall time.Duration
		for _, d := range r.steps {
			wall += d
		}
		prof.print(&pb, fmt.Sprintf("decode (batch %d)", f.batch), f.decode, wall)
	}
	r.profiles = pb.String()
	return r, nil
}

func (r *stackResult) print(out io.Writer, f *stackFlags) {
	n := f.batch * f.prefill
	step := ""
	if f.prefillSeqs > 1 {
		step = fmt.Sprintf(", %d a step", f.prefillSeqs)
	}
	fmt.Fprintf(out, "prefill %d tokens (%d × %d%s) in %v: %.1f tok/s\n",
		n, f.batch, f.prefill, step, r.prefill.Round(time.Millisecond), float64(n)/max(r.prefill.Seconds(), 1e-9))
	if len(r.steps) == 0 {
		fmt.Fprintln(out, "decode 0 steps")
	} else {
		var total time.Duration
		for _, d := range r.steps {
			total += d
		}
		s := slices.Clone(r.steps)
		slices.Sort(s)
		fmt.Fprintf(out, "decode %d steps × batch %d in %v: %.1f tok/s  step median %.2f ms  min %.2f ms  max %.2f ms\n",
			len(s), f.batch, total.Round(time.Millisecond), float64(len(s)*f.batch)/max(total.Seconds(), 1e-9),
			ms(s[len(s)/2]), ms(s[0]), ms(s[len(s)-1]))
	}
	fmt.Fprintf(out, "finite: every logits row of %d prefills and %d decode steps", f.batch, len(r.steps)-r.drawn)
	if r.drawn > 0 {
		fmt.Fprintf(out, " (%d steps drew their tokens on the device: logits not seen)", r.drawn)
	}
	fmt.Fprintln(out)
}

func ms(d time.Duration) float64 { return d.Seconds() * 1000 }

// gib formats a byte count in GiB, or MiB below 1 GiB.
func gib(b int64) string {
	if b < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
}

// warmUp runs f.warmup untimed prefill steps of the timed steps' shape on
// scratch sequences (the KV cache holds --prefill-seqs sequences beyond the
// batch), so that the timed prefills do not carry the step's first-use costs.
// Its tokens come from their own stream: the timed tokens do not depend on
// --warmup.
func warmUp(m engine.Stepper, f *stackFlags) error {
	c := m.Config()
	rng := rand.New(rand.NewPCG(f.seed, 0x7761726d))
	for i := range f.warmup {
		b := &model.Batch{}
		for range f.prefillSeqs {
			b.Items = append(b.Items, model.BatchItem{Seq: m.Cache().NewSequence(), Tokens: randTokens(rng, f.prefill, c.Vocab)})
		}
		_, err := m.Forward(b)
		for _, it := range b.Items {
			m.FreeSequence(it.Seq)
		}
		if err != nil {
			return fmt.Errorf("warm-up prefill %d: %w", i, err)
		}
	}
	return nil
}

// randTokens draws n token ids below vocab.
func randTokens(rng *rand.Rand, n, vocab int) []int32 {
	toks := make([]int32, n)
	for k := range toks {
		toks[k] = int32(rng.IntN(vocab))
	}
	return toks
}

// setSynth sets --preset and --layers from serve's name of a synthetic model
// (synth:PRESET[:LAYERS]); an empty name changes nothing.
func (f *stackFlags) setSynth(name string) error {
	if name == "" {
		return nil
	}
	spec, err := models.ParseSynth(name)
	if err != nil {
		return err
	}
	c, err := spec.Config()
	if err != nil {
		return err
	}
	f.preset, f.layers = spec.Preset, c.Layers
	return nil
}

// cut is full with its first layers main layers (0: all of them) and the
// MTP block if --mtp, or the preset's DSpark drafter over the last layers
// built with a DSpark speculative config.
func (f *stackFlags) cut(full *checkpoint.Config, layers int) (*checkpoint.Config, error) {
	if layers == 0 {
		layers = full.Layers
	}
	c, err := checkpoint.CutLayers(full, layers, f.mtp)
	if err == nil && f.dspark() {
		var s checkpoint.DSparkShape
		if s, err = checkpoint.PresetDSpark(f.preset); err == nil {
			c, err = checkpoint.WithDSpark(c, s)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("--layers %d: %w", layers, err)
	}
	return c, nil
}
