package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/megamoe/megamoe/api"
	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

// serveFlags are the server options of `bench http --serve`, named as serve
// names them.
type serveFlags struct {
	device, numerics               string
	threads, maxNumSeqs, maxTokens int
	kvCache                        int64
	deviceSampling, graphs, side   bool
	hostOnly                       bool
}

func (s *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.device, "device", "cpu", "--serve: cpu | cuda")
	fs.StringVar(&s.numerics, "numerics", "faithful", "--serve: faithful | exact")
	fs.IntVar(&s.threads, "threads", 0, "--serve: CPU worker threads (0 = GOMAXPROCS)")
	fs.IntVar(&s.maxNumSeqs, "max-num-seqs", 0, "--serve: running sequences at most (0: the largest concurrency or warm-up)")
	fs.IntVar(&s.maxTokens, "max-num-batched-tokens", 512, "--serve: tokens per engine step")
	fs.Int64Var(&s.kvCache, "kv-cache-memory", 0, "--serve: KV cache bytes (0: enough for every level's sequences at once)")
	fs.BoolVar(&s.deviceSampling, "device-sampling", true, "--serve: draw tokens on the GPU as serve does by default (false: on the host); the stack steps then draw there too (bench stack --draw); no effect on the CPU but with --host-only")
	fs.BoolVar(&s.graphs, "cuda-graphs", true, "--serve: record decode steps as CUDA graphs")
	fs.BoolVar(&s.side, "side-stream", true, "--serve: run independent ops of small steps on a second stream")
	fs.BoolVar(&s.hostOnly, "host-only", false, "--serve: serve a model that computes nothing (a fixed random logits row over V4's vocabulary, a copy a step) instead of --model: TPOT is then the host's cost per token (scheduler, sampling, API, detokenizing, SSE)")
}

func (s *serveFlags) check() error {
	switch {
	case s.device != "cpu" && s.device != "cuda":
		return fmt.Errorf("--device %q, want cpu or cuda", s.device)
	case s.threads < 0 || s.maxNumSeqs < 0 || s.kvCache < 0:
		return errors.New("--threads, --max-num-seqs and --kv-cache-memory must be >= 0")
	case s.maxTokens < 1:
		return errors.New("--max-num-batched-tokens must be >= 1")
	}
	if _, ok := backend.ParseNumerics(s.numerics); !ok {
		return fmt.Errorf("--numerics %q, want faithful or exact", s.numerics)
	}
	return nil
}

// inproc is a server running in this process.
type inproc struct {
	url   string
	steps map[int]float64 // bench stack's median decode step (ms) by batch
	stop  func()
}

// startServer builds --model on the device (or the host-only model), times
// bench stack's decode steps at every concurrency on it, then serves it over
// HTTP on a free local port with serve's engine and API.
func startServer(ctx context.Context, f *httpFlags, stderr io.Writer) (*inproc, error) {
	var m engine.Model
	var tok *tokenizer.Tokenizer
	var eos int
	steps := map[int]float64{}
	closeBE := func() {}
	o := &f.srv
	var err error
	name, seqs, maxLen, cacheFor := sizes(f)
	if o.hostOnly {
		name = "host-only"
		if tok, err = tokenizer.SynthV4(); err != nil {
			return nil, err
		}
		c, err := checkpoint.PresetConfig("flash")
		if err != nil {
			return nil, err
		}
		cache, err := cacheFor(c)
		if err != nil {
			return nil, err
		}
		layout, err := kvcache.LayoutFromConfig(c, kvcache.DefaultBlockTokens, store(o))
		if err != nil {
			return nil, err
		}
		m, eos = newHostModel(tok.VocabSize(), kvcache.NewManager(layout, cache)), c.EOS
	} else {
		var mm *model.Model
		if mm, tok, closeBE, err = buildModel(f, name, cacheFor, stderr); err != nil {
			return nil, err
		}
		if steps, err = stackSteps(f, mm, stderr); err != nil {
			closeBE()
			return nil, err
		}
		m, eos = engine.FromModel(mm), mm.Config().EOS
	}

	gin.SetMode(gin.ReleaseMode) // as serve: no per-route debug lines
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	eng, err := engine.New(m, engine.Config{MaxNumSeqs: seqs, MaxBatchTokens: o.maxTokens,
		MaxModelLen: maxLen, DeviceSampling: o.deviceSampling && (o.hostOnly || o.device == "cuda"), Logger: log})
	if err != nil {
		closeBE()
		return nil, err
	}
	engCtx, stopEngine := context.WithCancel(context.Background())
	engDone := make(chan error, 1)
	go func() { engDone <- eng.Run(engCtx) }()
	h := api.New(eng, tok, api.Config{ModelName: name, StopTokens: []int32{int32(eos)}, Logger: log})
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		stopEngine()
		<-engDone
		closeBE()
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	stop := func() {
		shCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shCtx)
		stopEngine()
		<-engDone
		closeBE()
	}
	return &inproc{url: "http://" + ln.Addr().String(), steps: steps, stop: stop}, nil
}

