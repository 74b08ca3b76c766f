package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// tokenPrompt is a completions body whose prompt is n token ids.
func tokenPrompt(n int, extra string) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i%50)
	}
	return `{"prompt":[` + strings.Join(ids, ",") + `]` + extra + `}`
}

// Requests beyond the context length are 400s naming the context length and
// the request's numbers, in vLLM's words; one at the limit runs.
func TestContextLengthErrors(t *testing.T) {
	srv, _ := startServer(t, Config{}, 0)
	long := strings.Repeat("word ", testMaxLen)
	for _, tc := range []struct {
		name, path, body string
		status           int
		param            string
		want             []string
	}{
		{"prompt beyond", "/v1/completions", tokenPrompt(testMaxLen+6, ""), 400, "prompt",
			[]string{"maximum context length is 1024 tokens", "your request has 1030 input tokens"}},
		{"prompt at the limit", "/v1/completions", tokenPrompt(testMaxLen, ""), 400, "prompt",
			[]string{"maximum context length is 1024 tokens", "your request has 1024 input tokens"}},
		{"chat prompt beyond", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + long + `"}]}`, 400, "messages",
			[]string{"maximum context length is 1024 tokens", "input tokens"}},
		{"max_tokens beyond", "/v1/completions", tokenPrompt(1000, `,"max_tokens":30`), 400, "max_tokens",
			[]string{"'max_tokens' or 'max_completion_tokens' is too large: 30.", "maximum context length is 1024 tokens and your request has 1000 input tokens (30 > 1024 - 1000)"}},
		{"max_completion_tokens beyond", "/v1/chat/completions", `{"max_completion_tokens":2000,"messages":[{"role":"user","content":"hi"}]}`, 400, "max_completion_tokens",
			[]string{"is too large: 2000.", "(2000 > 1024 - "}},
		{"prompt + max_tokens at the limit", "/v1/completions", tokenPrompt(1000, `,"max_tokens":24,"temperature":0,"ignore_eos":true`), 200, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.status == http.StatusOK && testing.Short() {
				t.Skip("prefills 1000 tokens")
			}
			resp, body := post(t, srv, tc.path, tc.body, nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status == http.StatusOK {
				var r struct{ Usage testUsage }
				if err := json.Unmarshal(body, &r); err != nil {
					t.Fatal(err)
				}
				if r.Usage.TotalTokens != testMaxLen {
					t.Errorf("a request filling the context used %d tokens, want %d", r.Usage.TotalTokens, testMaxLen)
				}
				return
			}
			var e struct {
				Error struct {
					Message string
					Param   string
					Code    string
				}
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatal(err)
			}
			if e.Error.Param != tc.param || e.Error.Code != "context_length_exceeded" {
				t.Errorf("param %q code %q, want %q and context_length_exceeded", e.Error.Param, e.Error.Code, tc.param)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Error.Message, w) {
					t.Errorf("message %q lacks %q", e.Error.Message, w)
				}
			}
		})
	}
}
