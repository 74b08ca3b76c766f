package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// The DeepSeek-V4 special-token strings the chat encoding writes.
const (
	BOS            = "<｜begin▁of▁sentence｜>"
	EOS            = "<｜end▁of▁sentence｜>"
	UserTag        = "<｜User｜>"
	AssistantTag   = "<｜Assistant｜>"
	ThinkOpen      = "<think>"
	ThinkClose     = "</think>"
	LatestReminder = "<｜latest_reminder｜>"
	DSML           = "｜DSML｜"
)

const maxEffortPrefix = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n" +
	"You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n" +
	"Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"

const toolsHead = "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n" +
	"<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\n" +
	"String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n" +
	"If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n" +
	"Otherwise, output directly after </think> with tool calls or final response.\n\n" +
	"### Available Tool Schemas\n\n"

const toolsTail = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"

// TaskTokens are encoding_dsv4.py's DS_TASK_SP_TOKENS, the special tokens of
// its internal classification tasks, selected by Message.Task.
var TaskTokens = map[string]string{
	"action":    "<｜action｜>",
	"query":     "<｜query｜>",
	"authority": "<｜authority｜>",
	"domain":    "<｜domain｜>",
	"title":     "<｜title｜>",
	"read_url":  "<｜read_url｜>",
}

// ToolCall is one function call of an assistant turn; Arguments is a JSON object.
type ToolCall struct {
	ID, Name, Arguments string
}

// Message is one chat turn. Roles: system, developer, user, assistant, tool, latest_reminder.
type Message struct {
	Role             string
	Content          string
	ReasoningContent string
	ToolCalls        []ToolCall
	ToolCallID       string            // tool results: the call they answer
	Tools            []json.RawMessage // system/developer: tools rendered into this turn
	ResponseFormat   json.RawMessage   // system/developer: schema rendered into this turn
	Task             string            // a TaskTokens key: ask for that task's output after this turn
}

// ChatOptions select the V4 rendering mode.
type ChatOptions struct {
	Thinking        bool
	ReasoningEffort string          // "", "high" or "max" (the only values encoding_dsv4.py accepts)
	ResponseFormat  json.RawMessage // a JSON schema object, rendered into the system turn
	KeepThinking    bool            // keep earlier turns' reasoning (drop_thinking=False)
}

// EncodeChat renders a conversation as DeepSeek-V4's encoding_dsv4.py
// encode_messages does (spec §10.2, Appendix A); the result ends with the
// generation prefix. tools and opts.ResponseFormat go into the leading system
// message (one is inserted when there is none); a developer or system message
// may also carry its own Tools. Tools are OpenAI tool objects
// ({"type":"function","function":{…}}) or bare function objects.
func EncodeChat(msgs []Message, tools []json.RawMessage, opts ChatOptions) (string, error) {
	if len(msgs) == 0 {
		return "", fmt.Errorf("chat: no messages")
	}
	switch opts.ReasoningEffort {
	case "", "high", "max":
	default:
		return "", fmt.Errorf("chat: reasoning effort %q: want \"high\" or \"max\"", opts.ReasoningEffort)
	}
	for i, m := range msgs {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool", "latest_reminder":
		default:
			return "", fmt.Errorf("chat: message %d: unknown role %q", i, m.Role)
		}
		if _, ok := TaskTokens[m.Task]; m.Task != "" && !ok {
			return "", fmt.Errorf("chat: message %d: unknown task %q", i, m.Task)
		}
	}
	turns := mergeTurns(attachRequestTools(msgs, tools, opts.ResponseFormat))
	sortToolResults(turns)
	// Earlier reasoning is dropped unless disabled or any turn carries tools.
	drop := !opts.KeepThinking
	for _, t := range turns {
		drop = drop && len(t.Tools) == 0
	}
	if opts.Thinking && drop {
		turns = dropThinking(turns)
	}
	var b strings.Builder
	b.WriteString(BOS)
	lastUser := lastUserIndex(turns)
	for i := range turns {
		if err := renderTurn(&b, turns, i, lastUser, drop, opts); err != nil {
			return "", fmt.Errorf("chat: message %d: %w", i, err)
		}
	}
	return b.String(), nil
}

