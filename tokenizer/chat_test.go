package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"
)

// Spec Appendix A.4, second example: thinking mode, no tools, two user turns.
func TestEncodeChatDropsEarlierReasoning(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "Hello"},
		{Role: "assistant", Content: "Hi there! How can I help you?", ReasoningContent: "greeting"},
		{Role: "user", Content: "What is the capital of France?"},
		{Role: "assistant", Content: "The capital of France is Paris.", ReasoningContent: "The user asks about the capital of France. It is Paris."},
	}
	got, err := EncodeChat(msgs, nil, ChatOptions{Thinking: true})
	if err != nil {
		t.Fatal(err)
	}
	want := "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>Hello<｜Assistant｜></think>Hi there! How can I help you?<｜end▁of▁sentence｜><｜User｜>What is the capital of France?<｜Assistant｜><think>The user asks about the capital of France. It is Paris.</think>The capital of France is Paris.<｜end▁of▁sentence｜>"
	if got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}

// Spec Appendix A.4, first example: thinking mode, one tool round trip.
func TestEncodeChatToolRoundTrip(t *testing.T) {
	tool := json.RawMessage(`{"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":{"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]}}}`)
	msgs := []Message{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "What's the weather in Beijing?"},
		{Role: "assistant", ReasoningContent: "The user wants to know the weather in Beijing. I should use the get_weather tool.",
			ToolCalls: []ToolCall{{ID: "c1", Name: "get_weather", Arguments: `{"location": "Beijing", "unit": "celsius"}`}}},
		{Role: "tool", ToolCallID: "c1", Content: `{"temperature": 22, "condition": "sunny", "humidity": 45}`},
		{Role: "assistant", ReasoningContent: "Got the weather data. Let me format a nice response.", Content: "The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity."},
	}
	got, err := EncodeChat(msgs, []json.RawMessage{tool}, ChatOptions{Thinking: true})
	if err != nil {
		t.Fatal(err)
	}
	schema := `{"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object", "properties": {"location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}`
	want := "<｜begin▁of▁sentence｜>You are a helpful assistant.\n\n" + toolsHead + schema + toolsTail +
		"<｜User｜>What's the weather in Beijing?<｜Assistant｜><think>The user wants to know the weather in Beijing. I should use the get_weather tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}</tool_result><｜Assistant｜><think>Got the weather data. Let me format a nice response.</think>The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity.<｜end▁of▁sentence｜>"
	if got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	if !strings.HasPrefix(toolsHead, "## Tools\n\nYou have access to a set of tools") || !strings.HasSuffix(toolsTail, "invoke tool calls.\n") {
		t.Error("tools block frame changed")
	}
}

