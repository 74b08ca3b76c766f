// Command serve runs the MegaMoE engine behind an OpenAI-compatible HTTP API.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/megamoe/megamoe/api"
	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/internal/gpumon"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

// keepAlive is how often a stream waiting for its first token gets an SSE
// comment, well inside common proxies' idle timeouts (60 s for nginx).
const keepAlive = 15 * time.Second

// abortGrace is how long requests ended by an expired drain have to write
// their error before the connections are closed.
const abortGrace = 5 * time.Second

// maxBatchTokens bounds --max-num-batched-tokens: a step's activations grow
// with its tokens (and the MoE tile grid with tokens × top-k).
const maxBatchTokens = 32768

type options struct {
	model, servedName, host, apiKey, device, numerics string
	port, maxNumSeqs, maxModelLen, threads, tp        int
	maxBatchTokens                                    int
	kvCacheMemory                                     int64
	gpuMemUtil                                        float64
	shutdownTimeout                                   time.Duration
	readTimeout, writeIdleTimeout, idleTimeout        time.Duration
	maxHeaderBytes, maxQueuedPerConn                  int
	aliases, allowedOrigins                           []string // further served names; CORS origins
	cudaGraphs, deviceSampling, sideStream            bool
	spec                                              engine.SpecConfig
	prefixCaching                                     bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }() // the first signal drains; a second one kills at once
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	var o options
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.model, "model", "", "checkpoint directory with config.json and tokenizer.json (default: the embedded small model), or synth:small, synth:flash:N or synth:pro:N (N layers of random weights, in memory)")
	fs.Func("served-model-name", `model ids in the API, comma-separated or repeated; the first names responses (default "megamoe-small" for the embedded model, else the directory name)`, func(v string) error {
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n == "" {
				return errors.New("empty model name")
			} else if o.servedName == "" {
				o.servedName = n
			} else {
				o.aliases = append(o.aliases, n)
			}
		}
		return nil
	})
	fs.Func("allowed-origins", `CORS origins allowed to call the API, comma-separated or a JSON list ("*": any; default none, no CORS)`, func(v string) error {
		if strings.HasPrefix(strings.TrimSpace(v), "[") {
			return json.Unmarshal([]byte(v), &o.allowedOrigins)
		}
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				o.allowedOrigins = append(o.allowedOrigins, n)
			}
		}
		return nil
	})
	fs.StringVar(&o.host, "host", "0.0.0.0", "listen address")
	fs.IntVar(&o.port, "port", 8000, "listen port")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 64, "running sequences at most")
	fs.IntVar(&o.maxBatchTokens, "max-num-batched-tokens", 512, "tokens per engine step: prefill chunks plus decode tokens (larger steps prefill faster and delay running decodes more)")
	fs.BoolVar(&o.deviceSampling, "device-sampling", true, "on a CUDA device, draw the tokens of requests without logprobs, penalties or logit bias there (only their ids come back); false samples every logits row on the host (no effect on the CPU)")
	fs.BoolVar(&o.prefixCaching, "enable-prefix-caching", true, "reuse the KV cache of prompt prefixes computed before (blocks of 256 tokens)")
	fs.BoolFunc("no-enable-prefix-caching", "turn prefix caching off", func(string) error { o.prefixCaching = false; return nil })
	fs.StringVar(&o.apiKey, "api-key", "", "require this bearer token on /v1 (also $MEGAMOE_API_KEY)")
	fs.StringVar(&o.device, "device", "auto", "cpu | cuda | auto")
	fs.StringVar(&o.numerics, "numerics", "faithful", "faithful | exact")
	fs.IntVar(&o.threads, "threads", 0, "CPU worker threads (0 = GOMAXPROCS)")
	fs.BoolVar(&o.cudaGraphs, "cuda-graphs", true, "record decode steps as CUDA graphs and replay them (GPU)")
	fs.BoolVar(&o.sideStream, "side-stream", true, "on a CUDA device, run independent ops of small steps on a second stream (the shared expert beside the routed ones)")
	fs.IntVar(&o.tp, "tensor-parallel", 1, "ranks to split the model over (attention heads, head vocabulary, experts): GPUs 0..N-1 with --device cuda, else CPU workers")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", time.Minute, "on SIGTERM/SIGINT, how long in-flight requests may take to finish")
	fs.DurationVar(&o.readTimeout, "read-timeout", time.Minute, "time a client has to send a request's headers and body")
	fs.DurationVar(&o.writeIdleTimeout, "write-idle-timeout", time.Minute, "time each write of a response may take: a client that stops reading is dropped (a stream may last longer, event by event)")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", 2*time.Minute, "how long an idle keep-alive connection stays open")
	fs.IntVar(&o.maxHeaderBytes, "max-header-bytes", 64<<10, "largest request header block (431 beyond)")
	fs.IntVar(&o.maxQueuedPerConn, "max-queued-per-conn", 64, "requests of one connection (HTTP/2 carries many) waiting for their first token at most; beyond, a 429 with Retry-After (0: no bound)")
	addCapacityFlags(fs, &o)
	numSpec := fs.Int("num-speculative-tokens", 0, "draft this many tokens per decode step with the checkpoint's MTP block (--speculative-config with method mtp)")
	fs.Func("speculative-config", `speculative decoding as JSON, e.g. {"method":"mtp","num_speculative_tokens":2} or {"method":"dspark"}`, func(v string) (err error) {
		o.spec, err = engine.ParseSpecConfig(v)
		return err
	})
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := o.spec.WithNumTokens(*numSpec); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case o.port < 0 || o.port > 65535:
		return nil, fmt.Errorf("--port %d out of range", o.port)
	case o.maxNumSeqs < 1:
		return nil, errors.New("--max-num-seqs must be >= 1")
	case o.maxBatchTokens < 1 || o.maxBatchTokens > maxBatchTokens:
		return nil, fmt.Errorf("--max-num-batched-tokens must be in [1, %d]", maxBatchTokens)
	case o.threads < 0:
		return nil, errors.New("--threads must be >= 0")
	case o.tp < 1 || o.tp > 64:
		return nil, errors.New("--tensor-parallel must be in [1, 64]")
	case o.shutdownTimeout <= 0:
		return nil, errors.New("--shutdown-timeout must be > 0")
	case o.readTimeout <= 0 || o.writeIdleTimeout <= 0 || o.idleTimeout <= 0:
		return nil, errors.New("--read-timeout, --write-idle-timeout and --idle-timeout must be > 0")
	case o.maxHeaderBytes < 4<<10:
		return nil, errors.New("--max-header-bytes must be >= 4096")
	case o.maxQueuedPerConn < 0:
		return nil, errors.New("--max-queued-per-conn must be >= 0")
	}
	if err := checkCapacityFlags(fs, &o); err != nil {
		return nil, err
	}
	switch o.device {
	case "cpu", "auto":
	case "cuda":
	default:
		return nil, fmt.Errorf("--device %q, want cpu, cuda or auto", o.device)
	}
	if o.apiKey == "" {
		o.apiKey = os.Getenv("MEGAMOE_API_KEY")
	}
	return &o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	dir, name := o.model, o.servedName
	if dir == "" {
		if dir, err = models.ExtractSmall(); err != nil {
			return err
		}
		if name == "" {
			name = "megamoe-small"
		}
	}
	if name == "" {
		name = filepath.Base(filepath.Clean(dir))
	}
	t0 := time.Now()
	w, tok, eng, err := load(dir, o, log, newProgress(stderr, 3))
	if err != nil {
		return err
	}
	maxLen := eng.Config().MaxModelLen
	log.Info("model ready", "dir", dir, "name", name, "layers", w.Config.Layers, "vocab", w.Config.Vocab,
		"max_model_len", maxLen, "load", time.Since(t0).Round(time.Millisecond))

	engCtx, stopEngine := context.WithCancel(context.Background())
	engDone := make(chan error, 1)
	go func() { engDone <- eng.Run(engCtx) }()

	// abort ends the requests still in flight when the drain runs out of time,
	// so streams end with an error event rather than a cut connection.
	abortCtx, abort := context.WithCancel(context.Background())
	defer abort()
	gin.SetMode(gin.ReleaseMode)
	stopTokens := []int32{int32(w.Config.EOS)}
	gauges, closeNVML := gpuCollectors(gpumon.Open, log)
	defer closeNVML()
	cfg := apiConfig(o, name, stopTokens, log, abortCtx)
	cfg.Collectors = gauges
	h := api.New(eng, tok, cfg)
	addr := net.JoinHostPort(o.host, strconv.Itoa(o.port))
	srv := newHTTPServer(addr, h, o)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		stopEngine()
		<-engDone
		return err
	}
	log.Info("listening", "addr", ln.Addr().String())
	srvErr := make(chan error, 1)
	go func() { srvErr <- srv.Serve(ln) }()

	// Shutdown runs these hooks after it has closed the listener, so the drain
	// message never precedes the moment new connections are refused.
	srv.RegisterOnShutdown(func() {
		log.Info("shutting down: draining in-flight requests", "timeout", o.shutdownTimeout)
	})
	select {
	case <-ctx.Done():
	case err = <-srvErr:
	}
	// Shutdown closes the listener at once, so new connections are refused, and
	// waits for the requests in flight, streams included, to finish; only then
	// does the engine stop.
	shCtx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	if serr := srv.Shutdown(shCtx); serr != nil {
		log.Warn("drain cut short; ending the remaining requests", "err", serr)
		abort()
		endCtx, cancelEnd := context.WithTimeout(context.Background(), abortGrace)
		if srv.Shutdown(endCtx) != nil {
			_ = srv.Close()
		}
		cancelEnd()
		if err == nil {
			err = fmt.Errorf("drain: %w", serr)
		}
	} else if ctx.Err() != nil {
		log.Info("drained")
	}
	stopEngine()
	<-engDone
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// apiConfig is the API's configuration from o.
func apiConfig(o *options, name string, stopTokens []int32, log *slog.Logger, shutdown context.Context) api.Config {
	return api.Config{ModelName: name, APIKey: o.apiKey, Version: "megamoe-dev", StopTokens: stopTokens,
		Logger: log, WriteIdleTimeout: o.writeIdleTimeout, KeepAlive: keepAlive, Shutdown: shutdown,
		Aliases: o.aliases, AllowedOrigins: o.allowedOrigins, MaxQueuedPerConn: o.maxQueuedPerConn}
}

