package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startPrefixServer serves the embedded model with prefix caching on; the
// access log goes to the returned buffer.
func startPrefixServer(t *testing.T) (*httptest.Server, *syncBuffer) {
	t.Helper()
	w, tok := loadEmbedded(t)
	m, err := model.New(w, nil, model.Options{CacheBytes: 64 << 20})
	if err != nil {
		t.Fatalf("model: %v", err)
	}
	eng, err := engine.New(engine.FromModel(m), engine.Config{MaxNumSeqs: 4, MaxModelLen: 4096, PrefixCaching: true})
	if err != nil {
		t.Fatalf("engine: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = eng.Run(ctx); close(done) }()
	gin.SetMode(gin.TestMode)
	logs := &syncBuffer{}
	srv := httptest.NewServer(New(eng, tok, Config{ModelName: "m", Logger: slog.New(slog.NewTextHandler(logs, nil))}))
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return srv, logs
}

// cachedTokens reads usage.prompt_tokens_details.cached_tokens of a response
// body or of the last usage chunk of a stream.
func cachedTokens(t *testing.T, body []byte, stream bool) int {
	t.Helper()
	payloads := []string{string(body)}
	if stream {
		payloads = sseEvents(t, body)
	}
	for i := len(payloads) - 1; i >= 0; i-- {
		var r struct {
			Usage *struct {
				Details *struct {
					Cached *int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(payloads[i]), &r); err != nil {
			t.Fatalf("%v: %s", err, payloads[i])
		}
		if r.Usage != nil {
			if r.Usage.Details == nil || r.Usage.Details.Cached == nil {
				t.Fatalf("usage without prompt_tokens_details.cached_tokens: %s", payloads[i])
			}
			return *r.Usage.Details.Cached
		}
	}
	t.Fatalf("no usage in %s", body)
	return 0
}

// TestPrefixCacheAPI: a request resending a long prefix reports the tokens it
// found in the cache, in chat and completions responses and in streamed
// usage; a cache salt isolates requests; the counters and the access log
// show the hits.
func TestPrefixCacheAPI(t *testing.T) {
	srv, logs := startPrefixServer(t)
	system := strings.Repeat("You are a careful assistant. Answer briefly and cite the rules you follow. ", 20)
	chat := func(user, extra string, stream bool) string {
		s := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":2,"temperature":0%s`, system, user, extra)
		if stream {
			s += `,"stream":true,"stream_options":{"include_usage":true}`
		}
		return s + "}"
	}
	for _, tc := range []struct {
		name, path, body string
		stream           bool
		hit              bool
	}{
		{"chat, first", "/v1/chat/completions", chat("What is 2+2?", "", false), false, false},
		{"chat, same system prompt", "/v1/chat/completions", chat("Name a colour.", "", false), false, true},
		{"chat stream", "/v1/chat/completions", chat("Name a fruit.", "", true), true, true},
		{"chat, other salt", "/v1/chat/completions", chat("Name a colour.", `,"cache_salt":"tenant-b"`, false), false, false},
		{"completions", "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":2,"temperature":0}`, system+"Q: why?"), false, false},
		{"completions stream", "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":2,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`, system+"Q: how?"), true, true},
	} {
		resp, body := post(t, srv, tc.path, tc.body, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.name, resp.StatusCode, body)
		}
		got := cachedTokens(t, body, tc.stream)
		if tc.hit != (got > 0) || got%256 != 0 {
			t.Errorf("%s: cached_tokens %d, want a hit: %v", tc.name, got, tc.hit)
		}
	}
	resp, body := post(t, srv, "/v1/chat/completions", chat("x", `,"cache_salt":""`, false), nil)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "cache_salt") {
		t.Errorf("empty cache_salt: %d %s", resp.StatusCode, body)
	}
	mr, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Body.Close()
	metrics, _ := io.ReadAll(mr.Body)
	for _, re := range []string{`vllm:prefix_cache_queries_total\{model_name="m"\} [1-9]`, `vllm:prefix_cache_hits_total\{model_name="m"\} [1-9]`,
		`megamoe_prefix_cache_hits_total [1-9]`, `megamoe_prefix_cache_hit_rate 0\.[0-9]*[1-9]`} {
		if !regexp.MustCompile(`(?m)^` + re).Match(metrics) {
			t.Errorf("metrics lack %s", re)
		}
	}
	if !regexp.MustCompile(`path=/v1/chat/completions .*cached_tokens=[1-9]`).MatchString(logs.String()) {
		t.Errorf("no access log line with cached tokens:\n%s", logs.String())
	}
}

// TestMultiTurnSharesPrefix: how much of turn N's tokens (prompt, then the
// generated reasoning and answer) turn N+1's prompt repeats under the V4
// chat encoding. Without thinking, and with thinking when tools keep the
// reasoning, all of it; with thinking otherwise, turn N's prompt but its last
// token: the generation prefix <think> is rendered </think> once the turn is
// history, and the reasoning is dropped.
func TestMultiTurnSharesPrefix(t *testing.T) {
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	enc := func(s string) []int { return tok.Encode(s) }
	tool := json.RawMessage(`{"type":"function","function":{"name":"get_time","description":"The time","parameters":{"type":"object","properties":{}}}}`)
	msg := func(role, content string) chatMessage {
		b, _ := json.Marshal(content)
		return chatMessage{Role: role, Content: b}
	}
	for _, tc := range []struct {
		name     string
		thinking bool
		tools    []json.RawMessage
		keepAll  bool // turn N+1 repeats all of turn N's tokens
	}{
		{"no thinking", false, nil, true},
		{"thinking", true, nil, false},
		{"thinking with tools", true, []json.RawMessage{tool}, true},
	} {
		opts := tokenizer.ChatOptions{Thinking: tc.thinking}
		turn1 := []chatMessage{msg("system", "You answer briefly."), msg("user", "What is the capital of France?")}
		p1, err := renderChat(turn1, tc.tools, opts)
		if err != nil {
			t.Fatal(err)
		}
		answer := chatMessage{Role: "assistant", ReasoningContent: "The user asks for a capital.", Content: json.RawMessage(`"Paris."`)}
		generated := "Paris." + tokenizer.EOS
		if tc.thinking {
			generated = answer.ReasoningContent + tokenizer.ThinkClose + generated
		}
		p2, err := renderChat(append(turn1, answer, msg("user", "And of Spain?")), tc.tools, opts)
		if err != nil {
			t.Fatal(err)
		}
		t1, t2 := append(enc(p1), enc(generated)...), enc(p2)
		common := 0
		for common < min(len(t1), len(t2)) && t1[common] == t2[common] {
			common++
		}
		want := len(t1)
		if !tc.keepAll {
			want = len(enc(p1)) - 1
		}
		if common != want {
			t.Errorf("%s: turn 2 repeats %d of turn 1's %d tokens (prompt %d), want %d", tc.name, common, len(t1), len(enc(p1)), want)
		}
	}
}
