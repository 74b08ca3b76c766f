package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"
)

// Expected strings below are hand-traced through encoding_dsv4.py (April V4
// release): encode_messages -> merge_tool_messages ->
// sort_tool_results_by_call_order -> _drop_thinking_messages -> render_message.

const (
	toolF       = `{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"number","minimum":0.50}}}}}`
	toolFSchema = `{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "number", "minimum": 0.5}}}}`
	eosT        = "<｜end▁of▁sentence｜>"
)

// toolsBlockF is "\n\n" + render_tools([f]) as system/developer append it.
var toolsBlockF = "\n\n" + toolsHead + toolFSchema + toolsTail

// TOOLS_TEMPLATE written out line by line (dsml_token, thinking tokens filled in).
func TestToolsBlockText(t *testing.T) {
	want := strings.Join([]string{
		"## Tools",
		"",
		`You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:`,
		"",
		"<｜DSML｜tool_calls>",
		`<｜DSML｜invoke name="$TOOL_NAME">`,
		`<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>`,
		"...",
		"</｜DSML｜invoke>",
		`<｜DSML｜invoke name="$TOOL_NAME2">`,
		"...",
		"</｜DSML｜invoke>",
		"</｜DSML｜tool_calls>",
		"",
		"String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.",
		"",
		"If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.",
		"",
		"Otherwise, output directly after </think> with tool calls or final response.",
		"",
		"### Available Tool Schemas",
		"",
		"{S}",
		"",
		"You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.",
		"",
	}, "\n")
	if got := toolsHead + "{S}" + toolsTail; got != want {
		t.Errorf("tools block\n got %q\nwant %q", got, want)
	}
}

