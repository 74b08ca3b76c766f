package api

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestStrictRequests checks field names match exactly (an alias in another
// letter case is an unknown field, and unknown fields are ignored), a field
// given twice and known-but-unsupported fields are 400s naming the field, and
// the OpenAI/vLLM consistency rules on logprobs and stream_options.
func TestStrictRequests(t *testing.T) {
	srv, _ := startServer(t, Config{}, 0)
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name, path, body string
		status           int
		param            string // of the 400's error
		completion       int    // of a 200's usage, when > 0
	}{
		{"alias in other case ignored", "/v1/chat/completions", `{` + msgs + `,"max_tokens":1,"Max_Tokens":5,"MAX_TOKENS":5,"temperature":0}`, 200, "", 1},
		{"alias before the field ignored", "/v1/completions", `{"prompt":"a","Max_Tokens":5,"max_tokens":1}`, 200, "", 1},
		{"unknown field ignored", "/v1/chat/completions", `{` + msgs + `,"max_tokens":1,"user":"u","x_custom":{"a":1}}`, 200, "", 1},
		{"duplicate field", "/v1/chat/completions", `{` + msgs + `,"max_tokens":1,"max_tokens":2}`, 400, "max_tokens", 0},
		{"nested alias ignored", "/v1/chat/completions", `{"messages":[{"Role":"user","content":"hi"}],"max_tokens":1}`, 400, "messages[0].role", 0},
		{"nested duplicate", "/v1/chat/completions", `{"messages":[{"role":"user","role":"system","content":"hi"}],"max_tokens":1}`, 400, "messages[0].role", 0},
		{"suffix", "/v1/completions", `{"prompt":"a","suffix":"b"}`, 400, "suffix", 0},
		{"null suffix", "/v1/completions", `{"prompt":"a","suffix":null,"max_tokens":1}`, 200, "", 1},
		{"functions", "/v1/chat/completions", `{` + msgs + `,"functions":[]}`, 400, "functions", 0},
		{"modalities", "/v1/chat/completions", `{` + msgs + `,"modalities":["text"]}`, 400, "modalities", 0},
		{"best_of above n", "/v1/completions", `{"prompt":"a","best_of":2}`, 400, "best_of", 0},
		{"best_of equal to n", "/v1/completions", `{"prompt":"a","best_of":1,"max_tokens":1}`, 200, "", 1},
		{"best_of below n", "/v1/completions", `{"prompt":"a","best_of":1,"n":2}`, 400, "best_of", 0},
		{"best_of equal to n, chat", "/v1/chat/completions", `{` + msgs + `,"best_of":2,"n":2,"max_tokens":1}`, 200, "", 2},
		{"top_logprobs without logprobs", "/v1/chat/completions", `{` + msgs + `,"top_logprobs":2}`, 400, "top_logprobs", 0},
		{"top_logprobs with logprobs", "/v1/chat/completions", `{` + msgs + `,"max_tokens":1,"logprobs":true,"top_logprobs":2}`, 200, "", 1},
		{"stream_options without stream", "/v1/chat/completions", `{` + msgs + `,"stream_options":{"include_usage":true}}`, 400, "stream_options", 0},
		{"stream_options without stream, completions", "/v1/completions", `{"prompt":"a","stream":false,"stream_options":{}}`, 400, "stream_options", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, srv, c.path, c.body, nil)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			var out struct {
				Error *struct{ Param *string }
				Usage testUsage
			}
			if err := json.Unmarshal(body, &out); err != nil {
				t.Fatalf("decode %s: %v", body, err)
			}
			if c.status != http.StatusOK {
				if out.Error == nil || out.Error.Param == nil || *out.Error.Param != c.param {
					t.Errorf("error %s does not name %q", body, c.param)
				}
				return
			}
			if c.completion > 0 && out.Usage.CompletionTokens != c.completion {
				t.Errorf("completion tokens %d, want %d: %s", out.Usage.CompletionTokens, c.completion, body)
			}
		})
	}
}
