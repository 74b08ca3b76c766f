package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

// do sends a request with headers and returns the response and body.
func do(t *testing.T, srv *httptest.Server, method, path, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(data)
}

// TestOperations checks vLLM's endpoints and operational behaviour: model
// lookup under several names, tokenize/detokenize, JSON 404/405, request
// ids, the API key check, CORS, null usage in stream chunks and vLLM's
// metric names.
func TestOperations(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m", Aliases: []string{"org/alias"}, APIKey: "k3y", AllowedOrigins: []string{"https://ok.example"}}, 0)
	auth := map[string]string{"Authorization": "Bearer k3y"}
	cases := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		want                     []string // substrings of the body
		header                   map[string]string
	}{
		{"model", "GET", "/v1/models/m", "", auth, 200, []string{`"id":"m"`}, nil},
		{"model alias with a slash", "GET", "/v1/models/org/alias", "", auth, 200, []string{`"id":"org/alias"`, `"root":"m"`}, nil},
		{"models list", "GET", "/v1/models", "", auth, 200, []string{`"id":"m"`, `"id":"org/alias"`}, nil},
		{"unknown model", "GET", "/v1/models/x", "", auth, 404, []string{`"code":"model_not_found"`}, nil},
		{"alias answers", "POST", "/v1/completions", `{"model":"org/alias","prompt":"a","max_tokens":1,"ignore_eos":true}`, auth, 200, []string{`"model":"m"`}, nil},
		{"no route", "GET", "/nowhere", "", nil, 404, []string{`"error"`, `"code":"not_found"`}, nil},
		{"wrong method", "GET", "/v1/chat/completions", "", auth, 405, []string{`"code":"method_not_allowed"`}, nil},
		{"bearer in any case", "GET", "/v1/models", "", map[string]string{"Authorization": "bEARER k3y"}, 200, nil, nil},
		{"wrong key", "GET", "/v1/models", "", map[string]string{"Authorization": "Bearer k3"}, 401, []string{`"invalid_api_key"`}, nil},
		{"no scheme", "GET", "/v1/models", "", map[string]string{"Authorization": "k3y"}, 401, nil, nil},
		{"request id echoed", "GET", "/health", "", map[string]string{"X-Request-Id": "abc-1"}, 200, nil, map[string]string{"X-Request-Id": "abc-1"}},
		{"tokenize", "POST", "/tokenize", `{"prompt":"hello"}`, auth, 200, []string{`"count":`, `"max_model_len":1024`}, nil},
		{"tokenize chat", "POST", "/tokenize", `{"messages":[{"role":"user","content":"hi"}]}`, auth, 200, []string{`"count":`}, nil},
		{"tokenize both", "POST", "/tokenize", `{"prompt":"a","messages":[{"role":"user","content":"hi"}]}`, auth, 400, nil, nil},
		{"tokenize needs the key", "POST", "/tokenize", `{"prompt":"a"}`, nil, 401, nil, nil},
		{"detokenize out of range", "POST", "/detokenize", `{"tokens":[-1]}`, auth, 400, nil, nil},
		{"cors allowed", "GET", "/health", "", map[string]string{"Origin": "https://ok.example"}, 200, nil, map[string]string{"Access-Control-Allow-Origin": "https://ok.example"}},
		{"cors other origin", "GET", "/health", "", map[string]string{"Origin": "https://evil.example"}, 200, nil, map[string]string{"Access-Control-Allow-Origin": ""}},
		{"cors preflight", "OPTIONS", "/v1/chat/completions", "", map[string]string{"Origin": "https://ok.example", "Access-Control-Request-Method": "POST"}, 204, nil,
			map[string]string{"Access-Control-Allow-Origin": "https://ok.example", "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Request-Id"}},
		{"usage null in chunks", "POST", "/v1/chat/completions", `{"stream":true,"stream_options":{"include_usage":true},"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, auth, 200,
			[]string{`"usage":null`, `"usage":{"prompt_tokens"`}, nil},
		{"vLLM metric names", "GET", "/metrics", "", nil, 200, []string{`vllm:num_requests_running{model_name="m"}`, `vllm:num_requests_waiting{`,
			`vllm:time_to_first_token_seconds_count{model_name="m"}`, `vllm:e2e_request_latency_seconds_count{`, `vllm:num_preemptions_total{`,
			`vllm:kv_cache_usage_perc{`, `vllm:request_success_total{finished_reason="length",model_name="m"}`, "megamoe_preemptions_total "}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := do(t, srv, c.method, c.path, c.body, c.hdr)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			for _, w := range c.want {
				if !strings.Contains(body, w) {
					t.Errorf("body lacks %s: %s", w, body)
				}
			}
			for k, v := range c.header {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			if resp.Header.Get("X-Request-Id") == "" {
				t.Error("no X-Request-Id")
			}
		})
	}
	// tokenize and detokenize round-trip.
	_, body := do(t, srv, "POST", "/tokenize", `{"prompt":"hello world"}`, auth)
	var tk struct{ Tokens []int32 }
	if err := json.Unmarshal([]byte(body), &tk); err != nil || len(tk.Tokens) == 0 {
		t.Fatalf("tokenize: %s (%v)", body, err)
	}
	ids, _ := json.Marshal(tk.Tokens)
	if _, body := do(t, srv, "POST", "/detokenize", `{"tokens":`+string(ids)+`}`, auth); body != `{"prompt":"hello world"}` {
		t.Errorf("detokenize: %s", body)
	}
}

// TestCORSOffByDefault checks no CORS header is sent without allowed origins.
func TestCORSOffByDefault(t *testing.T) {
	srv, _ := startServer(t, Config{}, 0)
	resp, _ := do(t, srv, "GET", "/health", "", map[string]string{"Origin": "https://ok.example"})
	if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "" {
		t.Errorf("Access-Control-Allow-Origin %q without --allowed-origins", got)
	}
}

// TestRetryAfter checks a 429 tells the client when to retry.
func TestRetryAfter(t *testing.T) {
	w := httptest.NewRecorder()
	c, _ := gin.CreateTestContext(w)
	writeError(c, errorf(http.StatusTooManyRequests, "", "queue_full", "busy"))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Errorf("status %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
}