func TestEncodeChatDeveloperAndTools(t *testing.T) {
	tools := []json.RawMessage{json.RawMessage(toolF)}
	devWithTools := Message{Role: "developer", Content: "D", Tools: tools}
	cases := []struct {
		name  string
		msgs  []Message
		tools []json.RawMessage
		opts  ChatOptions
		want  string
	}{
		// render_message developer branch: USER_SP_TOKEN + content + "\n\n" + render_tools,
		// then the user/developer generation suffix.
		{"developer carries tools", []Message{devWithTools}, nil, ChatOptions{Thinking: true},
			BOS + "<｜User｜>D" + toolsBlockF + "<｜Assistant｜><think>"},
		// Request tools go on a leading system message (vLLM inserts {"role": "system"});
		// the system branch writes (content or "") + "\n\n" + render_tools.
		{"request tools without system", []Message{{Role: "user", Content: "Q"}}, tools, ChatOptions{},
			BOS + toolsBlockF + "<｜User｜>Q<｜Assistant｜></think>"},
		{"request tools on system", []Message{{Role: "system", Content: "S"}, {Role: "developer", Content: "D"}}, tools, ChatOptions{},
			BOS + "S" + toolsBlockF + "<｜User｜>D<｜Assistant｜></think>"},
		{"empty system keeps the separator", []Message{{Role: "system"}, {Role: "user", Content: "Q"}}, tools, ChatOptions{},
			BOS + toolsBlockF + "<｜User｜>Q<｜Assistant｜></think>"},
		// A system message that is not first does not get the request tools.
		{"system not first", []Message{{Role: "user", Content: "Q"}, {Role: "system", Content: "S"}}, tools, ChatOptions{},
			BOS + toolsBlockF + "<｜User｜>QS"},
		// _drop_thinking_messages removes a developer turn before the last user turn;
		// the assistant turn then renders at index 0 without reasoning (0 < last_user_idx 1).
		{"earlier developer dropped", []Message{{Role: "developer", Content: "D1"}, {Role: "assistant", Content: "A1", ReasoningContent: "r"}, {Role: "user", Content: "U"}}, nil, ChatOptions{Thinking: true},
			BOS + "A1" + eosT + "<｜User｜>U<｜Assistant｜><think>"},
		// With tools on the developer turn effective_drop_thinking is False: nothing is
		// dropped, every generation suffix is <think>, every reasoning is kept.
		{"developer tools keep everything", []Message{devWithTools, {Role: "assistant", Content: "A1", ReasoningContent: "r"}, {Role: "user", Content: "U"}}, nil, ChatOptions{Thinking: true},
			BOS + "<｜User｜>D" + toolsBlockF + "<｜Assistant｜><think>r</think>A1" + eosT + "<｜User｜>U<｜Assistant｜><think>"},
		// Chat mode never drops: the developer turn stays, its suffix is </think>.
		{"chat mode keeps developer", []Message{{Role: "developer", Content: "D1"}, {Role: "assistant", Content: "A1", ReasoningContent: "r"}, {Role: "user", Content: "U"}}, nil, ChatOptions{},
			BOS + "<｜User｜>D1<｜Assistant｜></think>A1" + eosT + "<｜User｜>U<｜Assistant｜></think>"},
		// response_format goes after the tools block, each after "\n\n"; `if response_format:` skips {}.
		{"developer response format", []Message{{Role: "developer", Content: "D", Tools: tools, ResponseFormat: json.RawMessage(`{"type":"object"}`)}}, nil, ChatOptions{},
			BOS + "<｜User｜>D" + toolsBlockF + "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{\"type\": \"object\"}<｜Assistant｜></think>"},
		{"empty response format skipped", []Message{{Role: "system", Content: "S", ResponseFormat: json.RawMessage(`{}`)}, {Role: "user", Content: "Q"}}, nil, ChatOptions{},
			BOS + "S<｜User｜>Q<｜Assistant｜></think>"},
	}
	for _, c := range cases {
		got, err := EncodeChat(c.msgs, c.tools, c.opts)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
	// `assert content` in the developer branch.
	if _, err := EncodeChat([]Message{{Role: "developer", Tools: tools}}, nil, ChatOptions{}); err == nil {
		t.Error("developer message without content accepted")
	}
}

func TestEncodeChatTaskTokens(t *testing.T) {
	q := func(task string) Message { return Message{Role: "user", Content: "Q", Task: task} }
	cases := []struct {
		name string
		msgs []Message
		opts ChatOptions
		want string
	}{
		// Non-action task: the task token right after the message, no <｜Assistant｜>.
		{"query", []Message{q("query")}, ChatOptions{}, BOS + "<｜User｜>Q<｜query｜>"},
		{"read_url", []Message{q("read_url")}, ChatOptions{Thinking: true}, BOS + "<｜User｜>Q<｜read_url｜>"},
		// Action task: ASSISTANT_SP_TOKEN + (</think> in chat, <think> in thinking) + <｜action｜>.
		{"action chat", []Message{q("action")}, ChatOptions{}, BOS + "<｜User｜>Q<｜Assistant｜></think><｜action｜>"},
		{"action thinking", []Message{q("action")}, ChatOptions{Thinking: true}, BOS + "<｜User｜>Q<｜Assistant｜><think><｜action｜>"},
		// Title: the token follows the last assistant turn's EOS.
		{"title", []Message{{Role: "user", Content: "Q"}, {Role: "assistant", Content: "A", Task: "title"}}, ChatOptions{},
			BOS + "<｜User｜>Q<｜Assistant｜></think>A" + eosT + "<｜title｜>"},
		// prev_has_task: the answer to a task turn has no reasoning even in thinking mode.
		{"task answer", []Message{q("authority"), {Role: "assistant", Content: "yes", ReasoningContent: "r"}}, ChatOptions{Thinking: true},
			BOS + "<｜User｜>Q<｜authority｜>yes" + eosT},
		// merge_tool_messages does not merge a user message into a task turn; a task turn
		// followed by a user turn gets no suffix at all.
		{"task turn not merged", []Message{q("domain"), {Role: "user", Content: "b"}}, ChatOptions{},
			BOS + "<｜User｜>Q<｜User｜>b<｜Assistant｜></think>"},
		// A user message merged into the previous user turn loses its own task.
		{"merged user drops task", []Message{{Role: "user", Content: "a"}, q("query")}, ChatOptions{},
			BOS + "<｜User｜>a\n\nQ<｜Assistant｜></think>"},
	}
	for _, c := range cases {
		got, err := EncodeChat(c.msgs, nil, c.opts)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
	if _, err := EncodeChat([]Message{q("summarize")}, nil, ChatOptions{}); err == nil {
		t.Error("unknown task accepted")
	}
}

func TestEncodeChatReasoningEffort(t *testing.T) {
	// REASONING_EFFORT_MAX, written out; added only at index 0, in thinking mode, for "max".
	maxText := "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n" +
		"You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n" +
		"Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
	user := []Message{{Role: "user", Content: "Hi"}}
	sys := []Message{{Role: "system", Content: "S"}, {Role: "user", Content: "Hi"}}
	tools := []json.RawMessage{json.RawMessage(toolF)}
	cases := []struct {
		name   string
		msgs   []Message
		tools  []json.RawMessage
		effort string
		think  bool
		want   string
	}{
		{"max", user, nil, "max", true, BOS + maxText + "<｜User｜>Hi<｜Assistant｜><think>"},
		{"max before system content", sys, nil, "max", true, BOS + maxText + "S<｜User｜>Hi<｜Assistant｜><think>"},
		// The inserted tools system message is index 0, so the prefix precedes "\n\n## Tools".
		{"max before tools", user, tools, "max", true, BOS + maxText + toolsBlockF + "<｜User｜>Hi<｜Assistant｜><think>"},
		{"high adds nothing", user, nil, "high", true, BOS + "<｜User｜>Hi<｜Assistant｜><think>"},
		{"none adds nothing", user, nil, "", true, BOS + "<｜User｜>Hi<｜Assistant｜><think>"},
		{"max ignored in chat mode", user, nil, "max", false, BOS + "<｜User｜>Hi<｜Assistant｜></think>"},
	}
	for _, c := range cases {
		got, err := EncodeChat(c.msgs, c.tools, ChatOptions{Thinking: c.think, ReasoningEffort: c.effort})
		if err != nil || got != c.want {
			t.Errorf("%s:\n got %q (%v)\nwant %q", c.name, got, err, c.want)
		}
	}
	// assert reasoning_effort in ['max', None, 'high'].
	for _, bad := range []string{"low", "medium", "MAX"} {
		if _, err := EncodeChat(user, nil, ChatOptions{Thinking: true, ReasoningEffort: bad}); err == nil {
			t.Errorf("reasoning effort %q accepted", bad)
		}
	}
}

// Three user turns, two tool rounds (the first with two calls whose results
// arrive out of order).
func TestEncodeChatThreeTurnsTwoToolRounds(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: "S"},
		{Role: "user", Content: "U1"},
		{Role: "assistant", ReasoningContent: "R1", ToolCalls: []ToolCall{{ID: "a", Name: "f", Arguments: `{"x": 1}`}, {ID: "b", Name: "g", Arguments: `{"y": "s"}`}}},
		{Role: "tool", ToolCallID: "b", Content: "B1"},
		{Role: "tool", ToolCallID: "a", Content: "A1"},
		{Role: "assistant", ReasoningContent: "R2", Content: "C2"},
		{Role: "user", Content: "U2"},
		{Role: "assistant", ReasoningContent: "R3", ToolCalls: []ToolCall{{ID: "c", Name: "f", Arguments: `{}`}}},
		{Role: "tool", ToolCallID: "c", Content: "T3"},
		{Role: "assistant", ReasoningContent: "R4", Content: "C4"},
		{Role: "user", Content: "U3"},
	}
	calls1 := "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
		"<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"y\" string=\"true\">s</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
	calls2 := "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
	// merge_tool_messages makes each tool run one user turn; sort_tool_results_by_call_order
	// puts A1 (call a, index 0) before B1.
	results1 := "<｜User｜><tool_result>A1</tool_result>\n\n<tool_result>B1</tool_result>"
	results2 := "<｜User｜><tool_result>T3</tool_result>"

	// Tools present: effective_drop_thinking is False, so every assistant turn keeps
	// "reasoning</think>" and every user-side suffix is <think>.
	withTools := BOS + "S" + toolsBlockF +
		"<｜User｜>U1<｜Assistant｜><think>R1</think>" + calls1 + eosT +
		results1 + "<｜Assistant｜><think>R2</think>C2" + eosT +
		"<｜User｜>U2<｜Assistant｜><think>R3</think>" + calls2 + eosT +
		results2 + "<｜Assistant｜><think>R4</think>C4" + eosT +
		"<｜User｜>U3<｜Assistant｜><think>"
	// No tools: reasoning before the last user turn (U3) is dropped and those turns'
	// suffixes are </think>; only the final suffix opens thinking.
	noTools := BOS + "S" +
		"<｜User｜>U1<｜Assistant｜></think>" + calls1 + eosT +
		results1 + "<｜Assistant｜></think>C2" + eosT +
		"<｜User｜>U2<｜Assistant｜></think>" + calls2 + eosT +
		results2 + "<｜Assistant｜></think>C4" + eosT +
		"<｜User｜>U3<｜Assistant｜><think>"
	// drop_thinking=False without tools renders like the tools case minus the tools block.
	keep := strings.Replace(withTools, toolsBlockF, "", 1)
	for _, c := range []struct {
		name  string
		tools []json.RawMessage
		opts  ChatOptions
		want  string
	}{
		{"tools", []json.RawMessage{json.RawMessage(toolF)}, ChatOptions{Thinking: true}, withTools},
		{"no tools", nil, ChatOptions{Thinking: true}, noTools},
		{"keep thinking", nil, ChatOptions{Thinking: true, KeepThinking: true}, keep},
	} {
		got, err := EncodeChat(msgs, c.tools, c.opts)
		if err != nil || got != c.want {
			t.Errorf("%s:\n got %q (%v)\nwant %q", c.name, got, err, c.want)
		}
	}
}

