package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

// httpFlags are the options of `bench http`.
type httpFlags struct {
	url, model, jsonl        string
	cpuProfile               string
	prompts, concurrency     []int
	maxTokens, requests      int
	warmup                   int
	timeout                  time.Duration
	seed                     uint64
	serve                    bool
	srv                      serveFlags // --serve: the in-process server and the stack steps
	stackPrefill, stackSteps int
}

// intList parses "1,8,64" into positive ints.
func intList(name string, dst *[]int) func(string) error {
	return func(v string) error {
		*dst = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("--%s: %q is not a positive integer", name, f)
			}
			*dst = append(*dst, n)
		}
		return nil
	}
}

func parseHTTP(args []string, stderr io.Writer) (*httpFlags, error) {
	f := httpFlags{prompts: []int{512, 4096}, concurrency: []int{1, 8, 64, 256}}
	fs := flag.NewFlagSet("bench http", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.url, "url", "http://127.0.0.1:8000", "server base URL (not with --serve)")
	fs.StringVar(&f.model, "model", "", "model id to request (default: the server's first); with --serve, the model to serve: a checkpoint directory or synth:small, synth:flash:N, synth:pro:N")
	fs.Func("prompt-tokens", "prompt lengths in tokens, comma-separated (default 512,4096)", intList("prompt-tokens", &f.prompts))
	fs.Func("concurrency", "requests in flight, comma-separated levels (default 1,8,64,256)", intList("concurrency", &f.concurrency))
	fs.IntVar(&f.maxTokens, "max-tokens", 64, "output tokens of every request (ignore_eos: exactly this many)")
	fs.IntVar(&f.requests, "requests", 8, "requests per level at least; a level sends max(this, concurrency)")
	fs.IntVar(&f.warmup, "warmup", -1, "untimed requests sent at once before the levels, with the first prompt length (-1: the largest concurrency)")
	fs.StringVar(&f.jsonl, "jsonl", "", "also write one JSON object per level to this file")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the timed levels to this file (with --serve it holds the server's work too)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Minute, "bound on the whole run")
	fs.Uint64Var(&f.seed, "seed", 1, "prompt seed")
	fs.BoolVar(&f.serve, "serve", false, "serve --model in this process (the engine and API of serve) instead of using --url, and time bench stack's decode step at each concurrency on the same model first")
	fs.IntVar(&f.stackPrefill, "stack-prefill", 512, "--serve: prompt tokens of the bench stack sequences")
	fs.IntVar(&f.stackSteps, "stack-decode", 16, "--serve: bench stack decode steps a concurrency level (0: no stack steps)")
	f.srv.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	urlSet := false
	fs.Visit(func(fl *flag.Flag) { urlSet = urlSet || fl.Name == "url" })
	switch {
	case f.maxTokens < 1 || f.requests < 1:
		return nil, errors.New("--max-tokens and --requests must be >= 1")
	case f.warmup < -1:
		return nil, errors.New("--warmup must be >= 0 (or -1)")
	case f.stackPrefill < 1 || f.stackSteps < 0:
		return nil, errors.New("--stack-prefill must be >= 1, --stack-decode >= 0")
	case f.serve && urlSet:
		return nil, errors.New("--url and --serve exclude each other")
	case f.srv.hostOnly && (!f.serve || f.model != ""):
		return nil, errors.New("--host-only needs --serve and serves no --model")
	case slices.Max(f.concurrency) > 4096 || f.requests > 100000:
		return nil, errors.New("--concurrency must be <= 4096, --requests <= 100000")
	case slices.Max(f.prompts)+f.maxTokens > 1<<20:
		return nil, errors.New("--prompt-tokens plus --max-tokens must be <= 1048576 (V4's context)")
	}
	if f.warmup == -1 {
		f.warmup = slices.Max(f.concurrency)
	}
	if f.serve {
		if err := f.srv.check(); err != nil {
			return nil, err
		}
	}
	return &f, nil
}

// cell is one level's result: the JSON line and a table row.
type cell struct {
	Prompt      int     `json:"prompt_tokens"`
	Output      int     `json:"output_tokens"`
	Concurrency int     `json:"concurrency"`
	Requests    int     `json:"requests"`
	Failed      int     `json:"failed"`
	WallS       float64 `json:"wall_s"`
	TTFTp50     float64 `json:"ttft_ms_p50"`
	TTFTp99     float64 `json:"ttft_ms_p99"`
	TPOTp50     float64 `json:"tpot_ms_p50"`
	TPOTp99     float64 `json:"tpot_ms_p99"`
	OutTokS     float64 `json:"output_tok_s"`
	ReqS        float64 `json:"req_s"`
	// StepMs is bench stack's median decode step at batch = concurrency on
	// the same model (--serve), and TPOTOverStep the TPOT p50 over it.
	StepMs       float64 `json:"stack_step_ms,omitempty"`
	TPOTOverStep float64 `json:"tpot_over_step,omitempty"`
	firstErr     error
}

func summarise(samples []sample, wall time.Duration) cell {
	var ttft, tpot []float64
	c := cell{Requests: len(samples), WallS: wall.Seconds()}
	tokens := 0
	for _, s := range samples {
		if s.err != nil {
			c.Failed++
			if c.firstErr == nil {
				c.firstErr = s.err
			}
			continue
		}
		tokens += s.tokens
		ttft = append(ttft, ms(s.ttft))
		if s.tokens > 1 {
			tpot = append(tpot, ms(s.total-s.ttft)/float64(s.tokens-1))
		}
	}
	c.TTFTp50, c.TTFTp99 = pct(ttft, 50), pct(ttft, 99)
	c.TPOTp50, c.TPOTp99 = pct(tpot, 50), pct(tpot, 99)
	c.OutTokS = float64(tokens) / max(wall.Seconds(), 1e-9)
	c.ReqS = float64(len(samples)-c.Failed) / max(wall.Seconds(), 1e-9)
	return c
}

// runHTTP measures a server through /v1/completions at every prompt length
// and concurrency level.
func runHTTP(args []string, stdout, stderr io.Writer) error {
	f, err := parseHTTP(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	return benchHTTP(ctx, f, stdout, stderr)
}

func benchHTTP(ctx context.Context, f *httpFlags, stdout, stderr io.Writer) error {
	var steps map[int]float64
	url := f.url
	if f.serve {
		s, err := startServer(ctx, f, stderr)
		if err != nil {
			return err
		}
		defer s.stop()
		url, steps = s.url, s.steps
	}
	conc := slices.Max(f.concurrency)
	cl := newClient(url, max(conc, f.warmup))
	if cl.model = f.model; cl.model == "" || f.serve {
		m, err := cl.firstModel(ctx)
		if err != nil {
			return err
		}
		cl.model = m
	}
	pool, err := cl.tokenPool(ctx)
	if err != nil {
		return err
	}
	var jl io.Writer = io.Discard
	if f.jsonl != "" {
		fh, err := os.Create(f.jsonl)
		if err != nil {
			return fmt.Errorf("--jsonl: %w", err)
		}
		defer fh.Close()
		jl = fh
	}
	if f.warmup > 0 {
		fmt.Fprintf(stderr, "bench http: warm-up, %d requests of %d tokens at once\n", f.warmup, f.prompts[0])
		ss, _ := cl.level(ctx, pool, f.prompts[0], f.warmup, f.warmup, f.maxTokens, f.seed<<32)
		if c := summarise(ss, 0); c.firstErr != nil {
			return fmt.Errorf("warm-up: %d of %d requests failed, first: %w", c.Failed, c.Requests, c.firstErr)
		}
	}
	if f.cpuProfile != "" {
		fh, err := os.Create(f.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer fh.Close()
		if err := pprof.StartCPUProfile(fh); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Fprintf(stdout, "model %s  output %d tokens a request (ignore_eos)\n", cl.model, f.maxTokens)
	fmt.Fprintf(stdout, "%7s %5s %5s %10s %10s %9s %9s %10s %7s %9s %9s\n",
		"prompt", "conc", "reqs", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "out tok/s", "req/s", "step ms", "TPOT/step")
	var failed error
	for pi, plen := range f.prompts {
		for ci, c := range f.concurrency {
			n := max(f.requests, c)
			seed := f.seed<<32 + uint64(pi*len(f.concurrency)+ci+1)<<20
			ss, wall := cl.level(ctx, pool, plen, c, n, f.maxTokens, seed)
			r := summarise(ss, wall)
			r.Prompt, r.Output, r.Concurrency = plen, f.maxTokens, c
			if st, ok := steps[c]; ok && st > 0 {
				r.StepMs, r.TPOTOverStep = st, r.TPOTp50/st
			}
			fmt.Fprintf(stdout, "%7d %5d %5d %10.1f %10.1f %9.2f %9.2f %10.1f %7.2f %9s %9s\n",
				plen, c, n, r.TTFTp50, r.TTFTp99, r.TPOTp50, r.TPOTp99, r.OutTokS, r.ReqS, opt(r.StepMs, "%.2f"), opt(r.TPOTOverStep, "%.2f"))
			line, _ := json.Marshal(r)
			fmt.Fprintf(jl, "%s\n", line)
			if r.firstErr != nil && failed == nil {
				failed = fmt.Errorf("prompt %d, concurrency %d: %d of %d requests failed, first: %w", plen, c, r.Failed, n, r.firstErr)
			}
			if ctx.Err() != nil {
				return fmt.Errorf("bench http: %w", ctx.Err())
			}
		}
	}
	return failed
}

// opt formats v, or "-" for 0 (not measured).
func opt(v float64, format string) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf(format, v)
}
