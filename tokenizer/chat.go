package tokenizer

import (
	"encoding/json"
	"fmt"
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
	ToolCallID       string // tool results: the call they answer
}

// ChatOptions select the V4 rendering mode.
type ChatOptions struct {
	Thinking        bool
	ReasoningEffort string          // "", "high" or "max"
	ResponseFormat  json.RawMessage // a JSON schema object, rendered into the system turn
	KeepThinking    bool            // keep earlier turns' reasoning (drop_thinking=False)
}

// EncodeChat renders a conversation as DeepSeek-V4's encoding_dsv4.py does
// (spec §10.2, Appendix A); the result ends with the generation prefix.
// tools are OpenAI tool objects ({"type":"function","function":{…}}) or bare
// function objects; their key order is kept.
func EncodeChat(msgs []Message, tools []json.RawMessage, opts ChatOptions) (string, error) {
	if len(msgs) == 0 {
		return "", fmt.Errorf("chat: no messages")
	}
	var b strings.Builder
	b.WriteString(BOS)
	if opts.Thinking && opts.ReasoningEffort == "max" {
		b.WriteString(maxEffortPrefix)
	}
	sys, err := systemBlocks(tools, opts.ResponseFormat)
	if err != nil {
		return "", err
	}
	// Reasoning of turns before the last user message is dropped, unless tools are in play.
	drop := !opts.KeepThinking && len(tools) == 0
	lastUser := -1
	for i, m := range msgs {
		if m.Role == "user" || m.Role == "developer" || m.Role == "tool" { // tool results render as a user turn
			lastUser = i
		}
	}
	hasSystem := false
	for _, m := range msgs {
		hasSystem = hasSystem || m.Role == "system"
	}
	if !hasSystem && sys != "" {
		b.WriteString(sys)
	}
	for i := 0; i < len(msgs); i++ {
		m := msgs[i]
		switch m.Role {
		case "system":
			b.WriteString(joinBlocks(m.Content, sys))
			sys = ""
		case "developer":
			b.WriteString(UserTag + m.Content)
		case "user":
			b.WriteString(UserTag + m.Content)
		case "tool":
			// Consecutive tool results form one user turn, in the calling turn's order.
			j := i
			for j < len(msgs) && msgs[j].Role == "tool" {
				j++
			}
			b.WriteString(UserTag + toolResults(msgs[i:j], previousCalls(msgs[:i])))
			i = j - 1
		case "latest_reminder":
			b.WriteString(LatestReminder + m.Content)
			continue
		case "assistant":
			keep := opts.Thinking && (!drop || i > lastUser)
			if keep {
				b.WriteString(m.ReasoningContent + ThinkClose)
			}
			b.WriteString(m.Content)
			if len(m.ToolCalls) > 0 {
				s, err := renderToolCalls(m.ToolCalls)
				if err != nil {
					return "", err
				}
				b.WriteString(s)
			}
			b.WriteString(EOS)
			continue
		default:
			return "", fmt.Errorf("chat: message %d: unknown role %q", i, m.Role)
		}
		if m.Role == "system" {
			continue
		}
		// A user-side turn followed by an assistant turn, a reminder, or nothing gets the generation prefix.
		next := ""
		if i+1 < len(msgs) {
			next = msgs[i+1].Role
		}
		if next == "" || next == "assistant" || next == "latest_reminder" {
			b.WriteString(AssistantTag)
			if opts.Thinking && (!drop || i >= lastUser) {
				b.WriteString(ThinkOpen)
			} else {
				b.WriteString(ThinkClose)
			}
		}
	}
	return b.String(), nil
}

func joinBlocks(content, blocks string) string {
	if blocks == "" {
		return content
	}
	if content == "" {
		return blocks
	}
	return content + "\n\n" + blocks
}

// systemBlocks renders the tools block and the response-format block.
func systemBlocks(tools []json.RawMessage, format json.RawMessage) (string, error) {
	var parts []string
	if len(tools) > 0 {
		schemas := make([]string, len(tools))
		for i, t := range tools {
			fn := t
			var wrapped struct {
				Type     string          `json:"type"`
				Function json.RawMessage `json:"function"`
			}
			if json.Unmarshal(t, &wrapped) == nil && len(wrapped.Function) > 0 {
				fn = wrapped.Function
			}
			s, err := PyJSON(fn, false)
			if err != nil {
				return "", fmt.Errorf("chat: tool %d: %w", i, err)
			}
			schemas[i] = s
		}
		parts = append(parts, toolsHead+strings.Join(schemas, "\n")+toolsTail)
	}
	if len(format) > 0 {
		s, err := PyJSON(format, false)
		if err != nil {
			return "", fmt.Errorf("chat: response_format: %w", err)
		}
		parts = append(parts, "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"+s)
	}
	return strings.Join(parts, "\n\n"), nil
}

func previousCalls(msgs []Message) []ToolCall {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "assistant" {
			return msgs[i].ToolCalls
		}
	}
	return nil
}

func toolResults(results []Message, calls []ToolCall) string {
	order := map[string]int{}
	for i, c := range calls {
		order[c.ID] = i
	}
	sorted := append([]Message(nil), results...)
	rank := func(m Message) int {
		if r, ok := order[m.ToolCallID]; ok {
			return r
		}
		return len(calls)
	}
	for i := 1; i < len(sorted); i++ { // stable insertion sort by call order
		for j := i; j > 0 && rank(sorted[j]) < rank(sorted[j-1]); j-- {
			sorted[j], sorted[j-1] = sorted[j-1], sorted[j]
		}
	}
	blocks := make([]string, len(sorted))
	for i, m := range sorted {
		blocks[i] = "<tool_result>" + m.Content + "</tool_result>"
	}
	return strings.Join(blocks, "\n\n")
}

// renderToolCalls writes the DSML block of an assistant turn.
func renderToolCalls(calls []ToolCall) (string, error) {
	invokes := make([]string, len(calls))
	for i, c := range calls {
		params, err := renderParams(c.Arguments)
		if err != nil {
			return "", fmt.Errorf("chat: tool call %q: %w", c.Name, err)
		}
		invokes[i] = "<" + DSML + "invoke name=\"" + c.Name + "\">\n" + strings.Join(params, "\n") + "\n</" + DSML + "invoke>"
	}
	return "\n\n<" + DSML + "tool_calls>\n" + strings.Join(invokes, "\n") + "\n</" + DSML + "tool_calls>", nil
}

// renderParams renders each argument in the object's own key order, values as
// json.dumps writes them. Like encoding_dsv4.py, arguments that are not a JSON
// object become one string parameter named "arguments" holding the raw text.
func renderParams(args string) ([]string, error) {
	var probe map[string]json.RawMessage
	if json.Unmarshal([]byte(args), &probe) != nil || probe == nil {
		return []string{"<" + DSML + "parameter name=\"arguments\" string=\"true\">" + args + "</" + DSML + "parameter>"}, nil
	}
	dec := json.NewDecoder(strings.NewReader(args))
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	var out []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			out = append(out, "<"+DSML+"parameter name=\""+k.(string)+"\" string=\"true\">"+s+"</"+DSML+"parameter>")
			continue
		}
		v, err := PyJSON(raw, false)
		if err != nil {
			return nil, err
		}
		out = append(out, "<"+DSML+"parameter name=\""+k.(string)+"\" string=\"false\">"+v+"</"+DSML+"parameter>")
	}
	return out, nil
}