func TestEncodeChatToolResultMerging(t *testing.T) {
	call := func(ids ...string) Message {
		m := Message{Role: "assistant"}
		for _, id := range ids {
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: id, Name: "f", Arguments: "{}"})
		}
		return m
	}
	inv := "<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>"
	block := func(n int) string {
		return "\n\n<｜DSML｜tool_calls>\n" + strings.Repeat(inv+"\n", n-1) + inv + "\n</｜DSML｜tool_calls>" + eosT
	}
	cases := []struct {
		name string
		msgs []Message
		want string
	}{
		// A user message after tool results joins their turn (merge_tool_messages appends a text block).
		{"user text joins results", []Message{{Role: "user", Content: "Q"}, call("a"), {Role: "tool", ToolCallID: "a", Content: "A"}, {Role: "user", Content: "more"}},
			BOS + "<｜User｜>Q<｜Assistant｜></think>" + block(1) + "<｜User｜><tool_result>A</tool_result>\n\nmore<｜Assistant｜></think>"},
		// Consecutive user messages form one turn joined by "\n\n".
		{"consecutive users", []Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}},
			BOS + "<｜User｜>a\n\nb<｜Assistant｜></think>"},
		// Unknown ids sort as call index 0 (dict.get(id, 0)); Python's sort is stable.
		{"unknown id ranks first", []Message{{Role: "user", Content: "Q"}, call("x", "y"),
			{Role: "tool", ToolCallID: "y", Content: "Y"}, {Role: "tool", ToolCallID: "zz", Content: "Z"}, {Role: "tool", ToolCallID: "x", Content: "X"}},
			BOS + "<｜User｜>Q<｜Assistant｜></think>" + block(2) + "<｜User｜><tool_result>Z</tool_result>\n\n<tool_result>X</tool_result>\n\n<tool_result>Y</tool_result><｜Assistant｜></think>"},
		// The order comes from the last assistant turn that made calls; one without calls
		// does not reset it.
		{"order survives a call-less turn", []Message{{Role: "user", Content: "Q"}, call("x", "y"), {Role: "assistant", Content: "c"},
			{Role: "tool", ToolCallID: "y", Content: "Y"}, {Role: "tool", ToolCallID: "x", Content: "X"}},
			BOS + "<｜User｜>Q<｜Assistant｜></think>" + block(2) + "c" + eosT + "<｜User｜><tool_result>X</tool_result>\n\n<tool_result>Y</tool_result><｜Assistant｜></think>"},
		// Only result blocks move; a text block keeps its slot.
		{"text keeps its slot", []Message{call("x", "y"), {Role: "tool", ToolCallID: "y", Content: "Y"}, {Role: "user", Content: "t"}, {Role: "tool", ToolCallID: "x", Content: "X"}},
			BOS + block(2) + "<｜User｜><tool_result>X</tool_result>\n\nt\n\n<tool_result>Y</tool_result><｜Assistant｜></think>"},
		// Repeated argument keys: json.loads keeps the first place and the last value.
		{"repeated argument key", []Message{{Role: "assistant", ToolCalls: []ToolCall{{Name: "f", Arguments: `{"a": 1, "b": 2.50, "a": [3]}`}}}},
			BOS + "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"false\">[3]</｜DSML｜parameter>\n<｜DSML｜parameter name=\"b\" string=\"false\">2.5</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + eosT},
	}
	for _, c := range cases {
		got, err := EncodeChat(c.msgs, nil, ChatOptions{})
		if err != nil || got != c.want {
			t.Errorf("%s:\n got %q (%v)\nwant %q", c.name, got, err, c.want)
		}
	}
}
