package api

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/internal/testctx"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

const testMaxLen = 1024

// startServer serves the embedded small model on a loopback httptest server.
func startServer(t *testing.T, cfg Config, maxQueue int) (*httptest.Server, *engine.Engine) {
	t.Helper()
	return startServerWith(t, cfg, maxQueue, nil)
}

// startServerWith is startServer with configure applied to the http.Server
// (and its gin engine) before it starts.
func startServerWith(t *testing.T, cfg Config, maxQueue int, configure func(*http.Server)) (*httptest.Server, *engine.Engine) {
	t.Helper()
	w, tok := loadEmbedded(t)
	return startServerOn(t, cfg, maxQueue, configure, w, tok)
}

// loadEmbedded loads the embedded model and its tokenizer (skipping without it).
func loadEmbedded(t *testing.T) (*checkpoint.Weights, *tokenizer.Tokenizer) {
	t.Helper()
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	w, _, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatalf("tokenizer: %v", err)
	}
	return w, tok
}

// startRandomServer serves synth:small, the random-weight small model, for
// tests whose prompts were tuned to its behaviour (it seldom ends a string or
// a turn), and returns its tokenizer.
func startRandomServer(t *testing.T, cfg Config) (*httptest.Server, *tokenizer.Tokenizer) {
	t.Helper()
	w, tok, err := models.Synth(models.SynthSpec{Preset: "small"}, models.SmallSeed)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := startServerOn(t, cfg, 0, nil, w, tok)
	return srv, tok
}