// newHTTPServer applies the connection limits of o. The write timeout is the
// handlers' (per write, so streams may last); here only reads and idle
// connections are bounded. An HTTP/1.1 connection serves one request at a
// time: a pipelined request waits, unread, until the one before is answered.
// HTTP/2 without TLS (prior knowledge) is served too; its connections carry
// many requests, of which --max-queued-per-conn may wait at once.
func newHTTPServer(addr string, h http.Handler, o *options) *http.Server {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: min(10*time.Second, o.readTimeout),
		ReadTimeout:       o.readTimeout,
		IdleTimeout:       o.idleTimeout,
		MaxHeaderBytes:    o.maxHeaderBytes,
		Protocols:         p,
		ConnContext:       api.ConnContext,
	}
}

// load reads the checkpoint and the tokenizer (or builds a synthetic model), prepares the weights and
// builds the engine, reporting each stage on bar.
func load(dir string, o *options, log *slog.Logger, bar *progress) (_ *checkpoint.Weights, _ *tokenizer.Tokenizer, _ *engine.Engine, err error) {
	defer func() { bar.finish(err == nil) }()
	bar.stage("reading checkpoint and tokenizer")
	w, tok, size, err := models.Open(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	bar.stage("preparing " + formatBytes(size) + " of weights")
	if err := o.spec.CheckCheckpoint(w.Config); err != nil {
		return nil, nil, nil, err
	}
	m, onGPU, err := buildModel(w, o, log)
	if err != nil {
		return nil, nil, nil, err
	}
	bar.stage("starting engine")
	cache := m.Cache()
	if err := reportCache(log, w.Config, cache, o.maxNumSeqs); err != nil {
		return nil, nil, nil, err
	}
	maxLen, lowered, err := contextLength(o.maxModelLen, w.Config.MaxPositions, cache.MaxTokens(1), cache.CapacityBytes())
	if err != nil {
		return nil, nil, nil, err
	}
	if lowered {
		log.Warn("context length lowered to what the KV cache holds", "max_model_len", maxLen, "max_position_embeddings", w.Config.MaxPositions)
	}
	eng, err := engine.New(engine.FromModel(m), engine.Config{MaxNumSeqs: o.maxNumSeqs, MaxBatchTokens: o.maxBatchTokens, MaxModelLen: maxLen, DeviceSampling: o.deviceSampling && onGPU,
		Speculative: o.spec, PrefixCaching: o.prefixCaching, Logger: log})
	if err != nil {
		return nil, nil, nil, err
	}
	return w, tok, eng, nil
}

// formatBytes writes n in binary units (KiB, MiB, GiB).
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 3; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGT"[exp])
}

