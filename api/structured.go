package api

import (
	"container/list"
	"encoding/json"
	"net/http"
	"strings"
	"sync"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/grammar"
	"github.com/megamoe/megamoe/tokenizer"
)

// structuredOutputs is vLLM's structured_outputs field (its guided_* fields
// in one object).
type structuredOutputs struct {
	JSON    json.RawMessage `json:"json"`
	Regex   *string         `json:"regex"`
	Choice  []string        `json:"choice"`
	Grammar *string         `json:"grammar"`
}

// grammarCacheSize bounds the compiled grammars kept (each holds its automaton
// and mask caches, up to a few MiB for a 129K vocabulary).
const grammarCacheSize = 64

// grammars compiles and caches the grammars of structured-output requests,
// and builds the tokenizer's token table once, on first use.
type grammars struct {
	tok   *tokenizer.Tokenizer
	vocab int
	eos   []int32

	once     sync.Once
	table    *grammar.TokenTable
	tableErr error
	// toolTable is table with the DSML marker token's text, which tool-call
	// grammars spell out; other grammars must not reach it (the decoder
	// drops a special token's text from their output).
	toolOnce     sync.Once
	toolTable    *grammar.TokenTable
	toolTableErr error

	mu    sync.Mutex
	lru   *list.List // of *grammarEntry, most recent first
	byKey map[string]*list.Element
}

type grammarEntry struct {
	key string
	g   *grammar.Grammar
}

func newGrammars(tok *tokenizer.Tokenizer, vocab int, eos []int32) *grammars {
	return &grammars{tok: tok, vocab: vocab, eos: eos, lru: list.New(), byKey: map[string]*list.Element{}}
}

// tokenTable is the model vocabulary's token bytes (ids past the tokenizer's,
// and added tokens, are never allowed).
func (gs *grammars) tokenTable() (*grammar.TokenTable, error) {
	gs.once.Do(func() { gs.table, gs.tableErr = grammar.NewTokenTable(gs.vocabBytes(), gs.eos) })
	return gs.table, gs.tableErr
}

// toolCallTable is tokenTable for tool-call grammars: the DSML marker token
// has its text.
func (gs *grammars) toolCallTable() (*grammar.TokenTable, error) {
	gs.toolOnce.Do(func() {
		vocab := gs.vocabBytes()
		if id, ok := gs.tok.TokenID(tokenizer.DSML); ok && id < len(vocab) {
			vocab[id] = []byte(tokenizer.DSML)
		}
		gs.toolTable, gs.toolTableErr = grammar.NewTokenTable(vocab, gs.eos)
	})
	return gs.toolTable, gs.toolTableErr
}

func (gs *grammars) vocabBytes() [][]byte {
	vocab := make([][]byte, gs.vocab)
	for id := range min(gs.vocab, gs.tok.VocabSize()) {
		if !gs.tok.IsAdded(id) {
			vocab[id] = []byte(gs.tok.Decode([]int{id}))
		}
	}
	return vocab
}