// startServerOn serves weights w with tokenizer tok.
func startServerOn(t *testing.T, cfg Config, maxQueue int, configure func(*http.Server), w *checkpoint.Weights, tok *tokenizer.Tokenizer) (*httptest.Server, *engine.Engine) {
	t.Helper()
	m, err := model.New(w, nil, model.Options{CacheBytes: 64 << 20})
	if err != nil {
		t.Fatalf("model: %v", err)
	}
	seqs := 4
	if maxQueue > 0 { // a bounded queue test: one running sequence makes the bound reachable
		seqs = 1
	}
	eng, err := engine.New(engine.FromModel(m), engine.Config{MaxNumSeqs: seqs, MaxModelLen: testMaxLen, MaxQueue: maxQueue})
	if err != nil {
		t.Fatalf("engine: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = eng.Run(ctx); close(done) }()
	gin.SetMode(gin.TestMode)
	srv := httptest.NewUnstartedServer(New(eng, tok, cfg))
	if configure != nil {
		configure(srv.Config)
	}
	srv.Start()
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return srv, eng
}

func post(t *testing.T, srv *httptest.Server, path, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return resp, data
}

type testUsage struct {
	PromptTokens, CompletionTokens, TotalTokens int
}

func (u *testUsage) UnmarshalJSON(b []byte) error {
	var raw struct {
		P int `json:"prompt_tokens"`
		C int `json:"completion_tokens"`
		T int `json:"total_tokens"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*u = testUsage{raw.P, raw.C, raw.T}
	return nil
}

func TestServer(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "megamoe-small", APIKey: "sekrit"}, 0)
	auth := map[string]string{"Authorization": "Bearer sekrit"}
	tok, err := tokenizer.LoadFile(filepath.Join(mustDir(t), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	wantPrompt := len(tok.Encode(tokenizer.BOS + "be brief" + tokenizer.UserTag + "hello" + tokenizer.AssistantTag + tokenizer.ThinkClose))

	t.Run("chat", func(t *testing.T) {
		resp, body := post(t, srv, "/v1/chat/completions", `{"model":"megamoe-small","max_tokens":6,"temperature":0,
			"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}]}`, auth)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var out struct {
			Object  string
			Choices []struct {
				Message struct {
					Role    string
					Content *string
				}
				FinishReason string `json:"finish_reason"`
			}
			Usage testUsage
		}
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatalf("decode %s: %v", body, err)
		}
		if out.Object != "chat.completion" || len(out.Choices) != 1 || out.Choices[0].Message.Content == nil {
			t.Fatalf("bad response %s", body)
		}
		u := out.Usage
		if u.PromptTokens != wantPrompt || u.CompletionTokens < 1 || u.CompletionTokens > 6 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Errorf("usage %+v, want prompt %d and 1..6 completion", u, wantPrompt)
		}
		fr := out.Choices[0].FinishReason
		if (fr == "length") != (u.CompletionTokens == 6) || (fr != "length" && fr != "stop") {
			t.Errorf("finish_reason %q with %d completion tokens", fr, u.CompletionTokens)
		}
		if fr == "length" && *out.Choices[0].Message.Content == "" {
			t.Errorf("6 tokens decoded to empty text: %s", body)
		}
	})

	t.Run("stream", func(t *testing.T) {
		resp, body := post(t, srv, "/v1/chat/completions", `{"max_tokens":5,"stream":true,"stream_options":{"include_usage":true},
			"seed":7,"temperature":0.8,"top_k":20,"messages":[{"role":"user","content":"hi"}]}`, auth)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		var events []string
		sc := bufio.NewScanner(strings.NewReader(string(body)))
		for sc.Scan() {
			if line := sc.Text(); line != "" {
				if !strings.HasPrefix(line, "data: ") {
					t.Fatalf("bad SSE line %q", line)
				}
				events = append(events, strings.TrimPrefix(line, "data: "))
			}
		}
		if len(events) < 3 || events[len(events)-1] != "[DONE]" {
			t.Fatalf("events %q, want chunks then [DONE]", events)
		}
		finishes, usages := 0, 0
		for _, e := range events[:len(events)-1] {
			var ch struct {
				Object  string
				Choices []struct {
					FinishReason *string `json:"finish_reason"`
				}
				Usage *testUsage
			}
			if err := json.Unmarshal([]byte(e), &ch); err != nil {
				t.Fatalf("chunk %q: %v", e, err)
			}
			if ch.Object != "chat.completion.chunk" {
				t.Errorf("object %q", ch.Object)
			}
			for _, c := range ch.Choices {
				if c.FinishReason != nil {
					finishes++
				}
			}
			if ch.Usage != nil {
				usages++
				if u := *ch.Usage; u.CompletionTokens < 1 || u.CompletionTokens > 5 || u.TotalTokens != u.PromptTokens+u.CompletionTokens || u.PromptTokens < 3 {
					t.Errorf("usage %+v", u)
				}
			}
		}
		if finishes != 1 || usages != 1 {
			t.Errorf("%d finish chunks and %d usage chunks, want 1 and 1", finishes, usages)
		}
	})

	t.Run("completions", func(t *testing.T) {
		resp, body := post(t, srv, "/v1/completions", `{"prompt":[0,5,9,12],"max_tokens":3,"temperature":0}`, auth)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var out struct {
			Object string
			Usage  testUsage
		}
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
		if out.Object != "text_completion" || out.Usage.PromptTokens != 4 || out.Usage.CompletionTokens < 1 || out.Usage.CompletionTokens > 3 {
			t.Errorf("bad completion %s", body)
		}
	})

	long := `{"prompt":[` + strings.Repeat("5,", testMaxLen) + `5],"max_tokens":1}`
	huge := `{"prompt":"` + strings.Repeat("a", MaxBodyBytes+1) + `"}`
	msg := `"messages":[{"role":"user","content":"x"}]`
	bad := []struct {
		name, path, body string
		hdr              map[string]string
		status           int
		param            string
	}{
		{"invalid json", "/v1/chat/completions", `{"messages":`, auth, 400, ""},
		{"messages wrong type", "/v1/chat/completions", `{"messages":"hi"}`, auth, 400, "messages"},
		{"temperature wrong type", "/v1/chat/completions", `{"temperature":"hot",` + msg + `}`, auth, 400, "temperature"},
		{"temperature range", "/v1/chat/completions", `{"temperature":3,` + msg + `}`, auth, 400, "temperature"},
		{"top_p range", "/v1/chat/completions", `{"top_p":1.5,` + msg + `}`, auth, 400, "top_p"},
		{"max_tokens zero", "/v1/chat/completions", `{"max_tokens":0,` + msg + `}`, auth, 400, "max_tokens"},
		{"max_tokens beyond context", "/v1/chat/completions", `{"max_tokens":100000,` + msg + `}`, auth, 400, "max_tokens"},
		{"empty messages", "/v1/chat/completions", `{"messages":[]}`, auth, 400, "messages"},
		{"bad role", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"x"}]}`, auth, 400, "messages[0].role"},
		{"stop wrong type", "/v1/chat/completions", `{"stop":5,` + msg + `}`, auth, 400, "stop"},
		{"logit_bias key", "/v1/chat/completions", `{"logit_bias":{"abc":1},` + msg + `}`, auth, 400, "logit_bias"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9",` + msg + `}`, auth, 404, "model"},
		{"prompt too long", "/v1/completions", long, auth, 400, "prompt"},
		{"prompt token out of vocab", "/v1/completions", `{"prompt":[99999999]}`, auth, 400, "prompt"},
		{"body too large", "/v1/completions", huge, auth, 413, ""},
		{"missing api key", "/v1/chat/completions", `{` + msg + `}`, nil, 401, ""},
		{"wrong api key", "/v1/completions", `{"prompt":"x"}`, map[string]string{"Authorization": "Bearer nope"}, 401, ""},
		{"top_k negative", "/v1/chat/completions", `{"top_k":-5,` + msg + `}`, auth, 400, "top_k"},
		{"min_p range", "/v1/chat/completions", `{"min_p":2,` + msg + `}`, auth, 400, "min_p"},
		{"presence_penalty range", "/v1/chat/completions", `{"presence_penalty":3,` + msg + `}`, auth, 400, "presence_penalty"},
		{"frequency_penalty range", "/v1/chat/completions", `{"frequency_penalty":-3,` + msg + `}`, auth, 400, "frequency_penalty"},
		{"repetition_penalty zero", "/v1/chat/completions", `{"repetition_penalty":0,` + msg + `}`, auth, 400, "repetition_penalty"},
		{"n zero", "/v1/chat/completions", `{"n":0,` + msg + `}`, auth, 400, "n"},
		{"n above bound", "/v1/completions", `{"n":17,"prompt":"x"}`, auth, 400, "n"},
		{"reasoning_effort unknown", "/v1/chat/completions", `{"reasoning_effort":"extreme",` + msg + `}`, auth, 400, "reasoning_effort"},
		{"seed wrong type", "/v1/chat/completions", `{"seed":"x",` + msg + `}`, auth, 400, "seed"},
		{"stream wrong type", "/v1/chat/completions", `{"stream":"yes",` + msg + `}`, auth, 400, "stream"},
		{"content wrong type", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, auth, 400, "messages[0].content"},
		{"logit_bias value range", "/v1/chat/completions", `{"logit_bias":{"5":500},` + msg + `}`, auth, 400, "logit_bias"},
		{"body not an object", "/v1/chat/completions", `[1,2]`, auth, 400, ""},
		{"empty body", "/v1/chat/completions", ``, auth, 400, ""},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, auth, 400, "prompt"},
		{"prompt wrong type", "/v1/completions", `{"prompt":{"a":1}}`, auth, 400, "prompt"},
		{"completion max_tokens negative", "/v1/completions", `{"prompt":"x","max_tokens":-1}`, auth, 400, "max_tokens"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, srv, tc.path, tc.body, tc.hdr)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			var e struct {
				Error struct {
					Message string
					Type    string
					Param   *string
				}
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("not an OpenAI error: %s (%v)", body, err)
			}
			if tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param) {
				t.Errorf("param %v, want %q: %s", e.Error.Param, tc.param, body)
			}
		})
	}

	t.Run("health after", func(t *testing.T) {
		for _, path := range []string{"/health", "/version"} {
			resp, err := srv.Client().Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s: status %d", path, resp.StatusCode)
			}
		}
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer sekrit")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var list struct{ Data []struct{ ID string } }
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) != 1 || list.Data[0].ID != "megamoe-small" {
			t.Errorf("models: %+v (%v)", list, err)
		}
	})
}