// renderTurn is render_message for turns[i].
func renderTurn(b *strings.Builder, turns []turn, i, lastUser int, drop bool, opts ChatOptions) error {
	t := turns[i]
	if i == 0 && opts.Thinking && opts.ReasoningEffort == "max" {
		b.WriteString(maxEffortPrefix)
	}
	switch t.Role {
	case "system":
		b.WriteString(t.Content)
		if err := writeBlocks(b, t.Message); err != nil {
			return err
		}
	case "developer":
		if t.Content == "" {
			return fmt.Errorf("developer message without content")
		}
		b.WriteString(UserTag + t.Content)
		if err := writeBlocks(b, t.Message); err != nil {
			return err
		}
	case "user":
		b.WriteString(UserTag)
		for j, p := range t.parts {
			if j > 0 {
				b.WriteString("\n\n")
			}
			if p.result {
				b.WriteString("<tool_result>" + p.text + "</tool_result>")
			} else {
				b.WriteString(p.text)
			}
		}
	case "latest_reminder":
		b.WriteString(LatestReminder + t.Content)
	case "assistant":
		// The answer to a task turn never has reasoning.
		taskOutput := i > 0 && turns[i-1].Task != ""
		if opts.Thinking && !taskOutput && (!drop || i > lastUser) {
			b.WriteString(t.ReasoningContent + ThinkClose)
		}
		b.WriteString(t.Content)
		if len(t.ToolCalls) > 0 {
			s, err := renderToolCalls(t.ToolCalls)
			if err != nil {
				return err
			}
			b.WriteString(s)
		}
		b.WriteString(EOS)
	}
	// Only a turn that is last or followed by an assistant or reminder turn gets a suffix.
	if i+1 < len(turns) && turns[i+1].Role != "assistant" && turns[i+1].Role != "latest_reminder" {
		return nil
	}
	switch {
	case t.Task == "action":
		b.WriteString(AssistantTag + thinkToken(opts.Thinking) + TaskTokens[t.Task])
	case t.Task != "":
		b.WriteString(TaskTokens[t.Task])
	case t.Role == "user" || t.Role == "developer":
		b.WriteString(AssistantTag + thinkToken(opts.Thinking && (!drop || i >= lastUser)))
	}
	return nil
}

func thinkToken(think bool) string {
	if think {
		return ThinkOpen
	}
	return ThinkClose
}

// writeBlocks appends a system/developer turn's tools and response-format
// blocks, each after "\n\n" (also after empty content, as in the Python).
func writeBlocks(b *strings.Builder, m Message) error {
	if len(m.Tools) > 0 {
		schemas := make([]string, len(m.Tools))
		for i, t := range m.Tools {
			v, err := parsePy(t)
			if err != nil {
				return fmt.Errorf("tool %d: %w", i, err)
			}
			if fn := v.get("function"); fn != nil { // tools_from_openai_format
				v = fn
			}
			schemas[i] = v.String(false)
		}
		b.WriteString("\n\n" + toolsHead + strings.Join(schemas, "\n") + toolsTail)
	}
	if len(m.ResponseFormat) > 0 {
		v, err := parsePy(m.ResponseFormat)
		if err != nil {
			return fmt.Errorf("response_format: %w", err)
		}
		if v.truthy() { // `if response_format:` skips {} and null
			b.WriteString("\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" + v.String(false))
		}
	}
	return nil
}

// renderToolCalls writes the DSML block of an assistant turn.
func renderToolCalls(calls []ToolCall) (string, error) {
	invokes := make([]string, len(calls))
	for i, c := range calls {
		params, err := renderParams(c.Arguments)
		if err != nil {
			return "", fmt.Errorf("tool call %q: %w", c.Name, err)
		}
		invokes[i] = "<" + DSML + "invoke name=\"" + c.Name + "\">\n" + strings.Join(params, "\n") + "\n</" + DSML + "invoke>"
	}
	return "\n\n<" + DSML + "tool_calls>\n" + strings.Join(invokes, "\n") + "\n</" + DSML + "tool_calls>", nil
}

// renderParams is encode_arguments_to_dsml: one parameter per key of the
// arguments object as json.loads sees it (key order kept, a repeated key keeps
// its first place and its last value); strings raw, other values as json.dumps
// writes them. Text json.loads rejects becomes one string parameter named
// "arguments"; JSON that is not an object is an error (the Python raises).
func renderParams(args string) ([]string, error) {
	v, err := parsePy([]byte(args))
	if err != nil {
		return []string{dsmlParam("arguments", true, args)}, nil
	}
	if v.kind != '{' {
		return nil, fmt.Errorf("arguments %.40q are not a JSON object", args)
	}
	out := make([]string, len(v.keys))
	for i, k := range v.keys {
		if val := v.vals[i]; val.kind == 's' {
			out[i] = dsmlParam(k, true, val.text)
		} else {
			out[i] = dsmlParam(k, false, val.String(false))
		}
	}
	return out, nil
}

func dsmlParam(name string, isString bool, value string) string {
	return "<" + DSML + "parameter name=\"" + name + "\" string=\"" + strconv.FormatBool(isString) + "\">" + value + "</" + DSML + "parameter>"
}