// compile returns the cached grammar of (kind, src), compiling it on a miss.
// Failed compiles are not cached: they are the client's 400s.
func (gs *grammars) compile(kind, src string, build func() (*grammar.Grammar, error)) (*grammar.Grammar, error) {
	key := kind + "\x00" + src
	gs.mu.Lock()
	if el, ok := gs.byKey[key]; ok {
		gs.lru.MoveToFront(el)
		gs.mu.Unlock()
		return el.Value.(*grammarEntry).g, nil
	}
	gs.mu.Unlock()
	g, err := build()
	if err != nil {
		return nil, err
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if el, ok := gs.byKey[key]; ok { // compiled meanwhile by another request
		return el.Value.(*grammarEntry).g, nil
	}
	gs.byKey[key] = gs.lru.PushFront(&grammarEntry{key: key, g: g})
	for gs.lru.Len() > grammarCacheSize {
		old := gs.lru.Remove(gs.lru.Back()).(*grammarEntry)
		delete(gs.byKey, old.key)
	}
	return g, nil
}

// grammarSource is one requested constraint: the field that asked for it and
// how to compile it.
type grammarSource struct {
	param, kind, src string
	build            func() (*grammar.Grammar, error)
	toolCalls        bool // matched with toolCallTable
}

// grammarSources lists the constraints p asks for (guided_* and structured_outputs).
func (p *commonParams) grammarSources() ([]grammarSource, error) {
	var out []grammarSource
	add := func(param string, schemaRaw json.RawMessage, regex *string, choice []string, gbnf *string) error {
		if set(schemaRaw) {
			schema, err := schemaText(param+"json", schemaRaw)
			if err != nil {
				return err
			}
			out = append(out, grammarSource{param: param + "json", kind: "schema", src: string(schema),
				build: func() (*grammar.Grammar, error) { return grammar.CompileJSONSchema(schema) }})
		}
		if regex != nil {
			out = append(out, grammarSource{param: param + "regex", kind: "regex", src: *regex,
				build: func() (*grammar.Grammar, error) { return grammar.CompileRegex(*regex) }})
		}
		if choice != nil {
			key, _ := json.Marshal(choice)
			out = append(out, grammarSource{param: param + "choice", kind: "choice", src: string(key),
				build: func() (*grammar.Grammar, error) { return grammar.CompileChoice(choice) }})
		}
		if gbnf != nil {
			out = append(out, grammarSource{param: param + "grammar", kind: "gbnf", src: *gbnf,
				build: func() (*grammar.Grammar, error) { return grammar.CompileGBNF(*gbnf) }})
		}
		return nil
	}
	if err := add("guided_", p.GuidedJSON, p.GuidedRegex, p.GuidedChoice, p.GuidedGrammar); err != nil {
		return nil, err
	}
	if so := p.StructuredOutputs; so != nil {
		if err := add("structured_outputs.", so.JSON, so.Regex, so.Choice, so.Grammar); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func set(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// schemaText is a schema given as a JSON object or, as vLLM also accepts, as
// a string holding one.
func schemaText(param string, raw json.RawMessage) ([]byte, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		raw = json.RawMessage(s)
	}
	if !json.Valid(raw) || !strings.HasPrefix(strings.TrimSpace(string(raw)), "{") {
		return nil, errorf(http.StatusBadRequest, param, "", "%s must be a JSON schema object", param)
	}
	return raw, nil
}

// constraint compiles the one constraint of srcs (nil when there is none);
// with thinking it starts after the thinking block.
func (s *Server) constraint(srcs []grammarSource, thinking bool) (*engine.Constraint, error) {
	switch len(srcs) {
	case 0:
		return nil, nil
	case 1:
	default:
		return nil, errorf(http.StatusBadRequest, srcs[1].param, "", "%s and %s both constrain the output; send one", srcs[0].param, srcs[1].param)
	}
	src := srcs[0]
	g, err := s.grammars.compile(src.kind, src.src, src.build)
	if err != nil {
		return nil, errorf(http.StatusBadRequest, src.param, "invalid_"+src.kind, "invalid %s: %v", src.param, err)
	}
	table, err := s.grammars.tokenTable()
	if src.toolCalls {
		table, err = s.grammars.toolCallTable()
	}
	if err != nil {
		return nil, errorf(http.StatusInternalServerError, "", "", "token table: %v", err)
	}
	c := &engine.Constraint{Grammar: g, Table: table, Head: s.forcedHead}
	if thinking {
		id, ok := s.tok.TokenID(tokenizer.ThinkClose)
		if !ok {
			return nil, errorf(http.StatusBadRequest, src.param, "", "the tokenizer has no %s token to end thinking before %s", tokenizer.ThinkClose, src.param)
		}
		c.Deferred, c.After = true, int32(id)
	}
	return c, nil
}

// forcedHead tokenizes bytes a grammar forces for jump-forward: the head
// whose split no continuation changes (tokenizer.EncodeHead).
func (s *Server) forcedHead(forced []byte) []int32 {
	ids, _ := s.tok.EncodeHead(string(forced))
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// grammarSource is the constraint response_format asks for, if any.
func (f *responseFormat) grammarSource() []grammarSource {
	switch {
	case f == nil:
		return nil
	case f.Type == "json_object":
		return []grammarSource{{param: "response_format", kind: "json_object",
			build: func() (*grammar.Grammar, error) { return grammar.CompileJSON(true) }}}
	case f.Type == "json_schema" && f.JSONSchema != nil && set(f.JSONSchema.Schema):
		schema := f.JSONSchema.Schema
		return []grammarSource{{param: "response_format.json_schema.schema", kind: "schema", src: string(schema),
			build: func() (*grammar.Grammar, error) { return grammar.CompileJSONSchema(schema) }}}
	}
	return nil
}

// toolCallSource is the constraint of tool_choice "required" or a named
// function: the DSML tool-call block over the rendered tools, each call's
// parameters constrained by its schema.
func (r *chatRequest) toolCallSource(tools []json.RawMessage) ([]grammarSource, error) {
	choice, err := parseToolChoice(r.ToolChoice)
	if err != nil || (choice.mode != "required" && choice.mode != "function") || len(tools) == 0 {
		return nil, err
	}
	fns := make([]grammar.Tool, len(tools))
	for i, t := range tools {
		var fn struct {
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(t, &fn); err != nil {
			return nil, errorf(http.StatusBadRequest, "tools", "", "tool: %v", err)
		}
		fns[i] = grammar.Tool{Name: fn.Function.Name}
		if set(fn.Function.Parameters) {
			fns[i].Parameters = fn.Function.Parameters
		}
	}
	parallel := r.ParallelToolCalls == nil || *r.ParallelToolCalls
	key, _ := json.Marshal(struct {
		Tools    []grammar.Tool
		Parallel bool
	}{fns, parallel})
	return []grammarSource{{param: "tool_choice", kind: "tools", src: string(key), toolCalls: true,
		build: func() (*grammar.Grammar, error) { return grammar.CompileToolCalls(fns, parallel) }}}, nil
}
