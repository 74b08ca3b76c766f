package api

import (
	"encoding/json"
	"github.com/megamoe/megamoe/tokenizer"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
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
	Logprobs           bool              `json:"logprobs"`
	TopLogprobs        int               `json:"top_logprobs"`
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

// activeTools applies tool_choice: "none" disables the tools; anything else
// offers them (the model is not forced to call one).
func (r *chatRequest) activeTools() ([]json.RawMessage, error) {
	var choice string
	if len(r.ToolChoice) > 0 && json.Unmarshal(r.ToolChoice, &choice) == nil && choice == "none" {
		return nil, nil
	}
	for i, t := range r.Tools {
		var fn struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(t, &fn) != nil || fn.Type != "function" || fn.Function.Name == "" {
			return nil, errorf(http.StatusBadRequest, "tools["+strconv.Itoa(i)+"]", "", "each tool must be {\"type\":\"function\",\"function\":{\"name\":…}}")
		}
	}
	return r.Tools, nil
}

type templateKwargs struct {
	Thinking bool `json:"thinking"`
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

// renderChat renders messages in the DeepSeek-V4 chat format.
// renderChat renders the conversation with the DeepSeek-V4 chat encoding.
func renderChat(msgs []chatMessage, tools []json.RawMessage, opts tokenizer.ChatOptions) (string, error) {
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
		case "system", "developer", "user", "assistant", "tool":
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
}

func strp(s string) *string { return &s }

func (s *Server) chat(c *gin.Context) {
	var req chatRequest
	if err := readJSON(c, &req); err != nil {
		writeError(c, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeError(c, err)
		return
	}
	thinking := req.ReasoningEffort != nil || (req.ChatTemplateKwargs != nil && req.ChatTemplateKwargs.Thinking)
	effort := ""
	if req.ReasoningEffort != nil {
		effort = *req.ReasoningEffort
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
	text, err := renderChat(req.Messages, tools, tokenizer.ChatOptions{Thinking: thinking, ReasoningEffort: effort, ResponseFormat: format})
	if err != nil {
		writeError(c, err)
		return
	}
	g, err := s.build(&req.commonParams, s.encode(text), "messages")
	if err != nil {
		writeError(c, err)
		return
	}
	g.thinking = thinking
	if err := setLogprobs(&g.params, req.Logprobs, req.TopLogprobs, "top_logprobs"); err != nil {
		writeError(c, err)
		return
	}
	id, created := newID("chatcmpl-"), time.Now().Unix()
	ctx := c.Request.Context()
	if !req.Stream {
		res, err := s.generate(ctx, g, func(delta) error { return nil })
		if err != nil {
			if ctx.Err() == nil {
				writeError(c, err)
			}
			return
		}
		msg := &chatOutMsg{Role: "assistant", Content: strp(res.text)}
		if thinking {
			msg.ReasoningContent = strp(res.reasoning)
		}
		if len(tools) > 0 {
			p := tokenizer.NewOutputParser(false)
			d := p.Push(res.text)
			rest, calls := p.Finish()
			msg.Content = strp(d.Content + rest.Content)
			if len(calls) > 0 {
				msg.ToolCalls = outToolCalls(calls, false)
				res.finish = "tool_calls"
			}
		}
		choice := chatChoice{Message: msg, FinishReason: strp(res.finish)}
		if g.params.Logprobs {
			choice.Logprobs = makeChatLogprobs(s.tok, res.tokens)
		}
		c.JSON(http.StatusOK, chatResponse{ID: id, Object: "chat.completion", Created: created, Model: s.cfg.ModelName,
			Choices: []chatChoice{choice}, Usage: mkUsage(len(g.prompt), res.completion)})
		return
	}
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	chunk := func(d *chatOutMsg, finish *string) chatResponse {
		return chatResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.ModelName,
			Choices: []chatChoice{{Delta: d, FinishReason: finish}}}
	}
	var w sse
	started := false
	start := func() error {
		if started {
			return nil
		}
		started = true
		w = startSSE(c)
		return w.send(chunk(&chatOutMsg{Role: "assistant", Content: strp("")}, nil))
	}
	var calls *tokenizer.OutputParser
	if len(tools) > 0 {
		calls = tokenizer.NewOutputParser(false)
	}
	res, err := s.generate(ctx, g, func(d delta) error {
		if err := start(); err != nil {
			return err
		}
		if calls != nil && d.content != "" {
			d.content = calls.Push(d.content).Content
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
		return w.send(chunk(m, nil))
	})
	if err != nil {
		if ctx.Err() != nil {
			return // client went away; the sequence is cancelled
		}
		if !started {
			writeError(c, err)
			return
		}
		w.fail(err)
		return
	}
	if err := start(); err != nil {
		return
	}
	if calls != nil {
		rest, parsed := calls.Finish()
		if rest.Content != "" {
			_ = w.send(chunk(&chatOutMsg{Content: strp(rest.Content)}, nil))
		}
		if len(parsed) > 0 {
			_ = w.send(chunk(&chatOutMsg{ToolCalls: outToolCalls(parsed, true)}, nil))
			res.finish = "tool_calls"
		}
	}
	final := chunk(&chatOutMsg{}, strp(res.finish))
	if g.params.Logprobs { // streamed logprobs arrive with the final chunk
		final.Choices[0].Logprobs = makeChatLogprobs(s.tok, res.tokens)
	}
	_ = w.send(final)
	if includeUsage {
		_ = w.send(chatResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.ModelName,
			Choices: []chatChoice{}, Usage: mkUsage(len(g.prompt), res.completion)})
	}
	w.done()
}

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
	if err := readJSON(c, &req); err != nil {
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
	if req.Logprobs != nil {
		if err := setLogprobs(&g.params, true, *req.Logprobs, "logprobs"); err != nil {
			writeError(c, err)
			return
		}
	}
	id, created := newID("cmpl-"), time.Now().Unix()
	ctx := c.Request.Context()
	if !req.Stream {
		res, err := s.generate(ctx, g, func(delta) error { return nil })
		if err != nil {
			if ctx.Err() == nil {
				writeError(c, err)
			}
			return
		}
		choice := textChoice{Text: res.text, FinishReason: strp(res.finish)}
		offset := 0
		if req.Echo {
			echo := s.tok.Decode(int32sToInts(g.prompt))
			choice.Text, offset = echo+res.text, len(echo)
		}
		if req.Logprobs != nil {
			choice.Logprobs = makeCompletionLogprobs(s.tok, res.tokens, offset)
		}
		c.JSON(http.StatusOK, textResponse{ID: id, Object: "text_completion", Created: created, Model: s.cfg.ModelName,
			Choices: []textChoice{choice}, Usage: mkUsage(len(g.prompt), res.completion)})
		return
	}
	chunk := func(text string, finish *string) textResponse {
		return textResponse{ID: id, Object: "text_completion", Created: created, Model: s.cfg.ModelName,
			Choices: []textChoice{{Text: text, FinishReason: finish}}}
	}
	w, started := sse{}, false
	res, err := s.generate(ctx, g, func(d delta) error {
		if !started {
			w, started = startSSE(c), true
		}
		return w.send(chunk(d.content, nil))
	})
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case !started:
			writeError(c, err)
		default:
			w.fail(err)
		}
		return
	}
	if !started {
		w = startSSE(c)
	}
	_ = w.send(chunk("", strp(res.finish)))
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		_ = w.send(textResponse{ID: id, Object: "text_completion", Created: created, Model: s.cfg.ModelName,
			Choices: []textChoice{}, Usage: mkUsage(len(g.prompt), res.completion)})
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
