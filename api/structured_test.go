package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/grammar"
	"github.com/megamoe/megamoe/tokenizer"
)

// The nested schema of TestStructuredOutputs.
const nestedSchema = `{"type":"object","properties":{
	"name":{"type":"string","maxLength":6},
	"kind":{"enum":["cat","dog","ünï"]},
	"tags":{"type":"array","items":{"type":"integer","minimum":0,"maximum":99},"maxItems":3},
	"inner":{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}},
	"required":["name","kind","tags","inner"]}`

// validateNested checks text against nestedSchema by hand.
func validateNested(text string) error {
	var v struct {
		Name  *string
		Kind  *string
		Tags  *[]float64
		Inner *struct{ OK *bool }
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	switch {
	case v.Name == nil || len([]rune(*v.Name)) > 6:
		return fmt.Errorf("name %v", v.Name)
	case v.Kind == nil || !slices.Contains([]string{"cat", "dog", "ünï"}, *v.Kind):
		return fmt.Errorf("kind %v", v.Kind)
	case v.Tags == nil || len(*v.Tags) > 3:
		return fmt.Errorf("tags %v", v.Tags)
	case v.Inner == nil || v.Inner.OK == nil:
		return fmt.Errorf("inner %v", v.Inner)
	}
	for _, x := range *v.Tags {
		if x != float64(int(x)) || x < 0 || x > 99 {
			return fmt.Errorf("tag %v", x)
		}
	}
	return nil
}

func matchRegex(pattern string) func(string) error {
	re := regexp.MustCompile(`^(?:` + pattern + `)$`)
	return func(s string) error {
		if !re.MatchString(s) {
			return fmt.Errorf("%q does not match %s", s, pattern)
		}
		return nil
	}
}

// seeds is the number of seeds a constrained-output test draws with: one in
// the fast tier.
func seeds() int {
	if testing.Short() {
		return 1
	}
	return 3
}

// Every constrained output, streamed or not, n = 2, over a few seeds, parses
// and validates, and ends with finish_reason "stop".
func TestStructuredOutputs(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	tok := goldenTokenizer(t)
	id := func(s string) int {
		ids := tok.Encode(s)
		if len(ids) != 1 {
			t.Fatalf("%q is %d tokens", s, len(ids))
		}
		return ids[0]
	}
	// The embedded model's weights are random: free JSON would run on inside
	// a string, and it never ends a thinking block. The bias makes closing a
	// string or object, and </think>, likely; the grammar still decides what
	// is allowed (a masked token stays at -inf).
	bias := fmt.Sprintf(`"logit_bias":{"%d":6,"%d":6,"%d":30}`, id(`"`), id(`}`), id(tokenizer.ThinkClose))
	jsonObject := func(s string) error {
		var v map[string]any
		return json.Unmarshal([]byte(s), &v)
	}
	cases := []struct {
		name, path, field string
		validate          func(string) error
	}{
		{"json_object", "/v1/chat/completions", `"response_format":{"type":"json_object"},` + bias, jsonObject},
		{"json_schema", "/v1/chat/completions", `"response_format":{"type":"json_schema","json_schema":{"name":"pet","strict":true,"schema":` + nestedSchema + `}}`, validateNested},
		{"guided_json as a string", "/v1/chat/completions", `"guided_json":` + strconv.Quote(nestedSchema), validateNested},
		{"guided_regex", "/v1/chat/completions", `"guided_regex":"[a-c]{2,5}-[0-9]{1,3}"`, matchRegex(`[a-c]{2,5}-[0-9]{1,3}`)},
		{"guided_choice", "/v1/chat/completions", `"guided_choice":["red","green","blue ü"]`, matchRegex(`red|green|blue ü`)},
		{"guided_grammar", "/v1/chat/completions", `"guided_grammar":"root ::= \"(\" num (\"+\" num)? \")\"\nnum ::= [0-9] [0-9]?"`, matchRegex(`\([0-9]{1,2}(\+[0-9]{1,2})?\)`)},
		{"structured_outputs.json", "/v1/chat/completions", `"structured_outputs":{"json":` + nestedSchema + `}`, validateNested},
		{"structured_outputs.choice, completions", "/v1/completions", `"structured_outputs":{"choice":["yes","no"]}`, matchRegex(`yes|no`)},
		{"guided_regex, completions", "/v1/completions", `"guided_regex":"[0-9]{4}"`, matchRegex(`[0-9]{4}`)},
		{"json_schema with thinking", "/v1/chat/completions", `"reasoning_effort":"high",` + bias + `,"response_format":{"type":"json_schema","json_schema":{"schema":` + nestedSchema + `}}`, validateNested},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prompt := `"messages":[{"role":"user","content":"Describe a pet as JSON."}]`
			if c.path == "/v1/completions" {
				prompt = `"prompt":"Answer:"`
			}
			for _, stream := range []bool{false, true} {
				for seed := range seeds() {
					body := fmt.Sprintf(`{"model":"m",%s,%s,"max_tokens":200,"n":2,"temperature":1,"seed":%d,"stream":%v}`, prompt, c.field, seed, stream)
					resp, data := post(t, srv, c.path, body, nil)
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("status %d: %s", resp.StatusCode, data)
					}
					texts, finishes := choicesText(t, data, stream)
					for i, text := range texts {
						if finishes[i] != "stop" {
							t.Errorf("stream %v seed %d choice %d: finish %q, text %q", stream, seed, i, finishes[i], text)
							continue
						}
						if err := c.validate(text); err != nil {
							t.Errorf("stream %v seed %d choice %d: %q: %v", stream, seed, i, text, err)
						}
					}
				}
			}
		})
	}
}

