package grammar

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// fuzzLimits keep one fuzz input cheap while still exercising the limit paths.
func fuzzLimits() Limits {
	lim := DefaultLimits()
	lim.MaxElems = 1 << 14
	lim.MaxStacks = 1 << 14
	lim.MaxSets = 1 << 12
	lim.MaxSetSize = 256
	lim.Timeout = time.Second
	return lim
}

// FuzzGBNF: compiling never panics or hangs; an error names the problem; a compiled grammar
// can be walked on the input's own bytes and yields a mask.
func FuzzGBNF(f *testing.F) {
	for _, s := range []string{
		`root ::= "a"`, `root ::= [a-z]+ ("," [0-9]{1,3})*`, "root ::= x | y\nx ::= \"(\" root \")\"\ny ::= \"\"",
		`root ::= [^"\\\x00-\x1F]* "é" .`, `root ::= "a"{2,5} "b"{3} "c"{,2} "d"{1,}`, `root ::= root "a"`,
		`root ::= ("a" | "b"`, `root ::= [\u0100-\U0010FFFF]`, "# comment\nroot ::= \"x\" # trailing\n",
	} {
		f.Add(s)
	}
	v := syntheticVocab(f, 200, 3)
	f.Fuzz(func(t *testing.T, src string) {
		g, err := CompileGBNFLimits(src, fuzzLimits())
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		walk(t, g, v, src)
	})
}

// walk feeds the bytes of s and checks FillMask either fails with a limit or succeeds.
func walk(t *testing.T, g *Grammar, v *vocabulary, s string) {
	m, err := NewMatcher(g, v.table)
	if err != nil {
		t.Fatal(err)
	}
	mask := make([]uint32, v.table.MaskWords())
	if err := m.FillMask(mask); err != nil && !errors.Is(err, ErrLimit) && !isDeadEnd(err) {
		t.Fatal(err)
	}
	for i := 0; i < len(s) && i < 64; i++ {
		if m.Accept(v.byByte[s[i]]) != nil {
			break
		}
	}
	if _, err := m.ForcedBytes(); err != nil && !errors.Is(err, ErrLimit) {
		t.Fatal(err)
	}
}

func isDeadEnd(err error) bool { return err != nil && errors.Is(err, errDeadEnd) }

// FuzzJSONSchema: compiling never panics or hangs; errors are SchemaErrors with a path; a
// compiled schema's random constrained output is valid JSON.
func FuzzJSONSchema(f *testing.F) {
	files, _ := filepath.Glob("testdata/schemas/*.json")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{`{"type":"integer","minimum":-1e300}`, `{"$ref":"#/a/0"}`, `{"pattern":"(((a)))*+"}`, `[]`, `{"enum":[]}`} {
		f.Add([]byte(s))
	}
	v := syntheticVocab(f, 300, 4)
	f.Fuzz(func(t *testing.T, schema []byte) {
		g, err := CompileJSONSchemaLimits(schema, fuzzLimits())
		if err != nil {
			var se *SchemaError
			if !errors.As(err, &se) || se.Path == "" || se.Msg == "" {
				t.Fatalf("error %v is not a SchemaError with a path", err)
			}
			return
		}
		text, err := generate(g, v, rand.New(rand.NewPCG(1, 2)), 30)
		if err != nil {
			if errors.Is(err, ErrLimit) || isDeadEnd(err) {
				return
			}
			t.Fatal(err)
		}
		if !json.Valid([]byte(text)) {
			t.Fatalf("output %q is not JSON", text)
		}
	})
}

// FuzzRegex: compiling never panics; accepted patterns that Go's regexp also compiles agree on
// the input itself.
func FuzzRegex(f *testing.F) {
	for _, s := range []string{`a+b*`, `^\d{3}-\d{4}$`, `[^a-z]|x{2,}`, `(?:ab|cd)?e`, `\u00e9.`, `[\]]`} {
		f.Add(s, "ab")
		f.Add(s, "555-1234")
	}
	f.Fuzz(func(t *testing.T, pattern, input string) {
		g, err := CompileRegexLimits(pattern, fuzzLimits())
		if err != nil {
			return
		}
		a := g.auto
		a.mu.Lock()
		st := a.start
		for i := 0; i < len(input) && st != 0; i++ {
			if st, err = a.next(st, input[i]); err != nil {
				a.mu.Unlock()
				return
			}
		}
		got := a.accepting[st]
		a.mu.Unlock()
		// Go's syntax differs on octal escapes, POSIX classes and invalid UTF-8 input
		if !utf8.ValidString(input) || strings.Contains(pattern, `\0`) || strings.Contains(pattern, "[:") {
			return
		}
		ref, err := regexp.Compile(`^(?:` + strings.TrimSuffix(strings.TrimPrefix(pattern, "^"), "$") + `)$`)
		if err != nil {
			return
		}
		if want := ref.MatchString(input); got != want {
			t.Fatalf("pattern %q on %q: grammar %v, regexp %v", pattern, input, got, want)
		}
	})
}
