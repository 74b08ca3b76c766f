package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

// TestReuseAt: the point where a follow-up request's rendering stops
// repeating a chat prompt equals the common prefix of both renderings
// encoded whole; in thinking mode without tools it is the prompt but its
// generation prefix <think>, elsewhere (the follow-up repeats everything) 0.
func TestReuseAt(t *testing.T) {
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{tok: tok, quoter: newQuoter(tok)}
	msg := func(role, content string) chatMessage {
		b, _ := json.Marshal(content)
		return chatMessage{Role: role, Content: b}
	}
	answer := chatMessage{Role: "assistant", ReasoningContent: "Think of maps.", Content: json.RawMessage(`"Paris."`)}
	chat := []chatMessage{msg("system", "You answer briefly."), msg("user", "What is the capital of France?"), answer, msg("user", "And of Spain?")}
	tool := json.RawMessage(`{"type":"function","function":{"name":"get_time","description":"The time","parameters":{"type":"object","properties":{}}}}`)
	think := tokenizer.ChatOptions{Thinking: true}
	for _, tc := range []struct {
		name   string
		msgs   []chatMessage
		tools  []json.RawMessage
		opts   tokenizer.ChatOptions
		last1  bool // the prompt but its last token
		cutOff bool // 0 < point < prompt, anywhere
	}{
		{"no thinking", chat, nil, tokenizer.ChatOptions{}, false, false},
		{"thinking, first turn", chat[:2], nil, think, true, true},
		{"thinking, second turn", chat, nil, think, true, true},
		{"thinking, max effort", chat, nil, tokenizer.ChatOptions{Thinking: true, ReasoningEffort: "max"}, true, true},
		{"thinking, user text spelling the generation prefix", append(chat[:3:3], msg("user", "Say "+tokenizer.AssistantTag+tokenizer.ThinkOpen)), nil, think, true, true},
		{"thinking with tools", chat, []json.RawMessage{tool}, think, false, false},
		// The follow-up drops a developer turn that is no longer the last.
		{"thinking, developer turn last", append(chat[:3:3], msg("developer", "Answer in French.")), nil, think, false, true},
	} {
		text, err := renderChatWith(tc.msgs, tc.tools, tc.opts, s.quote)
		if err != nil {
			t.Fatal(err)
		}
		prompt := s.encodeQuoted(text)
		got := s.reuseAt(tc.msgs, tc.tools, tc.opts, text, prompt)
		empty := json.RawMessage(`""`)
		hist, err := renderChatWith(append(tc.msgs[:len(tc.msgs):len(tc.msgs)], chatMessage{Role: "assistant", Content: empty}, chatMessage{Role: "user", Content: empty}), tc.tools, tc.opts, s.quote)
		if err != nil {
			t.Fatal(err)
		}
		full := s.encodeQuoted(hist)
		want := 0
		for want < min(len(prompt), len(full)) && prompt[want] == full[want] {
			want++
		}
		if want == len(prompt) {
			want = 0
		}
		if got != want || tc.last1 && got != len(prompt)-1 || tc.cutOff != (got > 0) {
			t.Errorf("%s: reuse point %d of %d prompt tokens, want %d (the whole renderings' common prefix)", tc.name, got, len(prompt), want)
		}
	}
}

// TestThinkingTurnsHitAPI: through the HTTP API, each turn of a thinking
// chat without tools finds the previous turn's prompt but its last token in
// the cache (cached_tokens); without thinking, and thinking with tools, the
// next turn finds more than the previous prompt (its end, answer included).
func TestThinkingTurnsHitAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("three turns of three chats on the embedded model")
	}
	srv, _ := startPrefixServer(t)
	system := strings.Repeat("You are a careful assistant who answers briefly. ", 8)
	tools := `,"tools":[{"type":"function","function":{"name":"get_time","description":"The time","parameters":{"type":"object","properties":{}}}}]`
	for _, tc := range []struct {
		name, extra string
		reuse       bool // the next turn hits the prompt but its last token
	}{
		{"thinking", `,"reasoning_effort":"high"`, true},
		{"no thinking", ``, false},
		{"thinking with tools", `,"reasoning_effort":"high"` + tools, false},
	} {
		sys, _ := json.Marshal(map[string]string{"role": "system", "content": system + tc.name})
		msgs := []json.RawMessage{sys}
		prev := 0 // the previous turn's prompt tokens
		for turn, q := range []string{"What does the word lantern mean?", "And the word harbour?", "Use both in a sentence."} {
			user, _ := json.Marshal(map[string]string{"role": "user", "content": q})
			msgs = append(msgs, user)
			body, _ := json.Marshal(msgs)
			resp, out := post(t, srv, "/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":%s,"max_tokens":12,"temperature":0%s}`, body, tc.extra), nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s turn %d: %d %s", tc.name, turn+1, resp.StatusCode, out)
			}
			var r struct {
				Choices []struct {
					Message json.RawMessage `json:"message"`
				} `json:"choices"`
				Usage struct {
					Prompt int `json:"prompt_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(out, &r); err != nil || len(r.Choices) != 1 {
				t.Fatalf("%s turn %d: %v: %s", tc.name, turn+1, err, out)
			}
			cached := cachedTokens(t, out, false)
			switch {
			case turn == 0:
			case tc.reuse && cached != prev-1:
				t.Errorf("%s turn %d: cached_tokens %d, want the previous prompt's %d tokens but its last", tc.name, turn+1, cached, prev)
			case !tc.reuse && cached < prev:
				t.Errorf("%s turn %d: cached_tokens %d, want more than the previous prompt's %d tokens", tc.name, turn+1, cached, prev)
			}
			prev = r.Usage.Prompt
			msgs = append(msgs, r.Choices[0].Message) // the answer goes back as the client got it
		}
	}
}
