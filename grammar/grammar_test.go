package grammar

import (
	"errors"
	"strings"
	"testing"
)

// matches reports whether g accepts exactly s (walking the automaton byte by byte).
func matches(t *testing.T, g *Grammar, s string) bool {
	t.Helper()
	a := g.auto
	if a.err != nil {
		t.Fatal(a.err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.start
	for i := 0; i < len(s); i++ {
		var err error
		if st, err = a.next(st, s[i]); err != nil {
			t.Fatal(err)
		}
		if st == 0 {
			return false
		}
	}
	return a.accepting[st]
}

func TestGBNF(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		ok, bad   []string
	}{
		{"literal", `root ::= "ab"`, []string{"ab"}, []string{"", "a", "abc", "b"}},
		{"alt", `root ::= "a" | "bc" | ""`, []string{"a", "bc", ""}, []string{"b", "abc"}},
		{"star", `root ::= "x" [0-9]* "y"`, []string{"xy", "x0y", "x0123456789y"}, []string{"x", "xay", "y"}},
		{"plus", `root ::= [a-c]+`, []string{"a", "abcabc"}, []string{"", "d", "ad"}},
		{"opt", `root ::= "a"? "b"`, []string{"b", "ab"}, []string{"a", "aab"}},
		{"bounded", `root ::= "a"{2,3}`, []string{"aa", "aaa"}, []string{"a", "aaaa"}},
		{"exact", `root ::= [0-9]{4}`, []string{"2024"}, []string{"202", "20245"}},
		{"atleast", `root ::= "a"{2,}`, []string{"aa", "aaaaa"}, []string{"a"}},
		{"atmost", `root ::= "a"{,2}`, []string{"", "a", "aa"}, []string{"aaa"}},
		{"group", `root ::= ("ab" | "c")+ "."`, []string{"ab.", "cabc."}, []string{".", "a."}},
		{"rules", "root ::= item (\",\" item)*\nitem ::= [a-z]+ # comment\n", []string{"a,bc"}, []string{"a,", ",a"}},
		{"multiline", "root ::= (\n  \"a\" |\n  \"b\"\n)\n", []string{"a", "b"}, []string{"ab"}},
		{"negclass", `root ::= "\"" [^"\\]* "\""`, []string{`""`, `"abc"`, `"é深"`}, []string{`"a"b"`, `"\"`}},
		{"utf8class", `root ::= [α-ω]+`, []string{"αβγ", "ω"}, []string{"a", "Α"}},
		{"escapes", `root ::= "\x41\u00e9\n\t" [\x00-\x1F]`, []string{"Aé\n\t\x01"}, []string{"Aé\n\t "}},
		{"dot", `root ::= . .`, []string{"ab", "é深", "\n\n"}, []string{"a", "abc"}},
		{"recursion", "root ::= \"(\" root \")\" | \"\"", []string{"", "()", "((()))"}, []string{"(", "())"}},
		{"nullable", `root ::= ("a"?)* "b"`, []string{"b", "aab"}, []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := CompileGBNF(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.ok {
				if !matches(t, g, s) {
					t.Errorf("%q rejected", s)
				}
			}
			for _, s := range tc.bad {
				if matches(t, g, s) {
					t.Errorf("%q accepted", s)
				}
			}
		})
	}
}

func TestGBNFErrors(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{`item ::= "a"`, "no rule named root"},
		{`root ::= item`, `undefined rule "item"`},
		{`root ::= "a`, "unterminated string"},
		{`root ::= [a-`, "unclosed ["},
		{`root ::= ("a"`, "unclosed ("},
		{`root ::= * "a"`, "without an element"},
		{`root ::= "a"{3,2}`, "max below min"},
		{`root ::= "a"{99999}`, "larger than"},
		{"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
		{`root ::= root "a" | "b"`, "left recursion"},
		{"root ::= x \"a\"\nx ::= \"b\"? root", "left recursion"},
		{`root ::= "\q"`, "unknown escape"},
		{`root ::= [z-a]`, "reversed"},
		{`root = "a"`, "expected ::="},
	} {
		_, err := CompileGBNF(tc.src)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.src, err, tc.want)
		}
	}
	lim := DefaultLimits()
	lim.MaxElems = 1000
	if _, err := CompileGBNFLimits(`root ::= ("a"{100}){100}`, lim); err != nil {
		t.Errorf("nested repetition shares its rule: %v", err)
	}
	if _, err := CompileGBNFLimits(`root ::= "a"{2000}`, lim); !errors.Is(err, ErrLimit) {
		t.Errorf("size blow-up: %v, want ErrLimit", err)
	}
}