// choicesText collects each choice's content (text for completions) and
// finish reason, from a response or from the chunks of a stream.
func choicesText(t *testing.T, data []byte, stream bool) ([]string, []string) {
	t.Helper()
	type choice struct {
		Index        int
		Text         string
		FinishReason *string `json:"finish_reason"`
		Message      *struct{ Content string }
		Delta        *struct{ Content string }
	}
	events := []string{string(data)}
	if stream {
		events = sseEvents(t, data)
	}
	var texts, finishes []string
	for _, ev := range events {
		var r struct{ Choices []choice }
		if err := json.Unmarshal([]byte(ev), &r); err != nil {
			t.Fatalf("%v: %s", err, ev)
		}
		for _, ch := range r.Choices {
			for len(texts) <= ch.Index {
				texts, finishes = append(texts, ""), append(finishes, "")
			}
			texts[ch.Index] += ch.Text
			if ch.Message != nil {
				texts[ch.Index] += ch.Message.Content
			}
			if ch.Delta != nil {
				texts[ch.Index] += ch.Delta.Content
			}
			if ch.FinishReason != nil {
				finishes[ch.Index] = *ch.FinishReason
			}
		}
	}
	if len(texts) != 2 {
		t.Fatalf("%d choices, want 2", len(texts))
	}
	return texts, finishes
}

// Invalid or conflicting constraints are 400s naming the field and the problem.
func TestStructuredOutputErrors(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	const msgs = `"messages":[{"role":"user","content":"hi"}],"max_tokens":1`
	cases := []struct {
		name, body, param, msg string
	}{
		{"unsupported keyword", `{` + msgs + `,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"a":{"not":{}}}}}}}`, "response_format.json_schema.schema", "/properties/a"},
		{"guided_json not a schema", `{` + msgs + `,"guided_json":[1]}`, "guided_json", "JSON schema object"},
		{"bad regex", `{` + msgs + `,"guided_regex":"a("}`, "guided_regex", "invalid guided_regex"},
		{"bad grammar", `{` + msgs + `,"guided_grammar":"root ::= missing"}`, "guided_grammar", "invalid guided_grammar"},
		{"empty choice", `{` + msgs + `,"guided_choice":[]}`, "guided_choice", "invalid guided_choice"},
		{"two constraints", `{` + msgs + `,"guided_regex":"a","guided_choice":["b"]}`, "guided_choice", "both"},
		{"response_format and guided", `{` + msgs + `,"response_format":{"type":"json_object"},"guided_regex":"a"}`, "guided_regex", "both"},
		{"response_format and a forced tool call", `{` + msgs + `,"tools":[` + flagTool + `],"tool_choice":"required","response_format":{"type":"json_object"}}`, "tool_choice", "both"},
		{"structured_outputs bad regex", `{` + msgs + `,"structured_outputs":{"regex":"[z-a]"}}`, "structured_outputs.regex", "invalid"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, data := post(t, srv, "/v1/chat/completions", c.body, nil)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", resp.StatusCode, data)
			}
			var e struct {
				Error struct{ Message, Param string }
			}
			if err := json.Unmarshal(data, &e); err != nil {
				t.Fatal(err)
			}
			if e.Error.Param != c.param || !strings.Contains(e.Error.Message, c.msg) {
				t.Errorf("param %q message %q, want param %q and a message containing %q", e.Error.Param, e.Error.Message, c.param, c.msg)
			}
		})
	}
}

