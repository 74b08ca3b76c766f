package tokenizer

import (
	"encoding/json"
	"sort"
)

// turn is a message after encoding_dsv4.py's preprocessing: user turns carry
// their text and tool results as parts (merge_tool_messages' content_blocks).
type turn struct {
	Message
	parts []part
}

type part struct {
	text   string
	result bool   // a <tool_result> block
	callID string // the call a result answers
}

// attachRequestTools puts request-level tools and response format on the
// leading system message, inserting an empty one when the conversation does
// not start with a system message (how vLLM's DeepSeek-V4 tokenizer feeds
// tools to encode_messages). The caller's slice is not modified.
func attachRequestTools(msgs []Message, tools []json.RawMessage, format json.RawMessage) []Message {
	if len(tools) == 0 && len(format) == 0 {
		return msgs
	}
	var out []Message
	if msgs[0].Role == "system" {
		out = append([]Message(nil), msgs...)
	} else {
		out = append([]Message{{Role: "system"}}, msgs...)
	}
	if len(tools) > 0 {
		out[0].Tools = tools
	}
	if len(format) > 0 {
		out[0].ResponseFormat = format
	}
	return out
}

// mergeTurns follows merge_tool_messages: a tool result joins the user turn
// right before it (or starts one), and a user message joins a preceding user
// turn unless that turn has a task. Only Content and Task of a user message
// survive, as in the Python.
func mergeTurns(msgs []Message) []turn {
	var out []turn
	for _, m := range msgs {
		last := len(out) - 1
		switch m.Role {
		case "tool":
			p := part{text: m.Content, result: true, callID: m.ToolCallID}
			if last >= 0 && out[last].Role == "user" {
				out[last].parts = append(out[last].parts, p)
			} else {
				out = append(out, turn{Message: Message{Role: "user"}, parts: []part{p}})
			}
		case "user":
			p := part{text: m.Content}
			if last >= 0 && out[last].Role == "user" && out[last].Task == "" {
				out[last].parts = append(out[last].parts, p)
			} else {
				out = append(out, turn{Message: Message{Role: "user", Content: m.Content, Task: m.Task}, parts: []part{p}})
			}
		default:
			out = append(out, turn{Message: m})
		}
	}
	return out
}

// sortToolResults follows sort_tool_results_by_call_order: within a user turn
// with several results, results are stably ordered by their call's position
// in the most recent assistant turn that made calls; unknown ids rank 0.
// Text parts keep their places.
func sortToolResults(turns []turn) {
	var order map[string]int
	for i := range turns {
		t := &turns[i]
		switch {
		case t.Role == "assistant" && len(t.ToolCalls) > 0:
			order = map[string]int{}
			for j, c := range t.ToolCalls {
				if c.ID != "" {
					order[c.ID] = j
				}
			}
		case t.Role == "user":
			var slots []int
			for j, p := range t.parts {
				if p.result {
					slots = append(slots, j)
				}
			}
			if len(slots) < 2 || len(order) == 0 {
				continue
			}
			res := make([]part, len(slots))
			for k, j := range slots {
				res[k] = t.parts[j]
			}
			sort.SliceStable(res, func(a, b int) bool { return order[res[a].callID] < order[res[b].callID] })
			for k, j := range slots {
				t.parts[j] = res[k]
			}
		}
	}
}

// lastUserIndex is find_last_user_index: the last user or developer turn.
func lastUserIndex(turns []turn) int {
	for i := len(turns) - 1; i >= 0; i-- {
		if r := turns[i].Role; r == "user" || r == "developer" {
			return i
		}
	}
	return -1
}

// dropThinking is _drop_thinking_messages: before the last user/developer
// turn, assistant turns lose their reasoning and developer turns are removed.
func dropThinking(turns []turn) []turn {
	last := lastUserIndex(turns)
	var out []turn
	for i, t := range turns {
		switch {
		case t.Role == "user" || t.Role == "system" || t.Role == "latest_reminder" || i >= last:
			out = append(out, t)
		case t.Role == "assistant":
			t.ReasoningContent = ""
			out = append(out, t)
		}
	}
	return out
}
