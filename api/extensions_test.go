package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/tokenizer"
)

// TestVLLMExtensions checks vLLM's sampling and chat-template extensions on
// outputs forced by logit_bias.
func TestVLLMExtensions(t *testing.T) {
	srv, _ := startServer(t, Config{}, 0)
	tok := goldenTokenizer(t)
	eos, _ := tok.TokenID(tokenizer.EOS)
	a := byteToken(t, tok, 'a')
	force := func(id int) string { return fmt.Sprintf(`"logit_bias":{"%d":100},"temperature":0,"max_tokens":3,`, id) }
	const user = `"messages":[{"role":"user","content":"hi"}]`
	const cont = `"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Hel"}]`
	base := promptTokens(t, srv, `{"max_tokens":1,`+user+`}`)
	cases := []struct {
		name, body string
		status     int
		content    string // want, unless "-"
		finish     string // want, unless ""
		completion int    // want, unless 0
		prompt     int    // want, unless 0
	}{
		{"eos ends", `{` + force(eos) + user + `}`, 200, "", "stop", 1, 0},
		{"ignore_eos", `{` + force(eos) + `"ignore_eos":true,` + user + `}`, 200, "-", "length", 3, 0},
		{"stop_token_ids", `{` + force(a) + fmt.Sprintf(`"stop_token_ids":[%d],`, a) + user + `}`, 200, "", "stop", 1, 0},
		{"stop_token_ids out of range", `{"stop_token_ids":[-1],` + user + `}`, 400, "-", "", 0, 0},
		{"stop string dropped", `{` + force(a) + `"stop":["aa"],` + user + `}`, 200, "", "stop", 0, 0},
		{"include_stop_str_in_output", `{` + force(a) + `"stop":["aa"],"include_stop_str_in_output":true,` + user + `}`, 200, "aa", "stop", 0, 0},
		{"min_tokens holds eos", `{` + force(eos) + `"min_tokens":2,` + user + `}`, 200, "-", "stop", 3, 0},
		{"min_tokens holds stop_token_ids", `{` + force(a) + fmt.Sprintf(`"stop_token_ids":[%d],"min_tokens":2,`, a) + user + `}`, 200, "-", "stop", 3, 0},
		{"min_tokens holds stop strings", `{` + force(a) + `"stop":["aa"],"min_tokens":2,` + user + `}`, 200, "a", "stop", 3, 0},
		{"min_tokens equal to max_tokens", `{` + force(eos) + `"min_tokens":3,` + user + `}`, 200, "-", "length", 3, 0},
		{"min_tokens above max_tokens", `{"min_tokens":4,"max_tokens":3,` + user + `}`, 400, "-", "", 0, 0},
		{"min_tokens negative", `{"min_tokens":-1,` + user + `}`, 400, "-", "", 0, 0},
		{"min_tokens 0", `{"min_tokens":0,"max_tokens":1,` + user + `}`, 200, "-", "", 0, 0},
		{"spaces_between_special_tokens", `{"spaces_between_special_tokens":false,"max_tokens":1,` + user + `}`, 200, "-", "", 0, 0},
		{"add_generation_prompt false", `{"add_generation_prompt":false,"max_tokens":1,` + user + `}`, 200, "-", "", 0,
			base - len(tok.Encode(tokenizer.AssistantTag+tokenizer.ThinkClose))},
		{"continue_final_message", `{` + force(a) + `"continue_final_message":true,"add_generation_prompt":false,"echo":true,` + cont + `}`, 200, "Helaaa", "length", 0, 0},
		{"continue_final_message without echo", `{` + force(a) + `"continue_final_message":true,"add_generation_prompt":false,` + cont + `}`, 200, "aaa", "length", 0, 0},
		{"continue_final_message with generation prompt", `{"continue_final_message":true,` + cont + `}`, 400, "-", "", 0, 0},
		{"continue_final_message after user", `{"continue_final_message":true,"add_generation_prompt":false,` + user + `}`, 400, "-", "", 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, srv, "/v1/chat/completions", c.body, nil)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			if c.status != http.StatusOK {
				return
			}
			var out struct {
				Choices []struct {
					Message      struct{ Content string }
					FinishReason string `json:"finish_reason"`
				}
				Usage testUsage
			}
			if err := json.Unmarshal(body, &out); err != nil || len(out.Choices) != 1 {
				t.Fatalf("decode %s: %v", body, err)
			}
			ch := out.Choices[0]
			switch {
			case c.content != "-" && ch.Message.Content != c.content,
				c.finish != "" && ch.FinishReason != c.finish,
				c.completion != 0 && out.Usage.CompletionTokens != c.completion,
				c.prompt != 0 && out.Usage.PromptTokens != c.prompt:
				t.Errorf("got %q %s, %+v; want %q %s, %d completion, %d prompt tokens", ch.Message.Content, ch.FinishReason, out.Usage,
					c.content, c.finish, c.completion, c.prompt)
			}
		})
	}
	// The echoed stream starts with the continued message.
	resp, body := post(t, srv, "/v1/chat/completions", `{`+force(a)+`"stream":true,"continue_final_message":true,"add_generation_prompt":false,"echo":true,`+cont+`}`, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"content":"Hel"`) {
		t.Errorf("echoed stream: status %d: %s", resp.StatusCode, body)
	}
}

// promptTokens is the usage.prompt_tokens of a chat request.
func promptTokens(t *testing.T, srv *httptest.Server, body string) int {
	t.Helper()
	resp, data := post(t, srv, "/v1/chat/completions", body, nil)
	var out struct{ Usage testUsage }
	if err := json.Unmarshal(data, &out); resp.StatusCode != http.StatusOK || err != nil || out.Usage.PromptTokens == 0 {
		t.Fatalf("status %d (%v): %s", resp.StatusCode, err, data)
	}
	return out.Usage.PromptTokens
}
