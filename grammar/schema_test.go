package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/megamoe/megamoe/internal/schematest"
	"github.com/megamoe/megamoe/tokenizer"
)

// vocabulary is a token table plus what the random generator needs.
type vocabulary struct {
	table  *TokenTable
	tokens [][]byte
	eos    int32
	byByte [256]int32           // the single-byte token of each byte
	tok    *tokenizer.Tokenizer // deepseekVocab's tokenizer (jump-forward's EncodeHead)
}

func newVocabulary(t testing.TB, tokens [][]byte, eos int32) *vocabulary {
	t.Helper()
	table, err := NewTokenTable(tokens, []int32{eos})
	if err != nil {
		t.Fatal(err)
	}
	v := &vocabulary{table: table, tokens: tokens, eos: eos}
	for i := range v.byByte {
		v.byByte[i] = -1
	}
	for id, b := range tokens {
		if len(b) == 1 && v.byByte[b[0]] < 0 {
			v.byByte[b[0]] = int32(id)
		}
	}
	for i, id := range v.byByte {
		if id < 0 {
			t.Fatalf("no single-byte token for byte %#x", i)
		}
	}
	return v
}

// syntheticVocab: every byte, JSON fragments, multi-byte characters and seeded random strings
// (many of them cross grammar boundaries: `"},"`, `1,"`...), then EOS.
func syntheticVocab(t testing.TB, extra int, seed uint64) *vocabulary {
	var toks [][]byte
	seen := map[string]bool{}
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			toks = append(toks, []byte(s))
		}
	}
	for b := range 256 {
		toks = append(toks, []byte{byte(b)})
		seen[string([]byte{byte(b)})] = true
	}
	for _, s := range []string{`{"`, `":`, `",`, `"}`, `},`, `},{"`, `":"`, `":[`, `]}`, `[]`, `{}`, `true`, `false`, `null`,
		`,"`, `"]`, `\"`, `\\`, `\n`, `\u00`, `name`, `age`, `id`, `value`, `children`, `0.`, `.5`, `-1`, `12`, `e+`, `2024-`,
		`-01-`, `T10:`, `:00Z`, `@`, `.com`, `é`, `深度`, `😀`, "日本", "ß", `ключ`, `α`, `ω`, `abc`, `http://`, `field_`, `item-`} {
		add(s)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	const alphabet = `abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"{}[],:.-+\ _/@`
	for len(toks) < 256+extra {
		n := 2 + rng.IntN(5)
		var sb strings.Builder
		for range n {
			sb.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		add(sb.String())
	}
	toks = append(toks, nil) // EOS
	return newVocabulary(t, toks, int32(len(toks)-1))
}

var (
	realVocabOnce sync.Once
	realVocab     *vocabulary
	realVocabErr  error
)

// deepseekVocab is the DeepSeek-V3 tokenizer's 129,280-token vocabulary (the V4 size).
func deepseekVocab(t testing.TB) *vocabulary {
	realVocabOnce.Do(func() {
		tok, err := tokenizer.LoadFile("../tokenizer/testdata/deepseek_v3_tokenizer.json.gz")
		if err != nil {
			realVocabErr = err
			return
		}
		toks := make([][]byte, tok.VocabSize())
		eos := int32(-1)
		for id := range toks {
			if tok.IsAdded(id) {
				if s, _ := tok.TokenString(id); s == "<｜end▁of▁sentence｜>" {
					eos = int32(id)
				}
				continue
			}
			toks[id] = []byte(tok.Decode([]int{id}))
		}
		if eos < 0 {
			realVocabErr = errors.New("no EOS token")
			return
		}
		realVocab = newVocabulary(t, toks, eos)
		realVocab.tok = tok
	})
	if realVocabErr != nil {
		t.Fatal(realVocabErr)
	}
	return realVocab
}

// shortestStrings returns a shortest string of every rule and whether it derives one.
func shortestStrings(g *Grammar) ([][]byte, []bool) {
	short := make([][]byte, len(g.ruleAlts))
	known := make([]bool, len(g.ruleAlts))
	for changed := true; changed; {
		changed = false
		for r, alts := range g.ruleAlts {
			for _, a := range alts {
				if s, ok := restOfAlt(g, a, short, known); ok && (!known[r] || len(s) < len(short[r])) {
					short[r], known[r], changed = s, true, true
				}
			}
		}
	}
	return short, known
}

// restOfAlt is a shortest string for the elements from p to the end of their alternative.
func restOfAlt(g *Grammar, p int32, short [][]byte, known []bool) ([]byte, bool) {
	var out []byte
	for ; g.elems[p].kind != kEnd; p++ {
		e := g.elems[p]
		if e.kind == kRef {
			if !known[e.arg] {
				return nil, false
			}
			out = append(out, short[e.arg]...)
			continue
		}
		set := g.sets[e.arg]
		b := 0
		for b < 256 && !set.has(byte(b)) {
			b++
		}
		if b == 256 { // an empty class
			return nil, false
		}
		out = append(out, byte(b))
	}
	return out, true
}

// shortestCompletion returns bytes that take state s to the end of the grammar: the shortest
// completion of its first stack, frame by frame.
func shortestCompletion(a *automaton, s int32) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	set := a.sets[s]
	if len(set) == 0 || set[0] == 0 {
		return nil, nil
	}
	short, known := shortestStrings(a.g)
	var out []byte
	for st := set[0]; st > holeStack; st = a.stackPar[st] {
		rest, ok := restOfAlt(a.g, a.stackPos[st], short, known)
		if !ok {
			return nil, errors.New("no completion")
		}
		out = append(out, rest...)
	}
	return out, nil
}

