package tokenizer

import (
	"encoding/json"
	"strings"
)

const toolCallsOpen = "\n\n<" + DSML + "tool_calls>"

// Delta is the newly parsed text of one OutputParser step.
type Delta struct {
	Reasoning, Content string
}

// OutputParser splits generated text incrementally into reasoning (thinking
// mode: everything before the first </think>), content, and a trailing DSML
// tool-call block. Text that could still turn into a marker is held back until
// it is decided. Malformed tool-call markup is returned as plain content.
type OutputParser struct {
	reasoning bool   // still inside the reasoning part
	inTools   bool   // a tool-call block has started
	held      string // undecided text
	tools     string // the tool-call block, from its opening marker on
}

// NewOutputParser starts a parser; thinking says the prompt ended with <think>.
func NewOutputParser(thinking bool) *OutputParser { return &OutputParser{reasoning: thinking} }

// Push consumes the next piece of generated text.
func (p *OutputParser) Push(text string) Delta {
	var d Delta
	p.held += text
	if p.reasoning {
		if i := strings.Index(p.held, ThinkClose); i >= 0 {
			d.Reasoning = p.held[:i]
			p.held = p.held[i+len(ThinkClose):]
			p.reasoning = false
		} else {
			n := len(p.held) - partialSuffix(p.held, ThinkClose)
			d.Reasoning, p.held = p.held[:n], p.held[n:]
			return d
		}
	}
	if p.inTools {
		p.tools += p.held
		p.held = ""
		return d
	}
	if i := strings.Index(p.held, toolCallsOpen); i >= 0 {
		d.Content = p.held[:i]
		p.tools, p.held, p.inTools = p.held[i:], "", true
		return d
	}
	n := len(p.held) - partialSuffix(p.held, toolCallsOpen)
	d.Content, p.held = p.held[:n], p.held[n:]
	return d
}

// Finish ends the stream: it flushes held text and parses the tool-call block.
// A block that does not parse is returned as content instead.
func (p *OutputParser) Finish() (Delta, []ToolCall) {
	var d Delta
	if p.reasoning {
		d.Reasoning, p.held = p.held, ""
		return d, nil
	}
	d.Content, p.held = p.held, ""
	if !p.inTools {
		return d, nil
	}
	calls, ok := parseToolCalls(p.tools)
	if !ok {
		d.Content += p.tools
		calls = nil
	}
	p.tools, p.inTools = "", false
	return d, calls
}

// partialSuffix is the length of the longest suffix of s that is a proper prefix of marker.
func partialSuffix(s, marker string) int {
	for k := min(len(marker)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, marker[:k]) {
			return k
		}
	}
	return 0
}

// parseToolCalls parses "\n\n<｜DSML｜tool_calls>\n<invoke…>…\n</｜DSML｜tool_calls>".
func parseToolCalls(block string) ([]ToolCall, bool) {
	body, ok := strings.CutPrefix(block, toolCallsOpen)
	if !ok {
		return nil, false
	}
	end := "</" + DSML + "tool_calls>"
	i := strings.Index(body, end)
	if i < 0 || strings.TrimSpace(body[i+len(end):]) != "" {
		return nil, false
	}
	body = body[:i]
	invOpen, invClose := "<"+DSML+"invoke name=\"", "</"+DSML+"invoke>"
	var calls []ToolCall
	for {
		body = strings.TrimLeft(body, "\n")
		if body == "" {
			break
		}
		rest, ok := strings.CutPrefix(body, invOpen)
		if !ok {
			return nil, false
		}
		q := strings.Index(rest, "\">")
		e := strings.Index(rest, invClose)
		if q < 0 || e < q {
			return nil, false
		}
		name := rest[:q]
		args, ok := parseParams(rest[q+2 : e])
		if !ok || name == "" {
			return nil, false
		}
		calls = append(calls, ToolCall{Name: name, Arguments: args})
		body = rest[e+len(invClose):]
	}
	return calls, len(calls) > 0
}

// parseParams turns the parameter lines of one invoke into a JSON object string.
func parseParams(s string) (string, bool) {
	pOpen, pClose := "<"+DSML+"parameter name=\"", "</"+DSML+"parameter>"
	var b strings.Builder
	b.WriteByte('{')
	n := 0
	for {
		s = strings.TrimLeft(s, "\n")
		if s == "" {
			break
		}
		rest, ok := strings.CutPrefix(s, pOpen)
		if !ok {
			return "", false
		}
		q := strings.Index(rest, "\" string=\"")
		if q < 0 {
			return "", false
		}
		name := rest[:q]
		rest = rest[q+len("\" string=\""):]
		isString := strings.HasPrefix(rest, "true\">")
		if !isString && !strings.HasPrefix(rest, "false\">") {
			return "", false
		}
		rest = rest[strings.Index(rest, "\">")+2:]
		e := strings.Index(rest, pClose)
		if e < 0 {
			return "", false
		}
		val := rest[:e]
		if n > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(name)
		b.Write(k)
		b.WriteByte(':')
		if !isString && json.Valid([]byte(val)) {
			b.WriteString(strings.TrimSpace(val))
		} else {
			v, _ := json.Marshal(val)
			b.Write(v)
		}
		n++
		s = rest[e+len(pClose):]
	}
	b.WriteByte('}')
	return b.String(), true
}
