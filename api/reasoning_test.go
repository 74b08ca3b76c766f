package api

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestThinkingOptions checks every OpenAI reasoning_effort value and vLLM's
// chat_template_kwargs map onto V4's modes: off, high or max.
func TestThinkingOptions(t *testing.T) {
	str := func(s string) *string { return &s }
	yes, no := true, false
	cases := []struct {
		name     string
		effort   *string
		kw       *templateKwargs
		thinking bool
		level    string
		err      bool
	}{
		{"default", nil, nil, false, "", false},
		{"none", str("none"), nil, false, "", false},
		{"minimal", str("minimal"), nil, false, "", false},
		{"low", str("low"), nil, true, "high", false},
		{"medium", str("medium"), nil, true, "high", false},
		{"high", str("high"), nil, true, "high", false},
		{"xhigh", str("xhigh"), nil, true, "max", false},
		{"max", str("max"), nil, true, "max", false},
		{"unknown", str("extreme"), nil, false, "", true},
		{"kwargs thinking", nil, &templateKwargs{Thinking: &yes}, true, "", false},
		{"kwargs thinking off", nil, &templateKwargs{Thinking: &no}, false, "", false},
		{"kwargs effort", nil, &templateKwargs{Thinking: &yes, ReasoningEffort: str("max")}, true, "max", false},
		{"kwargs effort alone", nil, &templateKwargs{ReasoningEffort: str("high")}, true, "high", false},
		{"kwargs thinking off wins", str("max"), &templateKwargs{Thinking: &no}, false, "", false},
		{"field before kwargs", str("low"), &templateKwargs{ReasoningEffort: str("max")}, true, "high", false},
		{"none with kwargs thinking", str("none"), &templateKwargs{Thinking: &yes}, true, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			thinking, level, err := thinkingOptions(c.effort, c.kw)
			if (err != nil) != c.err || thinking != c.thinking || level != c.level {
				t.Errorf("got %v %q %v, want %v %q (error %v)", thinking, level, err, c.thinking, c.level, c.err)
			}
		})
	}
}

// TestReasoningEffortRequests checks the mode reaches the response: thinking
// requests get reasoning_content, none and minimal do not.
func TestReasoningEffortRequests(t *testing.T) {
	srv, _ := startServer(t, Config{}, 0)
	for _, c := range []struct {
		extra     string
		reasoning bool
	}{
		{`"reasoning_effort":"none"`, false},
		{`"reasoning_effort":"minimal"`, false},
		{`"reasoning_effort":"low"`, true},
		{`"reasoning_effort":"xhigh"`, true},
		{`"chat_template_kwargs":{"thinking":true,"reasoning_effort":"max"}`, true},
		{`"chat_template_kwargs":{"thinking":false}`, false},
	} {
		resp, body := post(t, srv, "/v1/chat/completions", `{"max_tokens":2,"temperature":0,`+c.extra+
			`,"messages":[{"role":"user","content":"hi"}]}`, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", c.extra, resp.StatusCode, body)
		}
		var out struct {
			Choices []struct {
				Message struct {
					ReasoningContent *string `json:"reasoning_content"`
				}
			}
		}
		if err := json.Unmarshal(body, &out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("%s: decode %s: %v", c.extra, body, err)
		}
		if got := out.Choices[0].Message.ReasoningContent != nil; got != c.reasoning {
			t.Errorf("%s: reasoning_content present %v, want %v", c.extra, got, c.reasoning)
		}
	}
}
