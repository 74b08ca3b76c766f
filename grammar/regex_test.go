package grammar

import (
	"regexp"
	"strings"
	"testing"
)

func TestRegex(t *testing.T) {
	for _, tc := range []struct {
		re      string
		ok, bad []string
	}{
		{`abc`, []string{"abc"}, []string{"ab", "abcd"}},
		{`a|bc|`, []string{"a", "bc", ""}, []string{"b"}},
		{`^\d{3}-\d{4}$`, []string{"555-1234"}, []string{"5551234", "55-1234"}},
		{`[A-Z][a-z]*`, []string{"A", "Hello"}, []string{"hello", "HEllo"}},
		{`[^a-c]+`, []string{"xyz", "é"}, []string{"a", "xa"}},
		{`(ab)+c?`, []string{"ab", "ababc"}, []string{"abc c", "a"}},
		{`(?:x|y){2,3}`, []string{"xy", "yyx"}, []string{"x", "xyxy"}},
		{`(?<year>\d{4})-(?P<m>\d\d)`, []string{"2024-01"}, []string{"2024-1"}},
		{`\w+@\w+\.com`, []string{"a_b@c.com"}, []string{"a@b.org"}},
		{`.\.`, []string{"a.", "é."}, []string{"\n.", "ab"}},
		{`[\d\s-]+`, []string{"1 2-3\t"}, []string{"a"}},
		{`a{2}x{1,}`, []string{"aax", "aaxxx"}, []string{"aa", "ax"}},
		{`\u00e9\x41`, []string{"éA"}, []string{"eA"}},
		{`a{,2}`, []string{"a{,2}"}, []string{"a"}},
		{`[\]\\-]`, []string{"]", `\`, "-"}, []string{"a"}},
	} {
		g, err := CompileRegex(tc.re)
		if err != nil {
			t.Errorf("%q: %v", tc.re, err)
			continue
		}
		for _, s := range tc.ok {
			if !matches(t, g, s) {
				t.Errorf("%q: %q rejected", tc.re, s)
			}
		}
		for _, s := range tc.bad {
			if matches(t, g, s) {
				t.Errorf("%q: %q accepted", tc.re, s)
			}
		}
		if !strings.Contains(tc.re, "(?<") && !strings.Contains(tc.re, "{,") && !strings.Contains(tc.re, `\u`) {
			ref := regexp.MustCompile(`^(?:` + strings.TrimSuffix(strings.TrimPrefix(tc.re, "^"), "$") + `)$`)
			for _, s := range append(tc.ok, tc.bad...) {
				if ref.MatchString(s) != matches(t, g, s) {
					t.Errorf("%q: %q disagrees with regexp", tc.re, s)
				}
			}
		}
	}
}

func TestRegexErrors(t *testing.T) {
	for _, tc := range []struct{ re, want string }{
		{`(a`, "unclosed ("},
		{`a)`, "unbalanced )"},
		{`[a`, "unclosed ["},
		{`(a)\1`, "backreferences"},
		{`a(?=b)`, "lookaround"},
		{`\bword`, "word boundary"},
		{`(?i)a`, "flags"},
		{`a$b`, "$ is supported only"},
		{`a^b`, "^ is supported only"},
		{`*a`, "without an element"},
		{`a{5,2}`, "max below min"},
		{`a{99999}`, "larger than"},
		{`a**`, "nested quantifier"},
		{`[z-a]`, "reversed"},
		{`\q`, "unknown escape"},
	} {
		_, err := CompileRegex(tc.re)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.re, err, tc.want)
		}
	}
}

func TestChoice(t *testing.T) {
	g, err := CompileChoice([]string{"yes", "no", "yes please", "深"})
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{"yes": true, "no": true, "yes please": true, "深": true, "ye": false, "yes p": false, "": false, "nope": false} {
		if matches(t, g, s) != want {
			t.Errorf("%q: got %v", s, !want)
		}
	}
	if _, err := CompileChoice(nil); err == nil {
		t.Error("no choices accepted")
	}
	if _, err := CompileChoice([]string{""}); err != nil {
		t.Errorf("empty choice: %v", err)
	}
}
