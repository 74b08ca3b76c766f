package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// feed pushes text in pieces of n bytes and collects the result.
func feed(p *OutputParser, text string, n int) (reasoning, content string, calls []ToolCall) {
	var r, c strings.Builder
	for i := 0; i < len(text); i += n {
		d := p.Push(text[i:min(i+n, len(text))])
		r.WriteString(d.Reasoning)
		c.WriteString(d.Content)
	}
	d, calls := p.Finish()
	r.WriteString(d.Reasoning)
	c.WriteString(d.Content)
	return r.String(), c.String(), calls
}

func TestOutputParser(t *testing.T) {
	call := "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n<｜DSML｜parameter name=\"flag\" string=\"false\">false</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"noop\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
	cases := []struct {
		name, text, reasoning, content string
		thinking                       bool
		calls                          []ToolCall
	}{
		{"chat content", "Hello there", "", "Hello there", false, nil},
		{"thinking split", "let me think</think>The answer", "let me think", "The answer", true, nil},
		{"truncated reasoning", "still thinking </thi", "still thinking </thi", "", true, nil},
		{"tool calls", "Checking." + call, "", "Checking.", false, []ToolCall{
			{Name: "get_weather", Arguments: `{"location":"Beijing","days":3,"flag":false}`}, {Name: "noop", Arguments: `{}`}}},
		{"thinking then tools", "r</think>" + call, "r", "", true, []ToolCall{
			{Name: "get_weather", Arguments: `{"location":"Beijing","days":3,"flag":false}`}, {Name: "noop", Arguments: `{}`}}},
		{"truncated tool block degrades to content", "x" + call[:60], "", "x" + call[:60], false, nil},
		{"garbage after block degrades", "x" + call + " more", "", "x" + call + " more", false, nil},
		{"near-marker text is content", "a\n\n<｜DSML｜tool", "", "a\n\n<｜DSML｜tool", false, nil},
	}
	for _, c := range cases {
		for _, n := range []int{1, 3, 1000} {
			r, got, calls := feed(NewOutputParser(c.thinking), c.text, n)
			if r != c.reasoning || got != c.content || len(calls) != len(c.calls) {
				t.Errorf("%s/%d: reasoning %q content %q calls %v", c.name, n, r, got, calls)
				continue
			}
			for i := range calls {
				if calls[i] != c.calls[i] {
					t.Errorf("%s/%d: call %d = %+v, want %+v", c.name, n, i, calls[i], c.calls[i])
				}
			}
		}
	}
}

// The encoder's DSML rendering parses back to the same calls.
func TestToolCallRoundTrip(t *testing.T) {
	calls := []ToolCall{{Name: "f", Arguments: `{"s":"a \"q\" <b>","n":1.5,"o":{"k":[1,2]}}`}}
	block, err := renderToolCalls(calls)
	if err != nil {
		t.Fatal(err)
	}
	_, _, got := feed(NewOutputParser(false), block, 5)
	if len(got) != 1 || got[0].Name != "f" {
		t.Fatalf("parsed %v", got)
	}
	var a, b any
	json.Unmarshal([]byte(calls[0].Arguments), &a)
	if err := json.Unmarshal([]byte(got[0].Arguments), &b); err != nil {
		t.Fatal(err)
	}
	if ja, _ := json.Marshal(a); string(ja) != func() string { jb, _ := json.Marshal(b); return string(jb) }() {
		t.Errorf("arguments %s, want %s", got[0].Arguments, calls[0].Arguments)
	}
}

func FuzzOutputParser(f *testing.F) {
	f.Add("a</think>b\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"x\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", true, 3)
	f.Add("plain text", false, 1)
	f.Fuzz(func(t *testing.T, text string, thinking bool, n int) {
		n = 1 + (n%16+16)%16
		r, c, calls := feed(NewOutputParser(thinking), text, n)
		if len(calls) == 0 && r+c != strings.Replace(text, ThinkClose, "", boolInt(thinking)) {
			t.Fatalf("text lost: %q -> %q + %q", text, r, c)
		}
		for _, call := range calls {
			if !json.Valid([]byte(call.Arguments)) {
				t.Fatalf("invalid arguments %q", call.Arguments)
			}
		}
		_ = utf8.ValidString(c)
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
