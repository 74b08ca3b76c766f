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
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
)

// serveFlags are the server options of `bench http --serve`, named as serve
// names them.
type serveFlags struct {
	device, numerics               string
	threads, maxNumSeqs, maxTokens int
	kvCache                        int64
	deviceSampling, graphs, side   bool
}

func (s *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.device, "device", "cpu", "--serve: cpu | cuda")
	fs.StringVar(&s.numerics, "numerics", "faithful", "--serve: faithful | exact")
	fs.IntVar(&s.threads, "threads", 0, "--serve: CPU worker threads (0 = GOMAXPROCS)")
	fs.IntVar(&s.maxNumSeqs, "max-num-seqs", 0, "--serve: running sequences at most (0: the largest concurrency or warm-up)")
	fs.IntVar(&s.maxTokens, "max-num-batched-tokens", 512, "--serve: tokens per engine step")
	fs.Int64Var(&s.kvCache, "kv-cache-memory", 0, "--serve: KV cache bytes (0: enough for every level's sequences at once)")
	fs.BoolVar(&s.deviceSampling, "device-sampling", false, "--serve: draw tokens on the GPU (serve --device-sampling); the stack steps then draw there too (bench stack --draw)")
	fs.BoolVar(&s.graphs, "cuda-graphs", true, "--serve: record decode steps as CUDA graphs")
	fs.BoolVar(&s.side, "side-stream", true, "--serve: run independent ops of small steps on a second stream")
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

// startServer builds --model on the device, times bench stack's decode steps
// at every concurrency on it, then serves it over HTTP on a free local port
// with serve's engine and API.
func startServer(ctx context.Context, f *httpFlags, stderr io.Writer) (*inproc, error) {
	name := f.model
	if name == "" {
		name = "synth:small"
	}
	o := &f.srv
	t0 := time.Now()
	w, tok, size, err := models.Open(name)
	if err != nil {
		return nil, err
	}
	made := time.Since(t0)
	conc := max(slices.Max(f.concurrency), f.warmup)
	seqs := o.maxNumSeqs
	if seqs == 0 {
		seqs = conc
	}
	maxLen := slices.Max(f.prompts) + f.maxTokens
	if mp := w.Config.MaxPositions; mp > 0 && maxLen > mp {
		return nil, fmt.Errorf("prompts of %d and %d output tokens exceed the model's %d positions", slices.Max(f.prompts), f.maxTokens, mp)
	}
	cache := o.kvCache
	if cache == 0 {
		layout, err := kvcache.LayoutFromConfig(w.Config, kvcache.DefaultBlockTokens, kvcache.StoreF32)
		if err != nil {
			return nil, err
		}
		per := kvcache.NewManager(layout, 0).BytesFor
		cache = int64(min(seqs, conc)) * per(maxLen)
		if f.stackSteps > 0 { // the stack plan: conc sequences and a warm-up one
			cache = max(cache, int64(slices.Max(f.concurrency)+1)*per(f.stackPrefill+f.stackSteps))
		}
	}
	var be backend.Backend
	closeBE := func() {}
	if o.device == "cuda" {
		g, err := gpu.New(gpu.Options{Graphs: o.graphs, NoSideStream: !o.side})
		if err != nil {
			return nil, fmt.Errorf("--device cuda: %w", err)
		}
		be, closeBE = g, func() { g.Close() }
	}
	t1 := time.Now()
	m, err := model.New(w, be, model.Options{Numerics: o.numerics, Threads: o.threads, CacheBytes: cache})
	if err != nil {
		closeBE()
		return nil, fmt.Errorf("--model %s: %w", name, err)
	}
	fmt.Fprintf(stderr, "bench http: %s (%d layers, %s of weights) made in %v, prepared on %s in %v, kv cache %s\n",
		name, w.Config.Layers, gib(size), made.Round(time.Millisecond), o.device, time.Since(t1).Round(time.Millisecond), gib(cache))

	steps := map[int]float64{}
	if f.stackSteps > 0 {
		for _, c := range f.concurrency {
			if _, done := steps[c]; done {
				continue
			}
			sf := &stackFlags{batch: c, prefill: f.stackPrefill, decode: f.stackSteps, prefillSeqs: 1, warmup: 1,
				seed: f.seed, draw: o.deviceSampling && be != nil}
			r, err := runPlan(m, sf, nil, nil)
			if err != nil {
				closeBE()
				return nil, fmt.Errorf("stack at batch %d: %w", c, err)
			}
			s := slices.Clone(r.steps)
			slices.Sort(s)
			steps[c] = ms(s[len(s)/2])
			fmt.Fprintf(stderr, "bench http: stack decode step at batch %d: median %.3f ms over %d steps\n", c, steps[c], len(s))
		}
	}

	gin.SetMode(gin.ReleaseMode) // as serve: no per-route debug lines
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	eng, err := engine.New(engine.FromModel(m), engine.Config{MaxNumSeqs: seqs, MaxBatchTokens: o.maxTokens,
		MaxModelLen: maxLen, DeviceSampling: o.deviceSampling, Logger: log})
	if err != nil {
		closeBE()
		return nil, err
	}
	engCtx, stopEngine := context.WithCancel(context.Background())
	engDone := make(chan error, 1)
	go func() { engDone <- eng.Run(engCtx) }()
	h := api.New(eng, tok, api.Config{ModelName: name, StopTokens: []int32{int32(w.Config.EOS)}, Logger: log})
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