// generate samples one output: random allowed tokens, EOS with probability 1/3 when allowed,
// and after budget tokens the shortest completion byte by byte. It also checks that Accept
// agrees with the mask on a disallowed token.
func generate(g *Grammar, v *vocabulary, rng *rand.Rand, budget int) (string, error) {
	m, err := NewMatcher(g, v.table)
	if err != nil {
		return "", err
	}
	mask := make([]uint32, v.table.MaskWords())
	var out, pending []byte // pending: the rest of the shortest completion
	for step := 0; !m.IsTerminated(); step++ {
		if step > budget+2000 {
			return "", errors.New("no termination")
		}
		if err := m.FillMask(mask); err != nil {
			return "", err
		}
		allowed := func(id int32) bool { return mask[id>>5]>>(id&31)&1 != 0 }
		var tok int32
		switch {
		case step >= budget:
			if step == budget {
				if pending, err = shortestCompletion(m.a, m.cur().state); err != nil {
					return "", err
				}
			}
			if len(pending) == 0 {
				tok = v.eos
			} else {
				tok, pending = v.byByte[pending[0]], pending[1:]
			}
			if !allowed(tok) {
				return "", fmt.Errorf("completion token %d (%q) not in the mask", tok, v.tokens[tok])
			}
		case allowed(v.eos) && rng.IntN(3) == 0:
			tok = v.eos
		default:
			n := 0
			for _, w := range mask {
				n += bits.OnesCount32(w)
			}
			if allowed(v.eos) {
				n--
			}
			if n == 0 {
				tok = v.eos
				break
			}
			k := rng.IntN(n)
			for id := int32(0); ; id++ {
				if allowed(id) && id != v.eos {
					if k == 0 {
						tok = id
						break
					}
					k--
				}
			}
		}
		if bad := int32(rng.IntN(len(v.tokens))); !allowed(bad) {
			if err := m.Accept(bad); err == nil {
				return "", fmt.Errorf("token %d (%q) outside the mask was accepted after %q", bad, v.tokens[bad], out)
			}
		}
		if err := m.Accept(tok); err != nil {
			return "", fmt.Errorf("masked token rejected after %q: %w", out, err)
		}
		if tok != v.eos {
			out = append(out, v.tokens[tok]...)
		}
	}
	return string(out), nil
}

func loadCorpus(t testing.TB) map[string][]byte {
	files, err := filepath.Glob("testdata/schemas/*.json")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".json")] = b
	}
	if len(out) < 50 {
		t.Fatalf("corpus has %d schemas, want at least 50", len(out))
	}
	return out
}