// sizes gives the served name, the running sequences, the context length and
// the KV cache size for a model of architecture c (--kv-cache-memory, or
// enough for every level's sequences at once and for the stack plan).
func sizes(f *httpFlags) (string, int, int, func(*checkpoint.Config) (int64, error)) {
	o := &f.srv
	name := f.model
	if name == "" {
		name = "synth:small"
	}
	conc := max(slices.Max(f.concurrency), f.warmup)
	seqs := o.maxNumSeqs
	if seqs == 0 {
		seqs = conc
	}
	maxLen := slices.Max(f.prompts) + f.maxTokens
	cacheFor := func(c *checkpoint.Config) (int64, error) {
		if mp := c.MaxPositions; mp > 0 && maxLen > mp {
			return 0, fmt.Errorf("prompts of %d and %d output tokens exceed the model's %d positions", slices.Max(f.prompts), f.maxTokens, mp)
		}
		if o.kvCache > 0 {
			return o.kvCache, nil
		}
		layout, err := kvcache.LayoutFromConfig(c, kvcache.DefaultBlockTokens, store(o))
		if err != nil {
			return 0, err
		}
		per := kvcache.NewManager(layout, 0).BytesFor
		cache := int64(min(seqs, conc)) * per(maxLen)
		if f.stackSteps > 0 && !o.hostOnly { // the stack plan: conc sequences and a warm-up one
			cache = max(cache, int64(slices.Max(f.concurrency)+1)*per(f.stackPrefill+f.stackSteps))
		}
		return cache, nil
	}
	return name, seqs, maxLen, cacheFor
}

// store is the KV store the model picks for --numerics.
func store(o *serveFlags) kvcache.Store {
	n, _ := backend.ParseNumerics(o.numerics) // checked by parseHTTP
	return model.StoreFor(n)
}

// buildModel opens the model name and prepares it on --device.
func buildModel(f *httpFlags, name string, cacheFor func(*checkpoint.Config) (int64, error), stderr io.Writer) (*model.Model, *tokenizer.Tokenizer, func(), error) {
	o := &f.srv
	t0 := time.Now()
	w, tok, size, err := models.Open(name)
	if err != nil {
		return nil, nil, nil, err
	}
	made := time.Since(t0)
	cache, err := cacheFor(w.Config)
	if err != nil {
		return nil, nil, nil, err
	}
	var be backend.Backend
	closeBE := func() {}
	if o.device == "cuda" {
		g, err := gpu.New(gpu.Options{Graphs: o.graphs, NoSideStream: !o.side})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--device cuda: %w", err)
		}
		be, closeBE = g, func() { g.Close() }
	}
	t1 := time.Now()
	m, err := model.New(w, be, model.Options{Numerics: o.numerics, Threads: o.threads, CacheBytes: cache})
	if err != nil {
		closeBE()
		return nil, nil, nil, fmt.Errorf("--model %s: %w", name, err)
	}
	fmt.Fprintf(stderr, "bench http: %s (%d layers, %s of weights) made in %v, prepared on %s in %v, kv cache %s\n",
		name, w.Config.Layers, gib(size), made.Round(time.Millisecond), o.device, time.Since(t1).Round(time.Millisecond), gib(cache))
	return m, tok, closeBE, nil
}

// stackSteps times bench stack's decode steps at every concurrency on m: the
// median step in ms by batch.
func stackSteps(f *httpFlags, m *model.Model, stderr io.Writer) (map[int]float64, error) {
	steps := map[int]float64{}
	if f.stackSteps == 0 {
		return steps, nil
	}
	_, onGPU := m.Backend().(*gpu.Backend)
	for _, c := range f.concurrency {
		if _, done := steps[c]; done {
			continue
		}
		sf := &stackFlags{batch: c, prefill: f.stackPrefill, decode: f.stackSteps, prefillSeqs: 1, warmup: 1,
			seed: f.seed, draw: f.srv.deviceSampling && onGPU}
		r, err := runPlan(m, sf, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("stack at batch %d: %w", c, err)
		}
		s := slices.Clone(r.steps)
		slices.Sort(s)
		steps[c] = ms(s[len(s)/2])
		fmt.Fprintf(stderr, "bench http: stack decode step at batch %d: median %.3f ms over %d steps\n", c, steps[c], len(s))
	}
	return steps, nil
}