// buildModel prepares w on the chosen backend, or split over --tensor-parallel
// ranks (one GPU each with --device cuda; CPU backends otherwise), and
// whether it runs on GPUs.
func buildModel(w *checkpoint.Weights, o *options, log *slog.Logger) (engine.Stepper, bool, error) {
	opts := model.Options{Numerics: o.numerics, Threads: o.threads, DSparkRows: o.spec.DSparkRows(), Drafts: o.spec.Drafts()}
	if o.tp == 1 {
		be, err := pickBackend(o.device, gpu.Options{Graphs: o.cudaGraphs, NoSideStream: !o.sideStream}, log)
		if err != nil {
			return nil, false, err
		}
		var gs []*gpu.Backend
		if g, ok := be.(*gpu.Backend); ok {
			gs = append(gs, g)
		}
		cacheOptions(&opts, o, w.Config, gs, log)
		m, err := model.New(w, be, opts)
		return m, len(gs) > 0, err
	}
	cacheOptions(&opts, o, w.Config, nil, log)
	bes := make([]backend.Backend, o.tp)
	if o.device == "cuda" {
		gs := make([]*gpu.Backend, o.tp)
		for r := range bes {
			g, err := gpu.New(gpu.Options{Device: r})
			if err != nil {
				return nil, false, fmt.Errorf("--tensor-parallel %d: GPU %d: %w", o.tp, r, err)
			}
			gs[r], bes[r] = g, g
		}
		cacheOptions(&opts, o, w.Config, gs, log)
		comms, _, err := gpu.NewNCCLComms(gs)
		if err == nil {
			log.Info("serving on GPUs over NCCL", "ranks", o.tp)
			p, err := model.NewParallelComms(w, bes, comms, opts)
			if err != nil {
				return nil, false, fmt.Errorf("--tensor-parallel %d: %w", o.tp, err)
			}
			return p, true, nil
		}
		log.Info("NCCL unavailable, exchanging through host memory", "ranks", o.tp, "reason", err)
	} else {
		threads := o.threads
		if threads == 0 {
			threads = runtime.GOMAXPROCS(0)
		}
		for r := range bes {
			bes[r] = cpu.New(cpu.Options{Threads: max(1, threads/o.tp)})
		}
		log.Info("serving on the CPU split over ranks", "ranks", o.tp)
	}
	p, err := model.NewParallel(w, bes, opts)
	if err != nil {
		return nil, false, fmt.Errorf("--tensor-parallel %d: %w", o.tp, err)
	}
	return p, o.device == "cuda", nil
}

// pickBackend returns the GPU backend for --device cuda (an error without a
// usable GPU), the GPU if one is usable for auto, and nil (the CPU) otherwise.
func pickBackend(device string, opt gpu.Options, log *slog.Logger) (backend.Backend, error) {
	if device == "cpu" {
		return nil, nil
	}
	g, err := gpu.New(opt)
	if err != nil {
		if device == "cuda" {
			return nil, fmt.Errorf("--device cuda: %w", err)
		}
		log.Info("no usable GPU, serving on the CPU", "reason", err)
		return nil, nil
	}
	log.Info("serving on the GPU", "device", g.Device().Name)
	return g, nil
}
