package grammar

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/internal/schematest"
	"github.com/megamoe/megamoe/tokenizer"
)

func TestToolCalls(t *testing.T) {
	tools := []Tool{
		{Name: "get_weather", Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14}},"required":["city","unit"]}`)},
		{Name: "search", Parameters: []byte(`{"type":"object","properties":{"query":{"type":"string"},"filters":{"type":"object","properties":{"site":{"type":"string","format":"hostname"},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["site"]}},"required":["query"]}`)},
		{Name: "free", Parameters: nil},
	}
	validators := map[string]*schematest.Validator{}
	for _, tool := range tools {
		p := tool.Parameters
		if p == nil {
			p = []byte(`{"type":"object"}`)
		}
		v, err := schematest.New(p)
		if err != nil {
			t.Fatal(err)
		}
		validators[tool.Name] = v
	}
	v := syntheticVocab(t, 400, 11)
	for _, parallel := range []bool{false, true} {
		g, err := CompileToolCalls(tools, parallel)
		if err != nil {
			t.Fatal(err)
		}
		ok := "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris <b></｜DSML｜parameter>\n<｜DSML｜parameter name=\"unit\" string=\"false\">\"celsius\"</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
		if !matches(t, g, ok) {
			t.Fatalf("parallel=%v: a valid block is rejected", parallel)
		}
		two := strings.Replace(ok, "</｜DSML｜invoke>\n", "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"free\">\n\n</｜DSML｜invoke>\n", 1)
		if matches(t, g, two) != parallel {
			t.Fatalf("parallel=%v: two invokes accepted=%v", parallel, !parallel)
		}
		for _, bad := range []string{
			strings.Replace(ok, "Paris <b>", "a</｜b", 1),                   // ends the raw value early
			strings.Replace(ok, `"celsius"`, `"kelvin"`, 1),                // outside the enum
			strings.Replace(ok, "get_weather", "get_time", 1),              // unknown tool
			strings.Replace(ok, "<｜DSML｜parameter name=\"city\"", "<x", 1), // malformed
		} {
			if matches(t, g, bad) {
				t.Fatalf("invalid block accepted: %q", bad)
			}
		}
		for seed := range 30 {
			text, err := generate(g, v, rand.New(rand.NewPCG(uint64(seed), 12)), 60)
			if err != nil {
				t.Fatal(err)
			}
			p := tokenizer.NewOutputParser(false)
			p.Push(text)
			_, calls := p.Finish()
			if len(calls) == 0 || (!parallel && len(calls) != 1) {
				t.Fatalf("seed %d: %d tool calls parsed from %q", seed, len(calls), text)
			}
			for _, call := range calls {
				val := validators[call.Name]
				if val == nil {
					t.Fatalf("unknown tool %q", call.Name)
				}
				x, err := schematest.Decode(call.Arguments)
				if err != nil {
					t.Fatalf("seed %d: arguments %q: %v", seed, call.Arguments, err)
				}
				if err := val.Value(x); err != nil {
					t.Fatalf("seed %d: %q: %v", seed, call.Arguments, err)
				}
			}
		}
	}
	if _, err := CompileToolCalls(nil, false); err == nil {
		t.Fatal("no tools accepted")
	}
	if _, err := CompileToolCalls([]Tool{{Name: "x", Parameters: []byte(`{"properties":{"a":{"not":{}}}}`)}}, false); err == nil || !strings.Contains(err.Error(), "#/properties/a/not") {
		t.Fatalf("bad parameters: %v", err)
	}
}
