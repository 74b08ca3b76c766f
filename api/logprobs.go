package api

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/tokenizer"
)

// chatLogprob is one entry of OpenAI's choices[].logprobs.content.
type chatLogprob struct {
	Token       string        `json:"token"`
	Logprob     float32       `json:"logprob"`
	Bytes       []int         `json:"bytes"`
	TopLogprobs []chatLogprob `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

// completionLogprobs is the legacy /v1/completions shape.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// setLogprobs validates the request's logprob options into the sampler params.
func setLogprobs(p *engine.SamplingParams, want bool, top int, param string) error {
	if top < 0 || top > engine.MaxTopLogprobs {
		return errorf(http.StatusBadRequest, param, "", "%s must be in [0, %d]", param, engine.MaxTopLogprobs)
	}
	p.Logprobs, p.TopLogprobs = want || top > 0, top
	return nil
}

func tokenBytes(tok *tokenizer.Tokenizer, id int32) (string, []int) {
	s := tok.Decode([]int{int(id)})
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return s, b
}

func makeChatLogprobs(tok *tokenizer.Tokenizer, toks []engine.Token) *chatLogprobs {
	out := &chatLogprobs{Content: make([]chatLogprob, 0, len(toks))}
	for _, t := range toks {
		s, b := tokenBytes(tok, t.ID)
		e := chatLogprob{Token: s, Logprob: t.Logprob, Bytes: b, TopLogprobs: []chatLogprob{}}
		for _, alt := range t.Top {
			as, ab := tokenBytes(tok, alt.ID)
			e.TopLogprobs = append(e.TopLogprobs, chatLogprob{Token: as, Logprob: alt.Logprob, Bytes: ab})
		}
		out.Content = append(out.Content, e)
	}
	return out
}

// charOffset counts the characters of streamed token text as clients see it:
// a character split over tokens counts once it is complete, and each byte
// that can never form one counts as one U+FFFD.
type charOffset struct {
	n    int    // characters so far
	tail []byte // an incomplete character's bytes
}

func (c *charOffset) add(s string) {
	b := append(c.tail, s...)
	for len(b) > 0 && utf8.FullRune(b) {
		_, size := utf8.DecodeRune(b)
		c.n++
		b = b[size:]
	}
	c.tail = append(c.tail[:0:0], b...)
}

// topKey is the top_logprobs key of token id: its text, or where that text is
// not valid UTF-8 (all such tokens would read alike as U+FFFD) or already
// taken by another token, vLLM's "bytes:" form, then "token_id:".
func topKey(tok *tokenizer.Tokenizer, id int32, taken map[string]float32) string {
	s, _ := tokenBytes(tok, id)
	if _, dup := taken[s]; utf8.ValidString(s) && !dup {
		return s
	}
	if !utf8.ValidString(s) {
		var b strings.Builder
		b.WriteString("bytes:")
		for i := range len(s) {
			fmt.Fprintf(&b, "\\x%02x", s[i])
		}
		if _, dup := taken[b.String()]; !dup {
			return b.String()
		}
	}
	return "token_id:" + strconv.Itoa(int(id))
}

// makeCompletionLogprobs fills the legacy logprobs of toks, their text
// offsets (in characters, as OpenAI counts) running on from off.
func makeCompletionLogprobs(tok *tokenizer.Tokenizer, toks []engine.Token, off *charOffset) *completionLogprobs {
	out := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	for _, t := range toks {
		s, _ := tokenBytes(tok, t.ID)
		out.Tokens = append(out.Tokens, s)
		out.TokenLogprobs = append(out.TokenLogprobs, t.Logprob)
		top := map[string]float32{}
		for _, alt := range t.Top {
			top[topKey(tok, alt.ID, top)] = alt.Logprob
		}
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, off.n)
		off.add(s)
	}
	return out
}
