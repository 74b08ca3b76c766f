package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
)

// prefixFlags are the options of `bench prefix`.
type prefixFlags struct {
	stack                     stackFlags
	prefix, suffix, requests  int
	turns, turnTokens, answer int
	firstTurn, reasoning      int
	batchTokens               int
	cacheGiB                  float64
}

func parsePrefix(args []string, stderr io.Writer) (*prefixFlags, error) {
	var f prefixFlags
	fs := flag.NewFlagSet("bench prefix", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.stack.preset, "preset", "small", "architecture: small | flash | pro (random weights)")
	fs.IntVar(&f.stack.layers, "layers", 0, "main layers to build (0: all, small preset only)")
	fs.StringVar(&f.stack.format, "format", checkpoint.GenOfficial, "official | nvfp4 (routed experts)")
	fs.StringVar(&f.stack.device, "device", "cpu", "cpu | cuda")
	fs.StringVar(&f.stack.numerics, "numerics", "faithful", "faithful | exact")
	fs.IntVar(&f.stack.threads, "threads", 0, "CPU backend workers (0 = GOMAXPROCS)")
	fs.Uint64Var(&f.stack.seed, "seed", 1, "weight and token seed")
	fs.IntVar(&f.prefix, "prefix", 4000, "shared prefix tokens")
	fs.IntVar(&f.suffix, "suffix", 50, "distinct suffix tokens of each shared-prefix request")
	fs.IntVar(&f.requests, "requests", 3, "shared-prefix requests after the first")
	fs.IntVar(&f.turns, "turns", 10, "turns of the multi-turn conversation (0: none)")
	fs.IntVar(&f.turnTokens, "turn-tokens", 200, "new user tokens a turn")
	fs.IntVar(&f.firstTurn, "first-turn", 0, "tokens of the conversation's first prompt (0: --prefix/4 + --turn-tokens)")
	fs.IntVar(&f.answer, "answer", 40, "generated tokens a turn, resent with the next turn")
	fs.IntVar(&f.reasoning, "reasoning", 0, "thinking mode without tools: the first generated tokens a turn are reasoning, dropped from the next turn, and the generation prefix changes (0: no thinking)")
	fs.IntVar(&f.batchTokens, "max-num-batched-tokens", 512, "tokens per engine step")
	fs.Float64Var(&f.cacheGiB, "kv-cache-gib", 2, "KV cache capacity")
	synth := fs.String("model", "", "synth:PRESET[:LAYERS], serve's name of the model: sets --preset and --layers")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := f.stack.setSynth(*synth); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case f.prefix < 1 || f.suffix < 1 || f.requests < 1 || f.turns < 0 || f.turnTokens < 1 || f.answer < 1:
		return nil, errors.New("--prefix, --suffix, --requests, --turn-tokens and --answer must be >= 1, --turns >= 0")
	case f.firstTurn < 0:
		return nil, errors.New("--first-turn must be >= 0")
	case f.reasoning < 0 || f.reasoning >= f.answer:
		return nil, errors.New("--reasoning must be in [0, --answer)")
	case f.batchTokens < 1 || f.cacheGiB <= 0:
		return nil, errors.New("--max-num-batched-tokens and --kv-cache-gib must be positive")
	case f.stack.device != "cpu" && f.stack.device != "cuda":
		return nil, fmt.Errorf("--device %q, want cpu or cuda", f.stack.device)
	}
	if f.firstTurn == 0 {
		f.firstTurn = f.prefix/4 + f.turnTokens
	}
	f.stack.graphs, f.stack.pdl, f.stack.side = true, true, true
	return &f, nil
}

