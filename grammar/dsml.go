package grammar

import (
	"fmt"
	"strconv"
)

// Tool is a function a tool call may invoke: its name and the JSON schema of its parameters
// (an object schema; empty means any parameters).
type Tool struct {
	Name       string
	Parameters []byte
}

// DSML markers of the V4 chat encoding (spec 10.2; tokenizer.DSML).
const (
	dsmlOpen       = "\n\n<｜DSML｜tool_calls>\n"
	dsmlClose      = "\n</｜DSML｜tool_calls>"
	dsmlInvoke     = "<｜DSML｜invoke name=\""
	dsmlInvokeEnd  = "\n</｜DSML｜invoke>"
	dsmlParam      = "<｜DSML｜parameter name=\""
	dsmlParamClose = "</｜DSML｜parameter>"
)

// CompileToolCalls compiles the DSML tool-call block of the V4 chat encoding (spec 10.2) for
// tool_choice "required" or a named function: one invoke of one of the tools (any number when
// parallel), each parameter in its schema's property order, required ones present. Parameters
// whose schema is a plain string (type string, no pattern, format or length) are written raw
// with string="true", as the encoding renders strings; all others as JSON with
// string="false", in json.dumps' layout (the parser reads a JSON string there too). A raw
// value never contains "</｜" (which would end it early).
//
// The block starts with "\n\n"; prefix content or a thinking block is the caller's. The
// markers are text: a tokenizer that has them as special tokens must give those tokens their
// text in the TokenTable for the grammar to be reachable.
func CompileToolCalls(tools []Tool, parallel bool) (*Grammar, error) {
	if len(tools) == 0 {
		return nil, fmt.Errorf("tool calls: no tools")
	}
	b := newBuilder(DefaultLimits())
	common := map[string]int32{}
	var invokes []*node
	for i, t := range tools {
		c := &schemaCompiler{b: b, layout: Python, prefix: "tool" + strconv.Itoa(i) + " ", refs: map[string]int32{}, common: common}
		params, err := c.dsmlParams(t.Parameters)
		if err != nil {
			return nil, fmt.Errorf("tool %q: %w", t.Name, err)
		}
		invokes = append(invokes, seq(lit(dsmlInvoke+t.Name+"\">\n"), params, lit(dsmlInvokeEnd)))
	}
	inv := ref(b.anon("invoke", alt(invokes...)))
	body := seq(lit(dsmlOpen), inv)
	if parallel {
		body.kids = append(body.kids, star(seq(lit("\n"), inv)))
	}
	body.kids = append(body.kids, lit(dsmlClose))
	root := b.rule("root")
	b.define(root, body)
	g, err := b.finish(root)
	if err != nil {
		return nil, fmt.Errorf("tool calls: %w", err)
	}
	return g, nil
}

// rawText matches text without "</｜" (the three states of the automaton avoiding it).
func (c *schemaCompiler) rawText() *node {
	if id, ok := c.common["raw"]; ok {
		return ref(id)
	}
	s0, s1, s2 := c.b.rule("raw"), c.b.rule("raw<"), c.b.rule("raw</")
	c.common["raw"] = s0
	any := func(except ...rune) *node {
		var rs []runeRange
		for _, r := range except {
			rs = append(rs, runeRange{r, r})
		}
		return classNode(negate(rs))
	}
	c.b.define(s0, alt(empty(), seq(any('<'), ref(s0)), seq(lit("<"), ref(s1))))
	c.b.define(s1, alt(empty(), seq(any('<', '/'), ref(s0)), seq(lit("<"), ref(s1)), seq(lit("/"), ref(s2))))
	c.b.define(s2, alt(empty(), seq(any('<', '｜'), ref(s0)), seq(lit("<"), ref(s1))))
	return ref(s0)
}

func (c *schemaCompiler) dsmlParams(schema []byte) (*node, error) {
	if len(schema) == 0 {
		schema = []byte(`{"type":"object"}`)
	}
	root, err := parseJSON(schema, c.b.lim.MaxDepth)
	if err != nil {
		return nil, &SchemaError{Path: "#", Msg: err.Error()}
	}
	c.root = root
	props := root.get("properties")
	if props == nil || props.kind != 'o' {
		// free parameters: any names, raw or JSON values
		name := star(classNode(negate([]runeRange{{'"', '"'}})))
		p := alt(seq(lit(dsmlParam), name, lit(`" string="true">`), c.rawText(), lit(dsmlParamClose)),
			seq(lit(dsmlParam), name, lit(`" string="false">`), c.anyValue(), lit(dsmlParamClose)))
		return opt(seq(p, star(seq(lit("\n"), p)))), nil
	}
	if ap := root.get("additionalProperties"); ap != nil && !(ap.kind == 'b' && !ap.b) {
		return nil, &SchemaError{Path: "#/additionalProperties", Msg: "additional parameters are not supported in tool calls"}
	}
	required := map[string]bool{}
	if r := root.get("required"); r != nil && r.kind == 'a' {
		for _, k := range r.arr {
			required[k.str] = true
		}
	}
	var list []*node
	var req []bool
	for i, k := range props.keys {
		ps := props.vals[i]
		path := pathJoin("#", "properties", k)
		var p *node
		if plainString(ps) {
			p = seq(lit(dsmlParam+k+`" string="true">`), c.rawText(), lit(dsmlParamClose))
		} else {
			v, err := c.compile(ps, path, 1)
			if err != nil {
				return nil, err
			}
			p = seq(lit(dsmlParam+k+`" string="false">`), v, lit(dsmlParamClose))
		}
		list = append(list, p)
		req = append(req, required[k])
	}
	// rest(i, sep): parameters i.. in order, the required ones present, one per line
	memo := map[[2]int]*node{}
	var rest func(i int, sep bool) *node
	rest = func(i int, sep bool) *node {
		key := [2]int{i, 0}
		if sep {
			key[1] = 1
		}
		if n, ok := memo[key]; ok {
			return n
		}
		n := empty()
		if i < len(list) {
			s := empty()
			if sep {
				s = lit("\n")
			}
			n = seq(s, list[i], rest(i+1, true))
			if !req[i] {
				n = alt(n, rest(i+1, sep))
			}
		}
		n = ref(c.b.anon("params", n))
		memo[key] = n
		return n
	}
	return rest(0, false), nil
}

// plainString: a string schema without constraints a raw value could break.
func plainString(s *jval) bool {
	t := s.get("type")
	if t == nil || t.kind != 's' || t.str != "string" {
		return false
	}
	for _, k := range []string{"pattern", "format", "minLength", "maxLength", "enum", "const", "$ref", "anyOf", "oneOf", "allOf"} {
		if s.get(k) != nil {
			return false
		}
	}
	return true
}