func mustDir(t *testing.T) string {
	t.Helper()
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	return dir
}

func TestRenderChat(t *testing.T) {
	msgs := []chatMessage{
		{Role: "system", Content: json.RawMessage(`"S"`)},
		{Role: "user", Content: json.RawMessage(`"U1"`)},
		{Role: "assistant", Content: json.RawMessage(`"A1"`)},
		{Role: "user", Content: json.RawMessage(`[{"type":"text","text":"U"},{"type":"text","text":"2"}]`)},
	}
	for _, tc := range []struct {
		thinking bool
		want     string
	}{
		{false, tokenizer.BOS + "S" + tokenizer.UserTag + "U1" + tokenizer.AssistantTag + tokenizer.ThinkClose + "A1" + tokenizer.EOS + tokenizer.UserTag + "U2" + tokenizer.AssistantTag + tokenizer.ThinkClose},
		{true, tokenizer.BOS + "S" + tokenizer.UserTag + "U1" + tokenizer.AssistantTag + tokenizer.ThinkClose + "A1" + tokenizer.EOS + tokenizer.UserTag + "U2" + tokenizer.AssistantTag + tokenizer.ThinkOpen},
	} {
		got, err := renderChat(msgs, nil, tokenizer.ChatOptions{Thinking: tc.thinking})
		if err != nil || got != tc.want {
			t.Errorf("thinking=%v: got %q (%v), want %q", tc.thinking, got, err, tc.want)
		}
	}
}