// runPrefix measures what the prefix cache saves: TTFT and prefill tokens
// computed of requests sharing a long prefix and of a multi-turn
// conversation, on one model with the cache off and on.
func runPrefix(args []string, stdout, stderr io.Writer) error {
	f, err := parsePrefix(args, stderr)
	if err != nil {
		return err
	}
	full, err := checkpoint.PresetConfig(f.stack.preset)
	if err != nil {
		return fmt.Errorf("--preset: %w", err)
	}
	layers := f.stack.layers
	if layers == 0 {
		if f.stack.preset != "small" {
			return errors.New("--layers N is needed beyond the small preset")
		}
		layers = full.Layers
	}
	c, err := checkpoint.CutLayers(full, layers, false)
	if err != nil {
		return fmt.Errorf("--layers %d: %w", layers, err)
	}
	w, err := checkpoint.RandomWeights(c, f.stack.format, f.stack.seed)
	if err != nil {
		return err
	}
	device := f.stack.device
	rng := rand.New(rand.NewPCG(f.stack.seed, 0x70726566))
	shared := randTokens(rng, f.prefix, c.Vocab)
	var reqs [][]int32 // the first one fills the cache
	for range f.requests + 1 {
		reqs = append(reqs, slices.Concat(shared, randTokens(rng, f.suffix, c.Vocab)))
	}
	turnNew := [][]int32{randTokens(rng, f.firstTurn, c.Vocab)}
	for range f.turns - 1 {
		turnNew = append(turnNew, randTokens(rng, f.turnTokens, c.Vocab))
	}
	var res [2]prefixResult
	for i, on := range []bool{false, true} {
		be, closeBE, err := openBackend(&f.stack)
		if err != nil {
			return err
		}
		if i == 0 {
			device = be.Name()
			fmt.Fprintf(stdout, "preset %s  layers %d  device %s  numerics %s  max-num-batched-tokens %d\n",
				f.stack.preset, c.Layers, device, f.stack.numerics, f.batchTokens)
		}
		m, err := model.New(w, be, model.Options{Numerics: f.stack.numerics, Threads: f.stack.threads, CacheBytes: int64(f.cacheGiB * (1 << 30))})
		if err != nil {
			closeBE()
			return fmt.Errorf("load: %w", err)
		}
		res[i], err = prefixScenarios(m, f, on, reqs, turnNew)
		closeBE()
		if err != nil {
			return err
		}
	}
	res[0].print(stdout, res[1], f)
	res[0].table(stdout, res[1], f, fmt.Sprintf("%s, %d layers, %s, %s numerics", f.stack.preset, c.Layers, device, f.stack.numerics))
	return nil
}

// prefixResult is one engine's run of both scenarios.
type prefixResult struct {
	ttft     []time.Duration // the shared-prefix requests, the first one included
	prompt   []int           // their prompt tokens
	cached   []int           // and the tokens found in the cache
	turnTTFT []time.Duration
	turnLen  []int
	turnHit  []int
}

