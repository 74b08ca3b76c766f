package api

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/megamoe/megamoe/tokenizer"
)

// templateTags are the special tokens the chat encoding writes between
// messages: a rendered prompt splits into tokens independently on each side
// of one (unless quoted: text in messages has its special tokens quoted).
var templateTags = []string{tokenizer.UserTag, tokenizer.AssistantTag, tokenizer.ThinkOpen, tokenizer.ThinkClose, tokenizer.EOS}

// reuseAt is the number of prompt tokens (of text, the rendered chat msgs)
// that the follow-up request, resending this conversation with the answer
// and a new user message, repeats (engine Request.ReuseAt), or 0 when it
// repeats all of them. In thinking mode without tools the V4 encoding drops
// earlier reasoning and renders the generation prefix <think> as </think>
// once the turn is history: the follow-up repeats the prompt but its last
// token. The point comes from the encoding itself: the history rendering of
// an empty answer and user message against text, compared token by token
// from the last message tag before they differ (only that tail is encoded
// again). A wrong point costs cache hits, never correctness: hits compare
// the tokens.
func (s *Server) reuseAt(msgs []chatMessage, tools []json.RawMessage, opts tokenizer.ChatOptions, text string, prompt []int32) int {
	empty := json.RawMessage(`""`)
	hist, err := renderChatWith(append(slices.Clip(msgs), chatMessage{Role: "assistant", Content: empty}, chatMessage{Role: "user", Content: empty}),
		tools, opts, s.quote)
	if err != nil || strings.HasPrefix(hist, text) {
		return 0
	}
	c := 0
	for c < min(len(text), len(hist)) && text[c] == hist[c] {
		c++
	}
	k := 0 // the BOS that starts every rendering
	for _, tag := range templateTags {
		k = max(k, lastTag(text[:min(len(text), c+len(tag))], tag))
	}
	tail := s.encodeQuoted(text[k:])
	if len(tail) > len(prompt) || !slices.Equal(tail, prompt[len(prompt)-len(tail):]) {
		return 0
	}
	ht := s.encodeQuoted(hist[k:])
	n := 0
	for n < min(len(tail), len(ht)) && tail[n] == ht[n] {
		n++
	}
	if r := len(prompt) - len(tail) + n; r < len(prompt) {
		return r
	}
	return 0
}

// lastTag is the start of the last occurrence of tag in text written by the
// template (not quoted message text), or -1.
func lastTag(text, tag string) int {
	for {
		i := strings.LastIndex(text, tag)
		if i <= 0 || text[i-1] != quoteOpen[0] {
			return i
		}
		text = text[:i]
	}
}