func checkOutput(v *schematest.Validator, text string) error {
	if err := schematest.CheckCompact(text); err != nil {
		return err
	}
	return v.Text(text)
}

func testCorpus(t *testing.T, vocab func(testing.TB) *vocabulary, seeds int, budget int) {
	for name, schema := range loadCorpus(t) {
		t.Run(name, func(t *testing.T) {
			g, err := CompileJSONSchema(schema)
			if err != nil {
				t.Fatal(err)
			}
			val, err := schematest.New(schema)
			if err != nil {
				t.Fatal(err)
			}
			v := vocab(t)
			for seed := range seeds {
				rng := rand.New(rand.NewPCG(uint64(seed), 1))
				text, err := generate(g, v, rng, budget)
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				if err := checkOutput(val, text); err != nil {
					t.Errorf("seed %d: %q: %v", seed, text, err)
				}
			}
		})
	}
}

func TestCorpusSynthetic(t *testing.T) {
	v := syntheticVocab(t, 1500, 1)
	testCorpus(t, func(testing.TB) *vocabulary { return v }, 20, 60)
}

func TestCorpusDeepSeekVocab(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the 129K-token vocabulary")
	}
	testCorpus(t, deepseekVocab, 3, 40)
}

func TestSchemaAccepts(t *testing.T) {
	for _, tc := range []struct {
		schema  string
		ok, bad []string
	}{
		{`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["b"]}`,
			[]string{`{"b":""}`, `{"a":1,"b":"x"}`}, []string{`{}`, `{"a":1}`, `{"b":"x","a":1}`, `{ "b":"x"}`, `{"b":"x","c":1}`}},
		{`{"type":"integer","minimum":-12,"maximum":305}`,
			[]string{"-12", "-1", "0", "9", "10", "99", "100", "305", "299"}, []string{"-13", "306", "310", "01", "-0", "1000"}},
		{`{"type":"integer","minimum":100}`, []string{"100", "999", "1000", "123456789"}, []string{"99", "0", "-100"}},
		{`{"type":"number","minimum":-2,"maximum":3}`, []string{"-2", "-2.0", "-1.99", "0", "2.5", "3", "3.00"}, []string{"-2.1", "3.01", "4", "1e2"}},
		{`{"type":"string","format":"date"}`, []string{`"2024-02-29"`, `"2023-12-31"`, `"2000-02-29"`}, []string{`"2023-02-29"`, `"1900-02-29"`, `"2023-04-31"`, `"2023-13-01"`}},
		{`{"type":"string","pattern":"^a\"b$"}`, []string{`"a\"b"`}, []string{`"a"b"`}},
		{`{"type":"string","minLength":1,"maxLength":2}`, []string{`"a"`, `"\n\u00e9"`, `"深度"`}, []string{`""`, `"abc"`}},
		{`{"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":2}`, []string{"[1]", "[1,2]"}, []string{"[]", "[1,2,3]", "[1, 2]"}},
		{`{"enum":["a",1,null]}`, []string{`"a"`, "1", "null"}, []string{`"b"`, "2"}},
		{`{"type":"string"}`, []string{`"\uD7FF"`, `"\u00e9\uE000"`, `"\/"`}, []string{`"\uD800"`, `"\udfff"`, `"\x"`, "\"\x01\""}},
	} {
		g, err := CompileJSONSchema([]byte(tc.schema))
		if err != nil {
			t.Errorf("%s: %v", tc.schema, err)
			continue
		}
		for _, s := range tc.ok {
			if !matches(t, g, s) {
				t.Errorf("%s: %s rejected", tc.schema, s)
			}
		}
		for _, s := range tc.bad {
			if matches(t, g, s) {
				t.Errorf("%s: %s accepted", tc.schema, s)
			}
		}
	}
}

