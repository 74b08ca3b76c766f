// Command bench is a bounded load generator for a running MegaMoE (or any
// OpenAI-compatible) server: it sends --requests streaming chat completions with
// --concurrency in flight and prints requests/s, output tokens/s and the TTFT and
// TPOT percentiles.
//
// `bench stack [flags]` instead runs the real layer stack of a preset (small,
// flash, pro) with random weights on the CPU or GPU backend: one prefill chunk
// per sequence and batched decode steps, checking that all logits are finite
// and printing tokens/s (stack.go).
//
// `bench prefix [flags]` measures the prefix cache: TTFT and prefill tokens
// computed of requests sharing a long prefix and of a multi-turn conversation,
// with the cache off and on, on one model of a preset (prefix.go).
//
// `bench kernels [flags]` times our GEMM kernels (FP8 dense, FP4 grouped MoE)
// at the Flash and Pro shapes and 1 to 4096 tokens next to the measured copy
// bandwidth, each case also checked against its CPU twin (kernels.go);
// scripts/bench-device.sh adds torch's numbers and writes the report.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

type config struct {
	url, model             string
	concurrency, requests  int
	promptWords, maxTokens int
	timeout                time.Duration
}

type sample struct {
	ttft, total time.Duration
	tokens      int
	err         error
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "kernels" {
		if err := runKernels(os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench kernels:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "stack" {
		if err := runStack(os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench stack:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "kv" {
		if err := runKV(os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench kv:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "prefix" {
		if err := runPrefix(os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "bench prefix:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var c config
	fs.StringVar(&c.url, "url", "http://127.0.0.1:8000", "server base URL")
	fs.StringVar(&c.model, "model", "megamoe-small", "model name")
	fs.IntVar(&c.concurrency, "concurrency", 4, "requests in flight")
	fs.IntVar(&c.requests, "requests", 32, "requests in total")
	fs.IntVar(&c.promptWords, "prompt-tokens", 64, "approximate prompt length (words)")
	fs.IntVar(&c.maxTokens, "max-tokens", 32, "max_tokens per request")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.concurrency < 1 || c.requests < 1 || c.maxTokens < 1 || c.promptWords < 1 || c.requests > 100000 {
		return errors.New("--concurrency, --requests, --prompt-tokens and --max-tokens must be >= 1 (requests <= 100000)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	samples := make([]sample, c.requests)
	jobs := make(chan int)
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < c.concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				samples[i] = one(ctx, c, i)
			}
		}()
	}
	for i := 0; i < c.requests; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	report(out, c, samples, time.Since(t0))
	for _, s := range samples {
		if s.err != nil {
			return fmt.Errorf("some requests failed, first: %w", s.err)
		}
	}
	return nil
}

// one sends a streaming chat request and times its first and last tokens.
func one(ctx context.Context, c config, i int) sample {
	prompt := strings.TrimSpace(strings.Repeat(fmt.Sprintf("word%d ", i%7), c.promptWords))
	body, _ := json.Marshal(map[string]any{
		"model": c.model, "stream": true, "stream_options": map[string]bool{"include_usage": true}, "max_tokens": c.maxTokens, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.url, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return sample{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return sample{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return sample{err: fmt.Errorf("status %d: %s", resp.StatusCode, msg)}
	}
	var s sample
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct{ Content, ReasoningContent string } `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(line), &chunk) != nil {
			continue
		}
		if chunk.Usage != nil {
			s.tokens = chunk.Usage.CompletionTokens
		}
		if len(chunk.Choices) > 0 && s.ttft == 0 && (chunk.Choices[0].Delta.Content != "" || chunk.Choices[0].Delta.ReasoningContent != "") {
			s.ttft = time.Since(start)
		}
	}
	s.total = time.Since(start)
	if err := sc.Err(); err != nil {
		s.err = err
	}
	if s.ttft == 0 {
		s.ttft = s.total
	}
	return s
}

func report(out io.Writer, c config, samples []sample, wall time.Duration) {
	var ttft, tpot []float64
	tokens, ok := 0, 0
	for _, s := range samples {
		if s.err != nil {
			continue
		}
		ok++
		tokens += s.tokens
		ttft = append(ttft, s.ttft.Seconds()*1000)
		if s.tokens > 1 {
			tpot = append(tpot, (s.total-s.ttft).Seconds()*1000/float64(s.tokens-1))
		}
	}
	fmt.Fprintf(out, "requests %d ok %d concurrency %d prompt~%d words max_tokens %d wall %.2fs\n", len(samples), ok, c.concurrency, c.promptWords, c.maxTokens, wall.Seconds())
	fmt.Fprintf(out, "requests/s %.2f  output tokens/s %.1f\n", float64(ok)/wall.Seconds(), float64(tokens)/wall.Seconds())
	for _, m := range []struct {
		name string
		v    []float64
	}{{"TTFT ms", ttft}, {"TPOT ms", tpot}} {
		fmt.Fprintf(out, "%-8s p50 %8.2f  p90 %8.2f  p99 %8.2f\n", m.name, pct(m.v, 50), pct(m.v, 90), pct(m.v, 99))
	}
}

// pct is the nearest-rank percentile (0 for no data).
func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