// TestStopAndThinking checks stop strings cut the greedy output where they
// occur and thinking mode splits reasoning from content.
func TestStopAndThinking(t *testing.T) {
	srv, _ := startServer(t, Config{}, 0)
	type chatOut struct {
		Choices []struct {
			Message struct {
				Content          *string
				ReasoningContent *string `json:"reasoning_content"`
			}
			FinishReason string `json:"finish_reason"`
		}
		Usage testUsage
	}
	chat := func(extra string) chatOut {
		t.Helper()
		resp, body := post(t, srv, "/v1/chat/completions", `{"max_tokens":8,"temperature":0,`+extra+
			`"messages":[{"role":"user","content":"tell me"}]}`, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var out chatOut
		if err := json.Unmarshal(body, &out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("decode %s: %v", body, err)
		}
		return out
	}
	full := chat("")
	text := *full.Choices[0].Message.Content
	runes := []rune(text)
	if len(runes) < 3 {
		t.Skipf("greedy output %q too short to cut", text)
	}
	stop := string(runes[len(runes)/2 : len(runes)/2+1])
	want := text[:strings.Index(text, stop)]
	stopJSON, _ := json.Marshal(stop)
	cut := chat(`"stop":[` + string(stopJSON) + `],`)
	if got := *cut.Choices[0].Message.Content; got != want || cut.Choices[0].FinishReason != "stop" {
		t.Errorf("stop %q: got %q (%s), want %q (stop); full %q", stop, got, cut.Choices[0].FinishReason, want, text)
	}
	if cut.Usage.CompletionTokens > full.Usage.CompletionTokens || cut.Usage.TotalTokens != cut.Usage.PromptTokens+cut.Usage.CompletionTokens {
		t.Errorf("stop usage %+v vs full %+v", cut.Usage, full.Usage)
	}

	th := chat(`"reasoning_effort":"high",`)
	m := th.Choices[0].Message
	if m.ReasoningContent == nil || m.Content == nil {
		t.Fatalf("thinking response lacks reasoning_content or content: %+v", m)
	}
	if strings.Contains(*m.ReasoningContent, tokenizer.ThinkClose) || strings.Contains(*m.Content, tokenizer.ThinkClose) {
		t.Errorf("</think> leaked: %q / %q", *m.ReasoningContent, *m.Content)
	}
	if th.Usage.PromptTokens != full.Usage.PromptTokens {
		t.Errorf("thinking prompt %d tokens, chat %d (same length: <think> vs </think>)", th.Usage.PromptTokens, full.Usage.PromptTokens)
	}
}

// TestDisconnect checks a cancelled client request frees its sequence.
func TestDisconnect(t *testing.T) {
	srv, eng := startServer(t, Config{}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"max_tokens":200,"stream":true,"messages":[{"role":"user","content":"go on"}]}`))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first chunk arrived
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	wait := testctx.New(t)
	for st := eng.Stats(); st.Running+st.Waiting > 0 || st.CacheUsed > 0; st = eng.Stats() {
		if wait.Err() != nil {
			t.Fatalf("sequence not cancelled after disconnect: %+v", st)
		}
		time.Sleep(5 * time.Millisecond) // Stats has no change notification
	}
	// The server must still answer, and promptly (the 200-token sequence is gone).
	r2, body := post(t, srv, "/v1/completions", `{"prompt":"ok","max_tokens":2}`, nil)
	if r2.StatusCode != http.StatusOK {
		t.Fatalf("after disconnect: %d %s", r2.StatusCode, body)
	}
}

// TestQueueFull checks requests beyond the engine's queue bound get 429.
func TestQueueFull(t *testing.T) {
	srv, _ := startServer(t, Config{}, 1)
	ctx, cancel := context.WithCancel(testctx.New(t))
	defer cancel()
	const n = 6
	status := make(chan int, n)
	for range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions",
				strings.NewReader(`{"max_tokens":200,"messages":[{"role":"user","content":"wait"}]}`))
			resp, err := srv.Client().Do(req)
			if err != nil {
				status <- 0 // cancelled below
				return
			}
			resp.Body.Close()
			status <- resp.StatusCode
		}()
	}
	full := 0
	for range n - 2 { // at most one running and one waiting can avoid 429
		select {
		case code := <-status:
			if code == http.StatusTooManyRequests {
				full++
			} else {
				t.Errorf("status %d before the queue drained, want 429", code)
			}
		case <-ctx.Done():
			t.Fatal("no answers")
		}
	}
	if full != n-2 {
		t.Errorf("%d requests got 429, want %d", full, n-2)
	}
}

func TestReasoningEffortLevels(t *testing.T) {
	for _, c := range []struct{ in, want string }{{"low", "high"}, {"medium", "high"}, {"high", "high"}, {"xhigh", "max"}, {"max", "max"}} {
		got, err := reasoningEffort(&c.in)
		if err != nil || got != c.want {
			t.Errorf("reasoningEffort(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	if got, err := reasoningEffort(nil); got != "" || err != nil {
		t.Errorf("reasoningEffort(nil) = %q, %v", got, err)
	}
}