func TestSchemaErrors(t *testing.T) {
	for _, tc := range []struct{ schema, path, msg string }{
		{`{"type":"object","properties":{"a":{"not":{}}}}`, "#/properties/a/not", "not supported"},
		{`{"type":"strin"}`, "#/type", "unknown type"},
		{`{"properties":{"x":{"$ref":"#/$defs/missing"}}}`, "#/properties/x/$ref", "does not resolve"},
		{`{"$ref":"http://example.com/s.json"}`, "#/$ref", "only local"},
		{`{"type":"string","format":"ipv6"}`, "#/format", "not supported"},
		{`{"type":"string","pattern":"(a"}`, "#/pattern", "unclosed ("},
		{`{"type":"array","items":{"type":"string","pattern":"\\1"}}`, "#/items/pattern", "backreferences"},
		{`{"type":"array","uniqueItems":true}`, "#/uniqueItems", "not supported"},
		{`{"type":"number","minimum":0.5}`, "#/minimum", "non-integral"},
		{`{"type":"integer","minimum":5,"maximum":4}`, "#", "no integer"},
		{`{"type":"string","maxLength":99999999}`, "#/maxLength", "larger than"},
		{`{"required":["a"],"properties":{}}`, "#/required/0", "not in properties"},
		{`{"allOf":[{},{}]}`, "#/allOf", "more than one"},
		{`false`, "#", "accepts no value"},
		{`{"type":"object"`, "#", "invalid JSON"},
		{`{"$ref":"#"}`, "#", "matches nothing"},
		{`{"anyOf":[]}`, "#/anyOf", "non-empty"},
		{`{"type":"object","properties":{"a\/b":{"type":"integer","multipleOf":2}}}`, "#/properties/a~1b/multipleOf", "not supported"},
	} {
		_, err := CompileJSONSchema([]byte(tc.schema))
		var se *SchemaError
		if !errors.As(err, &se) || se.Path != tc.path || !strings.Contains(se.Msg, tc.msg) {
			t.Errorf("%s: error %v, want path %s and %q", tc.schema, err, tc.path, tc.msg)
		}
	}
}

func TestSchemaDeepNestingBounded(t *testing.T) {
	deep := strings.Repeat(`{"type":"array","items":`, 300) + "{}" + strings.Repeat("}", 300)
	_, err := CompileJSONSchema([]byte(deep))
	var se *SchemaError
	if !errors.As(err, &se) || !strings.Contains(se.Msg, "deeper") {
		t.Fatalf("error %v, want a nesting limit", err)
	}
}

func TestFreeJSON(t *testing.T) {
	v := syntheticVocab(t, 500, 2)
	for _, objectOnly := range []bool{true, false} {
		g, err := CompileJSON(objectOnly)
		if err != nil {
			t.Fatal(err)
		}
		for seed := range 30 {
			text, err := generate(g, v, rand.New(rand.NewPCG(uint64(seed), 3)), 80)
			if err != nil {
				t.Fatal(err)
			}
			var x any
			if err := json.Unmarshal([]byte(text), &x); err != nil {
				t.Fatalf("%q: %v", text, err)
			}
			if _, isObj := x.(map[string]any); objectOnly && !isObj {
				t.Fatalf("%q is not an object", text)
			}
		}
	}
}

func TestSchemaPythonLayout(t *testing.T) {
	schema := []byte(`{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},"b":{"enum":[{"x":[1,2]}]},"c":{"type":"object"}},"required":["a","b"]}`)
	g, err := CompileJSONSchemaLayout(schema, Python, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{
		`{"a": [1, 2], "b": {"x": [1, 2]}}`:               true,
		`{"a": [], "b": {"x": [1, 2]}, "c": {"k": [1]}}`:  true,
		`{"a":[1,2],"b":{"x":[1,2]}}`:                     false,
		`{"a": [1,2], "b": {"x": [1, 2]}}`:                false,
		`{"a": [], "b": {"x": [1, 2]}, "c": {"k":null}}`:  false,
		`{"a": [], "b": {"x": [1, 2]}, "c": {"k": null}}`: true,
	} {
		if matches(t, g, s) != want {
			t.Errorf("%s: got %v", s, !want)
		}
	}
	v := syntheticVocab(t, 300, 8)
	val, err := schematest.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	for seed := range 10 {
		text, err := generate(g, v, rand.New(rand.NewPCG(uint64(seed), 8)), 40)
		if err != nil {
			t.Fatal(err)
		}
		x, err := schematest.Decode(text)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if err := val.Value(x); err != nil {
			t.Fatalf("%q: %v", text, err)
		}
	}
}
