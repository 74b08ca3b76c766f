package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/megamoe/megamoe/tokenizer"
)

// TestMinTokensStreamed checks min_tokens on streamed n > 1 requests of both
// endpoints, with EOS forced by logit_bias: every choice runs min_tokens
// tokens before the EOS ends it, and the streamed text holds no stop string
// matched too early.
func TestMinTokensStreamed(t *testing.T) {
	srv, _ := startServer(t, Config{}, 0)
	tok := goldenTokenizer(t)
	eos, _ := tok.TokenID(tokenizer.EOS)
	a := byteToken(t, tok, 'a')
	opts := `"stream":true,"stream_options":{"include_usage":true},"n":2,"temperature":1,"seed":7,"max_tokens":8,"min_tokens":3,`
	cases := []struct {
		name, path, body string
		completion       int    // all choices together
		text             string // of each choice, unless "-"
	}{
		{"chat, eos held", "/v1/chat/completions", `{` + opts + fmt.Sprintf(`"logit_bias":{"%d":100},`, eos) +
			`"messages":[{"role":"user","content":"hi"}]}`, 2 * 4, "-"},
		{"completions, eos held", "/v1/completions", `{` + opts + fmt.Sprintf(`"logit_bias":{"%d":100},`, eos) + `"prompt":"hi"}`, 2 * 4, "-"},
		{"completions, stop string held", "/v1/completions", `{` + opts + fmt.Sprintf(`"logit_bias":{"%d":100},`, a) +
			`"stop":["aa"],"prompt":"hi"}`, 2 * 4, "aa"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, srv, c.path, c.body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			text := map[int]string{}
			finish := map[int]string{}
			completion := -1
			for _, ev := range sseEvents(t, body) {
				var ch struct {
					Choices []struct {
						Index        int
						Text         string
						Delta        struct{ Content string }
						FinishReason *string `json:"finish_reason"`
					}
					Usage *testUsage
				}
				if err := json.Unmarshal([]byte(ev), &ch); err != nil {
					t.Fatalf("chunk %s: %v", ev, err)
				}
				for _, x := range ch.Choices {
					text[x.Index] += x.Text + x.Delta.Content
					if x.FinishReason != nil {
						finish[x.Index] = *x.FinishReason
					}
				}
				if ch.Usage != nil {
					completion = ch.Usage.CompletionTokens
				}
			}
			if completion != c.completion || len(finish) != 2 || finish[0] != "stop" || finish[1] != "stop" {
				t.Errorf("completion tokens %d, finish %v; want %d and stop for both choices", completion, finish, c.completion)
			}
			for i := range 2 {
				if c.text != "-" && text[i] != c.text {
					t.Errorf("choice %d text %q, want %q", i, text[i], c.text)
				}
			}
		})
	}
}
