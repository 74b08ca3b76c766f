package api

import (
	"net/http"

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

// makeCompletionLogprobs also returns the offset after the last token.
func makeCompletionLogprobs(tok *tokenizer.Tokenizer, toks []engine.Token, offset int) (*completionLogprobs, int) {
	out := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	for _, t := range toks {
		s, _ := tokenBytes(tok, t.ID)
		out.Tokens = append(out.Tokens, s)
		out.TokenLogprobs = append(out.TokenLogprobs, t.Logprob)
		top := map[string]float32{}
		for _, alt := range t.Top {
			as, _ := tokenBytes(tok, alt.ID)
			top[as] = alt.Logprob
		}
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, offset)
		offset += len(s)
	}
	return out, offset
}
