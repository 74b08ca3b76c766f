package engine

import (
	"strings"
	"testing"
)

// TestReuseAtInvalid: Submit rejects a reuse point outside the prompt.
func TestReuseAtInvalid(t *testing.T) {
	e, err := New(newToy(t, 1<<20), Config{MaxModelLen: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		at int
		ok bool
	}{{-1, false}, {0, true}, {2, true}, {3, true}, {4, false}} {
		_, err := e.Submit(&Request{Prompt: []int32{1, 2, 3}, MaxTokens: 1, ReuseAt: c.at})
		if c.ok != (err == nil) || err != nil && !strings.Contains(err.Error(), "reuse point") {
			t.Errorf("reuse point %d: %v", c.at, err)
		}
	}
}

// thinkingTurns builds a thinking-mode chat as the V4 encoding renders it
// without tools: each prompt ends with the generation prefix think; the
// next turn resends the prompt but that token, then unthink, the answer
// without its first reasoning tokens (dropped as history), the turn's new
// tokens and think again. Each request's ReuseAt is its prompt but the
// last token, where the next turn hits.
func thinkingTurns(answer, reasoning int, think, unthink int32, adds ...[]int32) func(run func([][]*Request) prefixRun) ([][]*Request, []int) {
	req := func(p []int32) *Request {
		return &Request{Prompt: p, MaxTokens: answer, ReuseAt: len(p) - 1, Params: SamplingParams{Logprobs: true, TopLogprobs: 3}}
	}
	return func(run func([][]*Request) prefixRun) ([][]*Request, []int) {
		prompt := cat(adds[0], []int32{think})
		waves := [][]*Request{{req(prompt)}}
		hits := []int{0}
		for _, add := range adds[1:] {
			out := run(waves[len(waves)-1:]).tokens[0]
			hits = append(hits, len(prompt)-1)
			prompt = cat(prompt[:len(prompt)-1], []int32{unthink}, out[min(reasoning, len(out)):], add, []int32{think})
			waves = append(waves, []*Request{req(prompt)})
		}
		return waves, hits
	}
}