// The grammar cache returns the compiled grammar of a source again, and
// keeps at most grammarCacheSize of them, dropping the least recently used.
func TestGrammarCache(t *testing.T) {
	gs := newGrammars(nil, 0, nil)
	compiles := 0
	get := func(i int) *grammar.Grammar {
		t.Helper()
		src := "a{" + strconv.Itoa(i) + "}"
		g, err := gs.compile("regex", src, func() (*grammar.Grammar, error) { compiles++; return grammar.CompileRegex(src) })
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	first := get(1)
	for i := 2; i <= grammarCacheSize; i++ {
		get(i)
	}
	steps := []struct {
		name     string
		i        int
		compiles int // after the step
	}{
		{"hit", 1, grammarCacheSize},
		{"one more evicts the oldest unused (2)", grammarCacheSize + 1, grammarCacheSize + 1},
		{"1 was used recently: still cached", 1, grammarCacheSize + 1},
		{"2 was evicted", 2, grammarCacheSize + 2},
	}
	for _, s := range steps {
		g := get(s.i)
		if compiles != s.compiles {
			t.Errorf("%s: %d compiles, want %d", s.name, compiles, s.compiles)
		}
		if s.i == 1 && g != first {
			t.Errorf("%s: a new grammar for a cached source", s.name)
		}
		if gs.lru.Len() > grammarCacheSize || len(gs.byKey) != gs.lru.Len() {
			t.Errorf("%s: %d entries, %d keys, bound %d", s.name, gs.lru.Len(), len(gs.byKey), grammarCacheSize)
		}
	}
}

// Tools whose parameters the random embedded model can finish (no free strings).
const (
	levelTool = `{"type":"function","function":{"name":"set_level","parameters":{"type":"object","properties":{"level":{"type":"integer","minimum":0,"maximum":9},"unit":{"enum":["db","%"]}},"required":["level","unit"]}}}`
	flagTool  = `{"type":"function","function":{"name":"set_flag","parameters":{"type":"object","properties":{"on":{"type":"boolean"}},"required":["on"]}}}`
)

// tool_choice "required" and a named function always produce parsed tool
// calls of the offered functions with valid arguments, streamed or not.
func TestForcedToolCalls(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	slash := goldenTokenizer(t).Encode("/")
	if len(slash) != 1 {
		t.Fatalf("/ is %d tokens", len(slash))
	}
	// The random model would add invokes without end: after "\n<" the bias
	// makes the block's closing "/" likely.
	closing := fmt.Sprintf(`,"logit_bias":{"%d":8}`, slash[0])
	validate := map[string]func(string) error{
		"set_level": func(args string) error {
			var v struct {
				Level *float64
				Unit  *string
			}
			if err := json.Unmarshal([]byte(args), &v); err != nil {
				return err
			}
			if v.Level == nil || *v.Level != float64(int(*v.Level)) || *v.Level < 0 || *v.Level > 9 || v.Unit == nil || (*v.Unit != "db" && *v.Unit != "%") {
				return fmt.Errorf("arguments %s", args)
			}
			return nil
		},
		"set_flag": func(args string) error {
			var v struct{ On *bool }
			if err := json.Unmarshal([]byte(args), &v); err != nil || v.On == nil {
				return fmt.Errorf("arguments %s: %v", args, err)
			}
			return nil
		},
	}
	cases := []struct {
		name, choice string
		want         []string // allowed function names
		parallel     bool
		extra        string
	}{
		{"required", `"required"`, []string{"set_level", "set_flag"}, false, ""},
		{"required, parallel", `"required"`, []string{"set_level", "set_flag"}, true, closing},
		{"named", `{"type":"function","function":{"name":"set_flag"}}`, []string{"set_flag"}, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, stream := range []bool{false, true} {
				for seed := range seeds() {
					body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"Set it."}],"tools":[%s,%s],"tool_choice":%s,"parallel_tool_calls":%v,"max_tokens":300,"n":2,"temperature":1,"seed":%d,"stream":%v%s}`,
						levelTool, flagTool, c.choice, c.parallel, seed, stream, c.extra)
					resp, data := post(t, srv, "/v1/chat/completions", body, nil)
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("status %d: %s", resp.StatusCode, data)
					}
					calls, finishes := choiceToolCalls(t, data, stream)
					for i := range calls {
						if finishes[i] != "tool_calls" || len(calls[i]) == 0 || (!c.parallel && len(calls[i]) != 1) {
							t.Errorf("stream %v seed %d choice %d: finish %q, calls %v", stream, seed, i, finishes[i], calls[i])
							continue
						}
						for _, call := range calls[i] {
							if !slices.Contains(c.want, call[0]) {
								t.Errorf("stream %v seed %d choice %d: call of %q, want one of %v", stream, seed, i, call[0], c.want)
							} else if err := validate[call[0]](call[1]); err != nil {
								t.Errorf("stream %v seed %d choice %d: %s: %v", stream, seed, i, call[0], err)
							}
						}
					}
				}
			}
		})
	}
}

// choiceToolCalls collects each choice's tool calls ([name, arguments]) and
// finish reason, from a response or from the chunks of a stream.
func choiceToolCalls(t *testing.T, data []byte, stream bool) ([][][2]string, []string) {
	t.Helper()
	type call struct {
		Function struct{ Name, Arguments string }
	}
	type choice struct {
		Index        int
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			ToolCalls []call `json:"tool_calls"`
		}
		Delta *struct {
			ToolCalls []call `json:"tool_calls"`
		}
	}
	events := []string{string(data)}
	if stream {
		events = sseEvents(t, data)
	}
	var calls [][][2]string
	var finishes []string
	for _, ev := range events {
		var r struct{ Choices []choice }
		if err := json.Unmarshal([]byte(ev), &r); err != nil {
			t.Fatalf("%v: %s", err, ev)
		}
		for _, ch := range r.Choices {
			for len(calls) <= ch.Index {
				calls, finishes = append(calls, nil), append(finishes, "")
			}
			var cs []call
			if ch.Message != nil {
				cs = ch.Message.ToolCalls
			}
			if ch.Delta != nil {
				cs = ch.Delta.ToolCalls
			}
			for _, c := range cs {
				calls[ch.Index] = append(calls[ch.Index], [2]string{c.Function.Name, c.Function.Arguments})
			}
			if ch.FinishReason != nil {
				finishes[ch.Index] = *ch.FinishReason
			}
		}
	}
	if len(calls) != 2 {
		t.Fatalf("%d choices, want 2", len(calls))
	}
	return calls, finishes
}

// With thinking on, the constraint starts after </think>: the reasoning is
// free text (here with tokens the grammar would refuse), the content matches.
func TestConstraintAfterThinking(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	tok := goldenTokenizer(t)
	ids := tok.Encode(tokenizer.ThinkClose)
	if len(ids) != 1 {
		t.Fatalf("%s is %d tokens", tokenizer.ThinkClose, len(ids))
	}
	const pattern = `[0-9]{3}`
	free := 0
	for seed := range 4 {
		// A mild bias: the random weights end the thinking block after a few tokens.
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"Pick a number."}],"reasoning_effort":"high",`+
			`"guided_regex":%q,"logit_bias":{"%d":7},"max_tokens":200,"temperature":1,"seed":%d}`, pattern, ids[0], seed)
		resp, data := post(t, srv, "/v1/chat/completions", body, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, data)
		}
		var r struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
				Message      struct {
					Content          string
					ReasoningContent string `json:"reasoning_content"`
				}
			}
		}
		if err := json.Unmarshal(data, &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("%v: %s", err, data)
		}
		ch := r.Choices[0]
		if ch.FinishReason != "stop" {
			t.Errorf("seed %d: finish %q: %s", seed, ch.FinishReason, data)
			continue
		}
		if err := matchRegex(pattern)(ch.Message.Content); err != nil {
			t.Errorf("seed %d: content: %v", seed, err)
		}
		if strings.Trim(ch.Message.ReasoningContent, "0123456789") != "" {
			free++
		}
	}
	if free == 0 {
		t.Error("no reasoning outside the grammar: the constraint applied inside the thinking block")
	}
}
