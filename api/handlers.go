package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/tokenizer"
)

type chatMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	ToolCalls        []toolCall      `json:"tool_calls"`
	ToolCallID       string          `json:"tool_call_id"`
}

type toolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatRequest struct {
	commonParams
	Messages           []chatMessage     `json:"messages"`
	ReasoningEffort    *string           `json:"reasoning_effort"`
	ChatTemplateKwargs *templateKwargs   `json:"chat_template_kwargs"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ResponseFormat     *responseFormat   `json:"response_format"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	Logprobs           bool              `json:"logprobs"`
	TopLogprobs        *int              `json:"top_logprobs"`
	// vLLM's chat extensions.
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`
	Echo                 bool  `json:"echo"`
}

type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema"`
}

// schema is the JSON schema the V4 response-format block renders, if any.
func (f *responseFormat) schema() (json.RawMessage, error) {
	switch {
	case f == nil || f.Type == "" || f.Type == "text":
		return nil, nil
	case f.Type == "json_object":
		return json.RawMessage(`{"type": "object"}`), nil
	case f.Type == "json_schema" && f.JSONSchema != nil && len(f.JSONSchema.Schema) > 0:
		return f.JSONSchema.Schema, nil
	}
	return nil, errorf(http.StatusBadRequest, "response_format", "", "response_format must be text, json_object or json_schema with a schema")
}

// templateKwargs are vLLM's chat_template_kwargs as its DeepSeek-V4 recipe
// sends them.
type templateKwargs struct {
	Thinking        *bool   `json:"thinking"`
	ReasoningEffort *string `json:"reasoning_effort"`
}

