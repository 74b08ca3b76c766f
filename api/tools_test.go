package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/tokenizer"
)

const weatherTool = `{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"}}}}}`

func TestRenderChatTools(t *testing.T) {
	msgs := []chatMessage{
		{Role: "user", Content: json.RawMessage(`"Weather in Paris?"`)},
		{Role: "assistant", ToolCalls: []toolCall{{ID: "c1", Type: "function"}}},
		{Role: "tool", ToolCallID: "c1", Content: json.RawMessage(`"sunny"`)},
	}
	msgs[1].ToolCalls[0].Function.Name, msgs[1].ToolCalls[0].Function.Arguments = "get_weather", `{"location":"Paris"}`
	got, err := renderChat(msgs, []json.RawMessage{json.RawMessage(weatherTool)}, tokenizer.ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Tools\n", `{"name": "get_weather", "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}`,
		"<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\" string=\"true\">Paris</｜DSML｜parameter>",
		"<｜User｜><tool_result>sunny</tool_result><｜Assistant｜></think>",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("prompt lacks %q:\n%s", want, got)
		}
	}
}

func TestToolsRequests(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	msg := `"messages":[{"role":"user","content":"Weather?"}],"max_tokens":3`
	for _, c := range []struct {
		name, body string
		status     int
		param      string
	}{
		{"tools offered", `{"model":"m",` + msg + `,"tools":[` + weatherTool + `],"tool_choice":"auto"}`, 200, ""},
		{"tool_choice none", `{"model":"m",` + msg + `,"tools":[` + weatherTool + `],"tool_choice":"none"}`, 200, ""},
		{"json schema", `{"model":"m",` + msg + `,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}}}`, 200, ""},
		{"bad tool", `{"model":"m",` + msg + `,"tools":[{"type":"function"}]}`, 400, "tools[0]"},
		{"bad response_format", `{"model":"m",` + msg + `,"response_format":{"type":"xml"}}`, 400, "response_format"},
		{"tool_choice required", `{"model":"m",` + msg + `,"tools":[` + weatherTool + `],"tool_choice":"required"}`, 200, ""},
		{"tool_choice named, streamed", `{"model":"m",` + msg + `,"stream":true,"tools":[` + weatherTool + `],"tool_choice":{"type":"function","function":{"name":"get_weather"}}}`, 200, ""},
		{"tool_choice named unknown", `{"model":"m",` + msg + `,"tools":[` + weatherTool + `],"tool_choice":{"type":"function","function":{"name":"get_time"}}}`, 400, "tool_choice"},
		{"tool_choice unknown string", `{"model":"m",` + msg + `,"tools":[` + weatherTool + `],"tool_choice":"always"}`, 400, "tool_choice"},
		{"tool_choice wrong type", `{"model":"m",` + msg + `,"tools":[` + weatherTool + `],"tool_choice":5}`, 400, "tool_choice"},
		{"tool_choice object without name", `{"model":"m",` + msg + `,"tools":[` + weatherTool + `],"tool_choice":{"type":"function"}}`, 400, "tool_choice"},
		{"tool_choice required without tools", `{"model":"m",` + msg + `,"tool_choice":"required"}`, 400, "tool_choice"},
		{"tool_choice named without tools", `{"model":"m",` + msg + `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}}`, 400, "tool_choice"},
	} {
		resp, body := post(t, srv, "/v1/chat/completions", c.body, nil)
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d: %s", c.name, resp.StatusCode, c.status, body)
			continue
		}
		if c.param != "" && !strings.Contains(string(body), `"param":"`+c.param+`"`) {
			t.Errorf("%s: %s lacks param %s", c.name, body, c.param)
		}
	}
}

// TestActiveTools checks which tools each tool_choice renders.
func TestActiveTools(t *testing.T) {
	const timeTool = `{"type":"function","function":{"name":"get_time"}}`
	tools := []json.RawMessage{json.RawMessage(weatherTool), json.RawMessage(timeTool)}
	for _, tc := range []struct {
		choice string
		want   []string
	}{
		{``, []string{weatherTool, timeTool}},
		{`null`, []string{weatherTool, timeTool}},
		{`"auto"`, []string{weatherTool, timeTool}},
		{`"required"`, []string{weatherTool, timeTool}},
		{`"none"`, nil},
		{`{"type":"function","function":{"name":"get_time"}}`, []string{timeTool}},
	} {
		r := chatRequest{Tools: tools, ToolChoice: json.RawMessage(tc.choice)}
		got, err := r.activeTools()
		if err != nil {
			t.Errorf("tool_choice %s: %v", tc.choice, err)
			continue
		}
		var names []string
		for _, g := range got {
			names = append(names, string(g))
		}
		if strings.Join(names, "|") != strings.Join(tc.want, "|") {
			t.Errorf("tool_choice %s: tools %q, want %q", tc.choice, names, tc.want)
		}
	}
}