func prefixScenarios(m *model.Model, f *prefixFlags, on bool, reqs, turnNew [][]int32) (prefixResult, error) {
	var r prefixResult
	maxLen := max(f.prefix+f.suffix, f.firstTurn+f.turns*(f.turnTokens+f.answer+1)) + 1
	e, err := engine.New(engine.FromModel(m), engine.Config{MaxModelLen: maxLen, MaxBatchTokens: f.batchTokens, PrefixCaching: on})
	if err != nil {
		return r, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// Each request runs alone: its TTFT is its own prefill.
	one := func(prompt []int32, maxTokens, reuseAt int) (time.Duration, []int32, int, error) {
		t0 := time.Now()
		st, err := e.Submit(&engine.Request{Prompt: prompt, MaxTokens: maxTokens, ReuseAt: reuseAt})
		if err != nil {
			return 0, nil, 0, err
		}
		var ttft time.Duration
		var out []int32
		for {
			<-st.Ready()
			for ev, ok := st.Next(); ok; ev, ok = st.Next() {
				if len(ev.Tokens) > 0 && ttft == 0 {
					ttft = time.Since(t0)
				}
				for _, t := range ev.Tokens {
					out = append(out, t.ID)
				}
				switch ev.Finish {
				case engine.FinishNone:
				case engine.FinishError:
					return 0, nil, 0, fmt.Errorf("request failed: %w", ev.Err)
				default:
					return ttft, out, st.CachedTokens(), nil
				}
			}
		}
	}
	for _, p := range reqs {
		ttft, _, hit, err := one(p, 1, 0)
		if err != nil {
			return r, err
		}
		r.ttft, r.prompt, r.cached = append(r.ttft, ttft), append(r.prompt, len(p)), append(r.cached, hit)
	}
	// In thinking mode a prompt ends with the generation prefix <think>,
	// rendered </think> once the turn is history (tokenizer.EncodeChat),
	// where the request's reuse point is (what the API sets).
	think, unthink := int32(e.Vocab()-1), int32(e.Vocab()-2)
	var conv []int32
	for _, add := range turnNew {
		conv = append(conv, add...)
		reuse := 0
		if f.reasoning > 0 {
			conv = append(conv, think)
			reuse = len(conv) - 1
		}
		ttft, out, hit, err := one(conv, f.answer, reuse)
		if err != nil {
			return r, err
		}
		r.turnTTFT, r.turnLen, r.turnHit = append(r.turnTTFT, ttft), append(r.turnLen, len(conv)), append(r.turnHit, hit)
		if f.reasoning > 0 {
			conv[len(conv)-1] = unthink
			out = out[min(f.reasoning, len(out)):]
		}
		conv = append(conv, out...) // the next turn resends the answer
	}
	return r, nil
}

func meanMs(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	var s time.Duration
	for _, x := range d {
		s += x
	}
	return ms(s) / float64(len(d))
}

func sum(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

// print reports off (r) against on.
func (r prefixResult) print(out io.Writer, on prefixResult, f *prefixFlags) {
	warmOff, warmOn := meanMs(r.ttft[1:]), meanMs(on.ttft[1:])
	fmt.Fprintf(out, "shared prefix: %d + %d tokens, %d requests after the first\n", f.prefix, f.suffix, f.requests)
	fmt.Fprintf(out, "  TTFT without cache %.1f ms, with cache %.1f ms (%.1f %%); first request %.1f / %.1f ms\n",
		warmOff, warmOn, 100*warmOn/warmOff, ms(r.ttft[0]), ms(on.ttft[0]))
	fmt.Fprintf(out, "  prefill tokens computed: %d without, %d with (cached %v)\n",
		sum(r.prompt[1:]), sum(on.prompt[1:])-sum(on.cached[1:]), on.cached[1:])
	if len(r.turnLen) == 0 {
		return
	}
	fmt.Fprintf(out, "multi-turn: %d turns, a %d-token first prompt, %d new tokens a turn, %d-token answers%s\n", f.turns, f.firstTurn, f.turnTokens, f.answer, f.thinking())
	fmt.Fprintf(out, "  %-5s %-7s %-8s %-14s %-14s\n", "turn", "prompt", "cached", "TTFT off (ms)", "TTFT on (ms)")
	for i := range r.turnLen {
		fmt.Fprintf(out, "  %-5d %-7d %-8d %-14.1f %-14.1f\n", i+1, on.turnLen[i], on.turnHit[i], ms(r.turnTTFT[i]), ms(on.turnTTFT[i]))
	}
	if len(r.turnLen) > 1 {
		p, h := sum(on.turnLen[1:]), sum(on.turnHit[1:])
		fmt.Fprintf(out, "  after turn 1: %d prompt tokens, %d recomputed (%.1f %%); TTFT sum %.0f ms off, %.0f ms on\n",
			p, p-h, 100*float64(p-h)/float64(p), meanMs(r.turnTTFT[1:])*float64(len(r.turnTTFT)-1), meanMs(on.turnTTFT[1:])*float64(len(on.turnTTFT)-1))
	}
}

// table prints the summary as a Markdown table (docs/performance.md's).
func (r prefixResult) table(out io.Writer, on prefixResult, f *prefixFlags, what string) {
	warmOff, warmOn := meanMs(r.ttft[1:]), meanMs(on.ttft[1:])
	fmt.Fprintf(out, "\n| scenario (%s) | without the cache | with the cache |\n|---|---|---|\n", what)
	fmt.Fprintf(out, "| %d-token shared prefix + %d distinct tokens, %d requests after the first: prefill tokens computed | %d | %d |\n",
		f.prefix, f.suffix, f.requests, sum(r.prompt[1:]), sum(on.prompt[1:])-sum(on.cached[1:]))
	fmt.Fprintf(out, "| the same: mean TTFT | %.1f ms | %.1f ms (%.1f %%) |\n", warmOff, warmOn, 100*warmOn/warmOff)
	if len(r.turnLen) < 2 {
		return
	}
	p, h := sum(on.turnLen[1:]), sum(on.turnHit[1:])
	fmt.Fprintf(out, "| %d-turn chat (%d-token first prompt, %d new tokens and a %d-token answer a turn%s): prompt tokens computed after turn 1 | %d | %d (%.1f %%) |\n",
		f.turns, f.firstTurn, f.turnTokens, f.answer, f.thinking(), sum(r.turnLen[1:]), p-h, 100*float64(p-h)/float64(p))
	n := float64(len(r.turnTTFT) - 1)
	fmt.Fprintf(out, "| the same: TTFT of turns 2–%d, summed | %.1f ms | %.1f ms |\n", f.turns, meanMs(r.turnTTFT[1:])*n, meanMs(on.turnTTFT[1:])*n)
}

// thinking describes the --reasoning mode for the reports.
func (f *prefixFlags) thinking() string {
	if f.reasoning == 0 {
		return ""
	}
	return fmt.Sprintf(", thinking: the first %d of them reasoning, dropped from the next turn", f.reasoning)
}