// messageText accepts a string or an array of {"type":"text","text":...} parts.
func messageText(i int, raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	param := "messages[" + strconv.Itoa(i) + "].content"
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errorf(http.StatusBadRequest, param, "invalid_type", "content must be a string or an array of text parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", errorf(http.StatusBadRequest, param, "", "content part type %q is not supported", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// renderChat renders the conversation with the DeepSeek-V4 chat encoding.
func renderChat(msgs []chatMessage, tools []json.RawMessage, opts tokenizer.ChatOptions) (string, error) {
	return renderChatWith(msgs, tools, opts, func(s string) string { return s })
}

// renderChatWith is renderChat with quote applied to the text of system,
// developer, user and tool messages.
func renderChatWith(msgs []chatMessage, tools []json.RawMessage, opts tokenizer.ChatOptions, quote func(string) string) (string, error) {
	if len(msgs) == 0 {
		return "", errorf(http.StatusBadRequest, "messages", "", "messages must not be empty")
	}
	conv := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		text, err := messageText(i, m.Content)
		if err != nil {
			return "", err
		}
		switch m.Role {
		case "system", "developer", "user", "tool":
			text = quote(text)
		case "assistant":
		default:
			return "", errorf(http.StatusBadRequest, "messages["+strconv.Itoa(i)+"].role", "", "role %q is not supported", m.Role)
		}
		conv[i] = tokenizer.Message{Role: m.Role, Content: text, ReasoningContent: m.ReasoningContent, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			conv[i].ToolCalls = append(conv[i].ToolCalls, tokenizer.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
	}
	out, err := tokenizer.EncodeChat(conv, tools, opts)
	if err != nil {
		return "", errorf(http.StatusBadRequest, "messages", "", "%v", err)
	}
	return out, nil
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      *chatOutMsg `json:"message,omitempty"`
	Delta        *chatOutMsg `json:"delta,omitempty"`
	Logprobs     any         `json:"logprobs"`
	FinishReason *string     `json:"finish_reason"`
}

type chatOutMsg struct {
	Role             string     `json:"role,omitempty"`
	Content          *string    `json:"content,omitempty"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
}

// outToolCalls converts parsed DSML calls to the OpenAI shape.
func outToolCalls(calls []tokenizer.ToolCall, indexed bool) []toolCall {
	out := make([]toolCall, len(calls))
	for i, c := range calls {
		out[i] = toolCall{ID: newID("call_"), Type: "function"}
		if indexed {
			out[i].Index = &i
		}
		out[i].Function.Name, out[i].Function.Arguments = c.Name, c.Arguments
	}
	return out
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
	// PromptLogprobs is vLLM's prompt_logprobs (when asked).
	PromptLogprobs []*promptPosition `json:"prompt_logprobs,omitempty"`
}

func strp(s string) *string { return &s }

func (s *Server) chat(c *gin.Context) {
	var req chatRequest
	if err := readJSON(c, &req, unsupported("chat")); err != nil {
		writeError(c, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeError(c, err)
		return
	}
	thinking, effort, err := thinkingOptions(req.ReasoningEffort, req.ChatTemplateKwargs)
	if err != nil {
		writeError(c, err)
		return
	}
	tools, err := req.activeTools()
	if err != nil {
		writeError(c, err)
		return
	}
	format, err := req.ResponseFormat.schema()
	if err != nil {
		writeError(c, err)
		return
	}
	opts := tokenizer.ChatOptions{Thinking: thinking, ReasoningEffort: effort, ResponseFormat: format}
	text, err := renderChatWith(req.Messages, tools, opts, s.quote)
	if err != nil {
		writeError(c, err)
		return
	}
	rendered := text
	text, echo, err := req.ending(text, thinking)
	if err != nil {
		writeError(c, err)
		return
	}
	g, err := s.build(&req.commonParams, s.encodeQuoted(text), "messages")
	if err != nil {
		writeError(c, err)
		return
	}
	if text == rendered && s.eng.Config().PrefixCaching { // not cut by add_generation_prompt or continue_final_message
		g.reuseAt = s.reuseAt(req.Messages, tools, opts, text, g.prompt)
	}
	g.thinking = thinking
	srcs, err := req.grammarSources()
	if err != nil {
		writeError(c, err)
		return
	}
	calls, err := req.toolCallSource(tools)
	if err != nil {
		writeError(c, err)
		return
	}
	srcs = append(append(req.ResponseFormat.grammarSource(), srcs...), calls...)
	if g.constraint, err = s.constraint(srcs, thinking); err != nil {
		writeError(c, err)
		return
	}
	if thinking {
		g.keep = append(g.keep, tokenizer.ThinkClose)
	}
	if len(tools) > 0 {
		g.keep = append(g.keep, tokenizer.DSML)
	}
	if req.TopLogprobs != nil && !req.Logprobs {
		writeError(c, errorf(http.StatusBadRequest, "top_logprobs", "", "top_logprobs requires logprobs to be true"))
		return
	}
	top := 0
	if req.TopLogprobs != nil {
		top = *req.TopLogprobs
	}
	if err := setLogprobs(&g.params, req.Logprobs, top, "top_logprobs"); err != nil {
		writeError(c, err)
		return
	}
	resp := chatResponse{ID: newID("chatcmpl-"), Object: "chat.completion", Created: time.Now().Unix(), Model: s.cfg.ModelName}
	if req.Stream {
		s.streamChat(c, g, resp, len(tools) > 0, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, echo)
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
	for i, res := range results {
		res.text = echo + res.text
		resp.Choices = append(resp.Choices, s.chatChoice(i, res, len(tools) > 0, thinking, g.params.Logprobs))
	}
	resp.Usage = s.usage(c, len(g.prompt), results)
	if g.promptTop != nil {
		resp.PromptLogprobs = makePromptLogprobs(s.tok, results[0].prompt)
	}
	writeDeadline(c, s.cfg.WriteIdleTimeout)
	c.JSON(http.StatusOK, resp)
}

// chatChoice is the non-streamed choice i of res.
func (s *Server) chatChoice(i int, res *result, tools, thinking, logprobs bool) chatChoice {
	msg := &chatOutMsg{Role: "assistant", Content: strp(res.text)}
	if thinking {
		msg.ReasoningContent = strp(res.reasoning)
	}
	finish := res.finish
	if tools {
		p := tokenizer.NewOutputParser(false)
		d := p.Push(res.text)
		rest, calls := p.Finish()
		msg.Content = strp(d.Content + rest.Content)
		if len(calls) > 0 {
			msg.ToolCalls = outToolCalls(calls, false)
			finish = "tool_calls"
		}
	}
	ch := chatChoice{Index: i, Message: msg, FinishReason: strp(finish)}
	if logprobs {
		ch.Logprobs = makeChatLogprobs(s.tok, res.tokens)
	}
	return ch
}

// chatStream is the streaming state of one choice.
type chatStream struct {
	calls   *tokenizer.OutputParser // tool-call parser; nil without tools
	pending []engine.Token          // generated tokens not yet sent with a chunk
}

// streamChat streams the g.n choices as chat.completion.chunk events. Each
// chunk carries the logprobs of the tokens whose text it adds; tokens whose
// text is held back (a possible tool-call marker) or dropped (</think>) ride
// with the choice's next chunk, at the latest its finish chunk.
func (s *Server) streamChat(c *gin.Context, g *genSpec, head chatResponse, tools, includeUsage bool, echo string) {
	ctx, stop := s.requestContext(c)
	defer stop()
	head.Object = "chat.completion.chunk"
	chunk := func(i int, d *chatOutMsg, finish *string, lp any) any {
		ch := head
		ch.Choices = []chatChoice{{Index: i, Delta: d, FinishReason: finish, Logprobs: lp}}
		if includeUsage { // "usage": null until the usage chunk, as OpenAI sends it
			return struct {
				chatResponse
				Usage *usage `json:"usage"`
			}{chatResponse: ch}
		}
		return ch
	}
	states := make([]chatStream, g.n)
	for i := range states {
		if tools {
			states[i].calls = tokenizer.NewOutputParser(false)
		}
	}
	// logprobs takes choice i's pending tokens (nil when not asked for, or
	// when there are none and the chunk adds no text).
	logprobs := func(i int, text bool) any {
		cs := &states[i]
		if !g.params.Logprobs || (!text && len(cs.pending) == 0) {
			return nil
		}
		lp := makeChatLogprobs(s.tok, cs.pending)
		cs.pending = nil
		return lp
	}
	var w sse
	started := false
	start := func() error {
		if started {
			return nil
		}
		started = true
		w = startSSE(c, s.cfg.WriteIdleTimeout)
		for i := range g.n {
			if err := w.send(chunk(i, &chatOutMsg{Role: "assistant", Content: strp("")}, nil, nil)); err != nil {
				return err
			}
			if echo != "" {
				if err := w.send(chunk(i, &chatOutMsg{Content: strp(echo)}, nil, nil)); err != nil {
					return err
				}
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
		cs := &states[i]
		cs.pending = append(cs.pending, d.tokens...)
		if cs.calls != nil && d.content != "" {
			d.content = cs.calls.Push(d.content).Content
		}
		if d.reasoning == "" && d.content == "" {
			return nil
		}
		m := &chatOutMsg{}
		if d.reasoning != "" {
			m.ReasoningContent = strp(d.reasoning)
		}
		if d.content != "" {
			m.Content = strp(d.content)
		}
		return w.send(chunk(i, m, nil, logprobs(i, true)))
	}
	done := func(i int, res *result) error {
		if err := start(); err != nil {
			return err
		}
		if calls := states[i].calls; calls != nil {
			rest, parsed := calls.Finish()
			if rest.Content != "" {
				if err := w.send(chunk(i, &chatOutMsg{Content: strp(rest.Content)}, nil, logprobs(i, true))); err != nil {
					return err
				}
			}
			if len(parsed) > 0 {
				if err := w.send(chunk(i, &chatOutMsg{ToolCalls: outToolCalls(parsed, true)}, nil, nil)); err != nil {
					return err
				}
				res.finish = "tool_calls"
			}
		}
		return w.send(chunk(i, &chatOutMsg{}, strp(res.finish), logprobs(i, false)))
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
		u.Choices, u.Usage = []chatChoice{}, s.usage(c, len(g.prompt), results)
		_ = w.send(u)
	}
	w.done()
}

func sumCompletion(results []*result) int {
	n := 0
	for _, r := range results {
		n += r.completion
	}
	return n
}

// ending applies add_generation_prompt and continue_final_message to the
// rendered prompt text, and returns the text echo puts before the answer
// (the continued final message's).
func (r *chatRequest) ending(text string, thinking bool) (string, string, error) {
	addGen := r.AddGenerationPrompt == nil || *r.AddGenerationPrompt
	last := r.Messages[len(r.Messages)-1]
	echo := ""
	switch {
	case r.ContinueFinalMessage && addGen:
		return "", "", errorf(http.StatusBadRequest, "continue_final_message", "", "continue_final_message needs add_generation_prompt false")
	case r.ContinueFinalMessage:
		if last.Role != "assistant" {
			return "", "", errorf(http.StatusBadRequest, "continue_final_message", "", "continue_final_message needs an assistant message last")
		}
		// The final assistant turn stays open: no end-of-sentence after it.
		text = strings.TrimSuffix(text, tokenizer.EOS)
		if r.Echo {
			echo, _ = messageText(len(r.Messages)-1, last.Content)
		}
	case !addGen:
		text = strings.TrimSuffix(text, tokenizer.AssistantTag+thinkToken(thinking))
	}
	return text, echo, nil
}

func thinkToken(thinking bool) string {
	if thinking {
		return tokenizer.ThinkOpen
	}
	return tokenizer.ThinkClose
}

// thinkingOptions is the thinking mode and V4 effort level of a request:
// reasoning_effort (or chat_template_kwargs.reasoning_effort) turns thinking
// on at its level, except none and minimal, which turn it off;
// chat_template_kwargs.thinking, when sent, decides on or off. Without any of
// them the model answers without thinking, the chat template's default.
func thinkingOptions(effort *string, kw *templateKwargs) (bool, string, error) {
	if effort == nil && kw != nil {
		effort = kw.ReasoningEffort
	}
	thinking := effort != nil
	if effort != nil && (*effort == "none" || *effort == "minimal") {
		thinking, effort = false, nil
	}
	if kw != nil && kw.Thinking != nil {
		thinking = *kw.Thinking
	}
	level, err := reasoningEffort(effort)
	if err != nil || !thinking {
		return false, "", err
	}
	return true, level, nil
}

// reasoningEffort maps the OpenAI reasoning_effort values onto the two levels
// DeepSeek-V4 has, as DeepSeek's API does: low, medium and high think at
// "high" (no prefix); xhigh and max use the max-effort prefix.
func reasoningEffort(v *string) (string, error) {
	if v == nil {
		return "", nil
	}
	switch *v {
	case "low", "medium", "high":
		return "high", nil
	case "max", "xhigh":
		return "max", nil
	}
	return "", errorf(http.StatusBadRequest, "reasoning_effort", "", "reasoning_effort %q: want none, minimal, low, medium, high, xhigh or max", *v)
}
