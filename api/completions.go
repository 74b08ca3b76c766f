package api

import (
	"encoding/json"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/megamoe/megamoe/engine"
)

type completionRequest struct {
	commonParams
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int            `json:"logprobs"`
	Echo     bool            `json:"echo"`
}

type textChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	// PromptLogprobs is vLLM's prompt_logprobs (when asked; the same for every choice).
	PromptLogprobs []*promptPosition `json:"prompt_logprobs,omitempty"`
}

type textResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

// parsePrompt accepts a string, an array of token ids, or a one-element array of either.
func (s *Server) parsePrompt(raw json.RawMessage) ([]int32, error) {
	bad := errorf(http.StatusBadRequest, "prompt", "invalid_type", "prompt must be a string or an array of token ids")
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errorf(http.StatusBadRequest, "prompt", "", "prompt is required")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		return s.encode(text), nil
	}
	var ids []int32
	if err := json.Unmarshal(raw, &ids); err == nil {
		for _, id := range ids {
			if id < 0 || int(id) >= s.eng.Vocab() {
				return nil, errorf(http.StatusBadRequest, "prompt", "", "token id %d outside the vocabulary [0, %d)", id, s.eng.Vocab())
			}
		}
		return ids, nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err != nil {
		return nil, bad
	}
	if len(batch) != 1 {
		return nil, errorf(http.StatusBadRequest, "prompt", "", "only one prompt per request is supported")
	}
	elem := batch[0]
	if json.Unmarshal(elem, &text) == nil {
		return s.encode(text), nil
	}
	if json.Unmarshal(elem, &ids) != nil {
		return nil, bad
	}
	return s.parsePrompt(elem) // an id array: range-checked there
}

func (s *Server) completions(c *gin.Context) {
	var req completionRequest
	if err := readJSON(c, &req, unsupported("completions")); err != nil {
		writeError(c, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeError(c, err)
		return
	}
	prompt, err := s.parsePrompt(req.Prompt)
	if err != nil {
		writeError(c, err)
		return
	}
	if req.MaxTokens == nil && req.MaxCompletionTokens == nil {
		n := min(16, s.maxLen-len(prompt)) // OpenAI's completions default
		if n >= 1 {
			req.MaxTokens = &n
		}
	}
	g, err := s.build(&req.commonParams, prompt, "prompt")
	if err != nil {
		writeError(c, err)
		return
	}
	srcs, err := req.grammarSources()
	if err != nil {
		writeError(c, err)
		return
	}
	if g.constraint, err = s.constraint(srcs, false); err != nil {
		writeError(c, err)
		return
	}
	if req.Logprobs != nil {
		if err := setLogprobs(&g.params, true, *req.Logprobs, "logprobs"); err != nil {
			writeError(c, err)
			return
		}
	}
	echo := ""
	if req.Echo {
		echo = s.tok.Decode(int32sToInts(g.prompt))
	}
	resp := textResponse{ID: newID("cmpl-"), Object: "text_completion", Created: time.Now().Unix(), Model: s.cfg.ModelName}
	if req.Stream {
		s.streamCompletions(c, g, resp, echo, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
		return
	}
	ctx, stop := s.requestContext(c)
	defer stop()
	results, err := s.fanOut(ctx, g, func(int, delta) error { return nil }, nil)
	if err != nil {
		if err := failure(ctx, err); err != nil {
			writeError(c, err)
		}
		return
	}
	var promptLP []*promptPosition
	if g.promptTop != nil {
		promptLP = makePromptLogprobs(s.tok, results[0].prompt)
	}
	for i, res := range results {
		choice := textChoice{Index: i, Text: echo + res.text, FinishReason: strp(res.finish), PromptLogprobs: promptLP}
		if g.params.Logprobs {
			off := &charOffset{n: utf8.RuneCountInString(echo)}
			choice.Logprobs = makeCompletionLogprobs(s.tok, res.tokens, off)
		}
		resp.Choices = append(resp.Choices, choice)
	}
	resp.Usage = s.usage(c, len(g.prompt), results)
	writeDeadline(c, s.cfg.WriteIdleTimeout)
	c.JSON(http.StatusOK, resp)
}

// textStream is the streaming state of one completions choice.
type textStream struct {
	pending []engine.Token // generated tokens not yet sent with a chunk
	offset  charOffset     // text_offset of the next token
}

// streamCompletions streams the g.n choices; each chunk carries the logprobs
// of the tokens whose text it adds, with text offsets running on across
// chunks (from the echoed prompt's end).
func (s *Server) streamCompletions(c *gin.Context, g *genSpec, head textResponse, echo string, includeUsage bool) {
	ctx, stop := s.requestContext(c)
	defer stop()
	states := make([]textStream, g.n)
	// withNullUsage adds "usage": null to a chunk before the usage chunk, as
	// OpenAI sends them when include_usage is set.
	withNullUsage := func(ch textResponse) any {
		if includeUsage {
			return struct {
				textResponse
				Usage *usage `json:"usage"`
			}{textResponse: ch}
		}
		return ch
	}
	chunk := func(i int, text string, finish *string) any {
		ch := head
		tc := textChoice{Index: i, Text: text, FinishReason: finish}
		if cs := &states[i]; g.params.Logprobs && (text != "" || len(cs.pending) > 0) {
			tc.Logprobs = makeCompletionLogprobs(s.tok, cs.pending, &cs.offset)
			cs.pending = nil
		}
		ch.Choices = []textChoice{tc}
		return withNullUsage(ch)
	}
	var w sse
	started := false
	start := func() error {
		if started {
			return nil
		}
		started = true
		w = startSSE(c, s.cfg.WriteIdleTimeout)
		for i := range states {
			states[i].offset.n = utf8.RuneCountInString(echo)
			if echo == "" {
				continue
			}
			ch := head
			ch.Choices = []textChoice{{Index: i, Text: echo}}
			if err := w.send(withNullUsage(ch)); err != nil {
				return err
			}
		}
		return nil
	}
	q := queueWait{n: g.n}
	emit := func(i int, d delta) error {
		if ok, err := q.event(d, started, start, &w); ok {
			return err
		}
		if err := start(); err != nil {
			return err
		}
		states[i].pending = append(states[i].pending, d.tokens...)
		if d.content == "" {
			return nil
		}
		return w.send(chunk(i, d.content, nil))
	}
	done := func(i int, res *result) error {
		if err := start(); err != nil {
			return err
		}
		return w.send(chunk(i, "", strp(res.finish)))
	}
	results, err := s.fanOut(ctx, g, emit, done)
	if err != nil {
		switch err = failure(ctx, err); {
		case err == nil: // client went away; the sequences are cancelled
		case !started:
			writeError(c, err)
		default:
			w.fail(err)
		}
		return
	}
	if includeUsage {
		u := head
		u.Choices, u.Usage = []textChoice{}, s.usage(c, len(g.prompt), results)
		_ = w.send(u)
	}
	w.done()
}

func int32sToInts(v []int32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}
