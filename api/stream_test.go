package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// sseEvents splits an SSE body into its data payloads, checking it ends with [DONE].
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			if !strings.HasPrefix(line, "data: ") {
				t.Fatalf("bad SSE line %q", line)
			}
			events = append(events, strings.TrimPrefix(line, "data: "))
		}
	}
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %s", body)
	}
	return events[:len(events)-1]
}

// TestStreamedLogprobs checks every streamed chunk carries the logprobs of
// exactly the tokens whose text it adds, and that the chunks' logprobs put
// together equal the non-streamed ones of the same greedy request.
func TestStreamedLogprobs(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	call := func(path, body string) []byte {
		t.Helper()
		resp, data := post(t, srv, path, body, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", path, resp.StatusCode, data)
		}
		return data
	}
	type chatEntry struct {
		Token string `json:"token"`
	}
	for _, tc := range []struct{ name, extra string }{
		{"plain", ``},
		{"held back for a stop string", `"stop":["zqxv"],`}, // never matches; holds 3 bytes per step
	} {
		t.Run("chat "+tc.name, func(t *testing.T) {
			req := `{"model":"m","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":8,"temperature":0,` +
				tc.extra + `"logprobs":true,"top_logprobs":2`
			var whole struct {
				Choices []struct {
					Message  struct{ Content string }
					Logprobs struct{ Content []json.RawMessage }
				}
			}
			if err := json.Unmarshal(call("/v1/chat/completions", req+`}`), &whole); err != nil || len(whole.Choices) != 1 {
				t.Fatalf("decode: %v", err)
			}
			want := whole.Choices[0].Logprobs.Content
			var got []json.RawMessage
			var text strings.Builder
			for _, e := range sseEvents(t, call("/v1/chat/completions", req+`,"stream":true}`)) {
				var ch struct {
					Choices []struct {
						Delta    struct{ Content string }
						Logprobs *struct{ Content []json.RawMessage }
						Finish   *string `json:"finish_reason"`
					}
				}
				if err := json.Unmarshal([]byte(e), &ch); err != nil || len(ch.Choices) != 1 {
					t.Fatalf("chunk %s: %v", e, err)
				}
				c := ch.Choices[0]
				text.WriteString(c.Delta.Content)
				if c.Delta.Content != "" && c.Logprobs == nil {
					t.Fatalf("content chunk without logprobs: %s", e)
				}
				if c.Logprobs == nil {
					continue
				}
				var pieces strings.Builder
				for _, raw := range c.Logprobs.Content {
					var en chatEntry
					if err := json.Unmarshal(raw, &en); err != nil {
						t.Fatal(err)
					}
					pieces.WriteString(en.Token)
				}
				if c.Finish == nil && pieces.String() != c.Delta.Content {
					t.Errorf("chunk text %q, its logprob tokens spell %q", c.Delta.Content, pieces.String())
				}
				got = append(got, c.Logprobs.Content...)
			}
			if text.String() != whole.Choices[0].Message.Content {
				t.Errorf("streamed text %q, non-streamed %q", text.String(), whole.Choices[0].Message.Content)
			}
			if len(want) == 0 || !equalRaw(got, want) {
				t.Errorf("streamed logprobs\n%s\nnon-streamed\n%s", joinRaw(got), joinRaw(want))
			}
		})
	}

	t.Run("completions", func(t *testing.T) {
		req := `{"model":"m","prompt":"The quick brown fox","max_tokens":8,"temperature":0,"logprobs":2`
		type lps struct {
			Tokens        []string
			TokenLogprobs []json.RawMessage `json:"token_logprobs"`
			TopLogprobs   []json.RawMessage `json:"top_logprobs"`
			TextOffset    []int             `json:"text_offset"`
		}
		var whole struct {
			Choices []struct {
				Text     string
				Logprobs lps
			}
		}
		if err := json.Unmarshal(call("/v1/completions", req+`}`), &whole); err != nil || len(whole.Choices) != 1 {
			t.Fatalf("decode: %v", err)
		}
		var got lps
		var text strings.Builder
		for _, e := range sseEvents(t, call("/v1/completions", req+`,"stream":true}`)) {
			var ch struct {
				Choices []struct {
					Text     string
					Logprobs *lps
				}
			}
			if err := json.Unmarshal([]byte(e), &ch); err != nil || len(ch.Choices) != 1 {
				t.Fatalf("chunk %s: %v", e, err)
			}
			c := ch.Choices[0]
			if c.Text != "" && (c.Logprobs == nil || strings.Join(c.Logprobs.Tokens, "") != c.Text) {
				t.Fatalf("chunk text %q with logprobs %+v", c.Text, c.Logprobs)
			}
			if c.Logprobs != nil {
				got.Tokens = append(got.Tokens, c.Logprobs.Tokens...)
				got.TokenLogprobs = append(got.TokenLogprobs, c.Logprobs.TokenLogprobs...)
				got.TopLogprobs = append(got.TopLogprobs, c.Logprobs.TopLogprobs...)
				got.TextOffset = append(got.TextOffset, c.Logprobs.TextOffset...)
			}
			text.WriteString(c.Text)
		}
		w := whole.Choices[0]
		if text.String() != w.Text || len(w.Logprobs.Tokens) == 0 {
			t.Fatalf("streamed %q, non-streamed %q", text.String(), w.Text)
		}
		if strings.Join(got.Tokens, "\x00") != strings.Join(w.Logprobs.Tokens, "\x00") ||
			!equalRaw(got.TokenLogprobs, w.Logprobs.TokenLogprobs) || !equalRaw(got.TopLogprobs, w.Logprobs.TopLogprobs) ||
			!slices.Equal(got.TextOffset, w.Logprobs.TextOffset) {
			t.Errorf("streamed logprobs %+v, non-streamed %+v", got, w.Logprobs)
		}
	})
}

// TestStreamedEcho checks a streamed completion with echo starts with the
// prompt, like the non-streamed one, for every choice.
func TestStreamedEcho(t *testing.T) {
	srv, _ := startServer(t, Config{}, 0)
	req := `{"prompt":"The fox","max_tokens":3,"temperature":0,"echo":true,"n":2`
	resp, body := post(t, srv, "/v1/completions", req+`}`, nil)
	var whole struct{ Choices []struct{ Text string } }
	if err := json.Unmarshal(body, &whole); err != nil || resp.StatusCode != http.StatusOK || len(whole.Choices) != 2 {
		t.Fatalf("status %d: %s (%v)", resp.StatusCode, body, err)
	}
	resp, body = post(t, srv, "/v1/completions", req+`,"stream":true}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	text := make([]string, 2)
	for _, e := range sseEvents(t, body) {
		var ch struct {
			Choices []struct {
				Index int
				Text  string
			}
		}
		if err := json.Unmarshal([]byte(e), &ch); err != nil || len(ch.Choices) != 1 || ch.Choices[0].Index > 1 {
			t.Fatalf("chunk %s: %v", e, err)
		}
		text[ch.Choices[0].Index] += ch.Choices[0].Text
	}
	for i, c := range whole.Choices {
		if !strings.HasPrefix(c.Text, "The fox") || text[i] != c.Text {
			t.Errorf("choice %d: streamed %q, non-streamed %q", i, text[i], c.Text)
		}
	}
}

func equalRaw(a, b []json.RawMessage) bool {
	return slices.EqualFunc(a, b, func(x, y json.RawMessage) bool { return bytes.Equal(x, y) })
}

func joinRaw(v []json.RawMessage) string {
	var b strings.Builder
	for _, r := range v {
		b.Write(r)
		b.WriteByte('\n')
	}
	return b.String()
}