func TestEncodeChatModes(t *testing.T) {
	user := []Message{{Role: "user", Content: "Hi"}}
	cases := []struct {
		name string
		msgs []Message
		opts ChatOptions
		want string
	}{
		{"chat mode", user, ChatOptions{}, BOS + "<｜User｜>Hi<｜Assistant｜></think>"},
		{"thinking high", user, ChatOptions{Thinking: true, ReasoningEffort: "high"}, BOS + "<｜User｜>Hi<｜Assistant｜><think>"},
		{"thinking max", user, ChatOptions{Thinking: true, ReasoningEffort: "max"}, BOS + maxEffortPrefix + "<｜User｜>Hi<｜Assistant｜><think>"},
		{"max ignored in chat mode", user, ChatOptions{ReasoningEffort: "max"}, BOS + "<｜User｜>Hi<｜Assistant｜></think>"},
		{"response format", []Message{{Role: "system", Content: "S"}, {Role: "user", Content: "Q"}},
			ChatOptions{ResponseFormat: json.RawMessage(`{"type": "object", "properties": {"a": {"type": "string"}}}`)},
			BOS + "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}}<｜User｜>Q<｜Assistant｜></think>"},
		{"latest reminder", []Message{{Role: "user", Content: "Q"}, {Role: "latest_reminder", Content: "R"}},
			ChatOptions{}, BOS + "<｜User｜>Q<｜Assistant｜></think><｜latest_reminder｜>R"},
		{"two tool results follow the call order", []Message{
			{Role: "user", Content: "Q"},
			{Role: "assistant", ToolCalls: []ToolCall{{ID: "a", Name: "f", Arguments: `{"n": 1, "x": [1, "é"]}`}, {ID: "b", Name: "g", Arguments: `{}`}}},
			{Role: "tool", ToolCallID: "b", Content: "B"}, {Role: "tool", ToolCallID: "a", Content: "A"},
		}, ChatOptions{}, BOS + "<｜User｜>Q<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"false\">1</｜DSML｜parameter>\n<｜DSML｜parameter name=\"x\" string=\"false\">[1, \"é\"]</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>A</tool_result>\n\n<tool_result>B</tool_result><｜Assistant｜></think>"},
	}
	for _, c := range cases {
		got, err := EncodeChat(c.msgs, nil, c.opts)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
	// encode_arguments_to_dsml: text json.loads rejects becomes one raw "arguments" string parameter.
	if got, _ := EncodeChat([]Message{{Role: "assistant", ToolCalls: []ToolCall{{Name: "f", Arguments: "[1"}}}}, nil, ChatOptions{}); !strings.Contains(got, `<｜DSML｜parameter name="arguments" string="true">[1</｜DSML｜parameter>`) {
		t.Errorf("invalid-JSON arguments rendered as %q", got)
	}
	// JSON that is not an object makes the Python's arguments.items() raise.
	for _, args := range []string{"[1]", "null", `"s"`, "5"} {
		if got, err := EncodeChat([]Message{{Role: "assistant", ToolCalls: []ToolCall{{Name: "f", Arguments: args}}}}, nil, ChatOptions{}); err == nil {
			t.Errorf("arguments %s accepted: %q", args, got)
		}
	}
	for _, bad := range [][]Message{nil, {{Role: "wizard", Content: "x"}}} {
		if _, err := EncodeChat(bad, nil, ChatOptions{}); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestPyJSON(t *testing.T) {
	for _, c := range []struct{ in, want, compact string }{
		{`{"b":1,"a":[true,null,"x<>&\u2028"],"c":{"d":"é\n\"q\""}}`, `{"b": 1, "a": [true, null, "x<>&` + "\u2028" + `"], "c": {"d": "é\n\"q\""}}`, `{"b":1,"a":[true,null,"x<>&` + "\u2028" + `"],"c":{"d":"é\n\"q\""}}`},
		{`[]`, `[]`, `[]`},
		{`"\u0001"`, `"\u0001"`, `"\u0001"`},
		// json.loads then json.dumps: ints print as ints, anything with a fraction or
		// exponent as a Python float repr; a repeated key keeps its first place, last value.
		{`1.50`, `1.5`, `1.5`},
		{`[-0, -0.0, 1e3, 2.5E+3, 1E-7, 0.0001, 0.00001, 1e15, 1e16, 1.5e300, 1e400, -1e400]`,
			`[0, -0.0, 1000.0, 2500.0, 1e-07, 0.0001, 1e-05, 1000000000000000.0, 1e+16, 1.5e+300, Infinity, -Infinity]`,
			`[0,-0.0,1000.0,2500.0,1e-07,0.0001,1e-05,1000000000000000.0,1e+16,1.5e+300,Infinity,-Infinity]`},
		{`123456789012345678901234567890`, `123456789012345678901234567890`, `123456789012345678901234567890`},
		{`{"a":1,"b":2,"a":{"c":3,"c":4}}`, `{"a": {"c": 4}, "b": 2}`, `{"a":{"c":4},"b":2}`},
	} {
		if got, err := PyJSON([]byte(c.in), false); err != nil || got != c.want {
			t.Errorf("PyJSON(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
		if got, err := PyJSON([]byte(c.in), true); err != nil || got != c.compact {
			t.Errorf("compact PyJSON(%s) = %s, %v; want %s", c.in, got, err, c.compact)
		}
	}
	for _, bad := range []string{`{`, `{"a":1} x`, `[1,]`, ``} {
		if _, err := PyJSON([]byte(bad), false); err == nil {
			t.Errorf("PyJSON(%q) accepted", bad)
		}
	}
}
