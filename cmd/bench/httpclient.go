package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// client talks to one OpenAI-compatible server.
type client struct {
	base, model string
	hc          *http.Client
}

func newClient(base string, conns int) *client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = conns, conns // one kept-alive connection per worker
	return &client{base: strings.TrimRight(base, "/"), hc: &http.Client{Transport: tr}}
}

// post sends body as JSON and decodes a 200 answer into out.
func (c *client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(msg))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return nil
}

// firstModel is the first model id the server lists.
func (c *client) firstModel(ctx context.Context) (string, error) {
	var r struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/models", nil, &r); err != nil {
		return "", err
	}
	if len(r.Data) == 0 {
		return "", errors.New("GET /v1/models: no models")
	}
	return r.Data[0].ID, nil
}

// tokenPool is the server's tokenisation of a plain English text: prompts of
// exact lengths are drawn from it, so that they hold ordinary tokens of any
// tokenizer.
func (c *client) tokenPool(ctx context.Context) ([]int32, error) {
	var r struct {
		Tokens []int32 `json:"tokens"`
	}
	if err := c.do(ctx, http.MethodPost, "/tokenize", map[string]any{"model": c.model, "prompt": poolText}, &r); err != nil {
		return nil, err
	}
	if len(r.Tokens) < 16 {
		return nil, fmt.Errorf("POST /tokenize: %d tokens for %d bytes of text", len(r.Tokens), len(poolText))
	}
	return r.Tokens, nil
}

const poolText = "The quick brown fox jumps over the lazy dog while the committee reviews seventeen " +
	"proposals about bridges, rivers, mountains and the weather of northern provinces. Engineers measured " +
	"the latency of every request, wrote tables of numbers, and argued about percentiles over coffee. " +
	"Meanwhile a small orchestra rehearsed symphonies in the old library, and children counted birds: " +
	"sparrows, crows, herons, finches, eagles, owls and a single confused parrot named Oscar."

// prompt draws n token ids from pool; each seed gives its own sequence, so
// no two requests share a prefix.
func prompt(pool []int32, n int, seed uint64) []int32 {
	rng := rand.New(rand.NewPCG(seed, 0x70726f6d7074))
	out := make([]int32, n)
	for i := range out {
		out[i] = pool[rng.IntN(len(pool))]
	}
	return out
}

// sample is one request's timing.
type sample struct {
	ttft, total time.Duration
	tokens      int
	err         error
}

// complete streams one completion of ids with exactly maxTokens output tokens
// (ignore_eos) and times its first text and its end.
func (c *client) complete(ctx context.Context, ids []int32, maxTokens int) sample {
	body, err := json.Marshal(map[string]any{
		"model": c.model, "prompt": ids, "max_tokens": maxTokens, "ignore_eos": true, "temperature": 0,
		"stream": true, "stream_options": map[string]bool{"include_usage": true},
	})
	if err != nil {
		return sample{err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return sample{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		return sample{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return sample{err: fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))}
	}
	var s sample
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var ch struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			return sample{err: fmt.Errorf("stream event %q: %w", line, err)}
		}
		switch {
		case ch.Error != nil:
			return sample{err: fmt.Errorf("stream error: %s", ch.Error.Message)}
		case ch.Usage != nil:
			s.tokens = ch.Usage.CompletionTokens
		case s.ttft == 0 && len(ch.Choices) > 0 && ch.Choices[0].Text != "":
			s.ttft = time.Since(start)
		}
	}
	s.total = time.Since(start)
	switch {
	case sc.Err() != nil:
		s.err = sc.Err()
	case !done:
		s.err = errors.New("stream ended without [DONE]")
	case s.tokens != maxTokens:
		s.err = fmt.Errorf("%d completion tokens, want %d (ignore_eos)", s.tokens, maxTokens)
	}
	if s.ttft == 0 { // no text at all (every token held back or empty)
		s.ttft = s.total
	}
	return s
}

// level runs n requests of plen-token prompts, conc at a time, and returns
// their samples and the wall time from the first send to the last answer.
func (c *client) level(ctx context.Context, pool []int32, plen, conc, n, maxTokens int, seed uint64) ([]sample, time.Duration) {
	samples := make([]sample, n)
	jobs := make(chan int)
	var wg sync.WaitGroup
	t0 := time.Now()
	for range min(conc, n) {
		wg.Go(func() {
			for i := range jobs {
				samples[i] = c.complete(ctx, prompt(pool, plen, seed+uint64(i)), maxTokens)
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return samples, time.Since(t0)
}
