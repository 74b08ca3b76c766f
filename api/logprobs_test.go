package api

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func TestLogprobs(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	resp, body := post(t, srv, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"temperature":0,"logprobs":true,"top_logprobs":3}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var chat struct {
		Choices []struct {
			Message  struct{ Content string }
			Logprobs struct {
				Content []struct {
					Token       string
					Logprob     float64
					TopLogprobs []struct {
						Token   string
						Logprob float64
					} `json:"top_logprobs"`
				}
			}
		}
	}
	if err := json.Unmarshal(body, &chat); err != nil {
		t.Fatal(err)
	}
	lp := chat.Choices[0].Logprobs.Content
	if len(lp) == 0 {
		t.Fatalf("no logprobs: %s", body)
	}
	for _, e := range lp {
		if e.Logprob > 0 || len(e.TopLogprobs) != 3 {
			t.Fatalf("entry %+v", e)
		}
		// Greedy: the chosen token is the most likely one.
		if math.Abs(e.Logprob-e.TopLogprobs[0].Logprob) > 1e-6 || e.TopLogprobs[1].Logprob > e.TopLogprobs[0].Logprob {
			t.Errorf("greedy token logprob %v, top %+v", e.Logprob, e.TopLogprobs)
		}
	}

	resp, body = post(t, srv, "/v1/completions", `{"model":"m","prompt":"The fox","max_tokens":2,"temperature":0,"logprobs":2,"echo":true}`, nil)
	var cmp struct {
		Choices []struct {
			Text     string
			Logprobs struct {
				Tokens        []string
				TokenLogprobs []float64 `json:"token_logprobs"`
				TextOffset    []int     `json:"text_offset"`
			}
		}
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &cmp) != nil {
		t.Fatalf("completions: %d %s", resp.StatusCode, body)
	}
	c := cmp.Choices[0]
	if !strings.HasPrefix(c.Text, "The fox") || len(c.Logprobs.Tokens) == 0 || c.Logprobs.TextOffset[0] != len("The fox") {
		t.Errorf("echo/logprobs: %s", body)
	}
	for _, bad := range []string{
		`{"model":"m","messages":[{"role":"user","content":"Hi"}],"top_logprobs":99}`,
		`{"model":"m","prompt":"x","logprobs":-1}`,
	} {
		path := "/v1/chat/completions"
		if strings.Contains(bad, "prompt") {
			path = "/v1/completions"
		}
		if resp, body := post(t, srv, path, bad, nil); resp.StatusCode != 400 {
			t.Errorf("%s: status %d %s", bad, resp.StatusCode, body)
		}
	}
}
