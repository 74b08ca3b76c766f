package grammar

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// CompileRegex compiles a regular expression that the whole output must match (vLLM's
// guided_regex). The subset is the one JSON-schema patterns use: literals, `.`, classes with
// ranges and negation, \d \w \s and their negations, escapes (\n \t \xHH \uHHHH ...), groups
// (capturing, (?:...), named), alternation, and the quantifiers * + ? {n} {n,} {n,m} (lazy forms
// match the same strings). `.` and \s follow RE2 (`.` excludes only \n; \s is [\t\n\f\r ]).
// Backreferences, lookaround, word boundaries and flags are rejected.
func CompileRegex(pattern string) (*Grammar, error) {
	return CompileRegexLimits(pattern, DefaultLimits())
}

// CompileRegexLimits is CompileRegex with explicit limits.
func CompileRegexLimits(pattern string, lim Limits) (*Grammar, error) {
	b := newBuilder(lim)
	n, err := regexNode(b, pattern, false, false)
	if err != nil {
		return nil, err
	}
	root := b.rule("root")
	b.define(root, n)
	g, err := b.finish(root)
	if err != nil {
		return nil, fmt.Errorf("regex: %w", err)
	}
	return g, nil
}

// regexNode parses pattern. With inJSON the characters are emitted as they appear inside a JSON
// string (", \ and control characters escaped). With search the pattern may match anywhere
// (JSON-schema semantics) unless anchored by ^ and $.
func regexNode(b *builder, pattern string, inJSON, search bool) (*node, error) {
	p := &regexParser{src: pattern, b: b, inJSON: inJSON}
	branches, err := p.top()
	if err != nil {
		return nil, err
	}
	if !search {
		alts := make([]*node, len(branches))
		for i, br := range branches {
			alts[i] = br.n
		}
		return alt(alts...), nil
	}
	any := star(p.char(negate(nil)))
	var alts []*node
	for _, br := range branches {
		s := seq()
		if !br.bol {
			s.kids = append(s.kids, any)
		}
		s.kids = append(s.kids, br.n)
		if !br.eol {
			s.kids = append(s.kids, any)
		}
		alts = append(alts, s)
	}
	return alt(alts...), nil
}

type regexParser struct {
	src    string
	pos    int
	b      *builder
	inJSON bool
	depth  int
}

type branch struct {
	n        *node
	bol, eol bool
}

func (p *regexParser) errf(format string, args ...any) error {
	return fmt.Errorf("regex %q at offset %d: %s", p.src, p.pos, fmt.Sprintf(format, args...))
}

func (p *regexParser) top() ([]branch, error) {
	var out []branch
	for {
		var br branch
		if p.pos < len(p.src) && p.src[p.pos] == '^' {
			br.bol = true
			p.pos++
		}
		n, eol, err := p.concat(true)
		if err != nil {
			return nil, err
		}
		br.n, br.eol = n, eol
		out = append(out, br)
		if p.pos >= len(p.src) {
			return out, nil
		}
		if p.src[p.pos] != '|' {
			return nil, p.errf("unbalanced )")
		}
		p.pos++
	}
}

func (p *regexParser) alternation() (*node, error) {
	var alts []*node
	for {
		n, _, err := p.concat(false)
		if err != nil {
			return nil, err
		}
		alts = append(alts, n)
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			continue
		}
		return alt(alts...), nil
	}
}

// concat parses items up to | or ) or the end; at top level a final $ is an end anchor.
func (p *regexParser) concat(top bool) (*node, bool, error) {
	s := seq()
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch c {
		case '|', ')':
			return s, false, nil
		case '$':
			p.pos++
			if top && (p.pos == len(p.src) || p.src[p.pos] == '|') {
				return s, true, nil
			}
			return nil, false, p.errf("$ is supported only at the end of the pattern")
		case '^':
			return nil, false, p.errf("^ is supported only at the start of the pattern")
		case '*', '+', '?':
			return nil, false, p.errf("%q without an element before it", c)
		}
		item, err := p.atom()
		if err != nil {
			return nil, false, err
		}
		if item, err = p.quantifier(item); err != nil {
			return nil, false, err
		}
		s.kids = append(s.kids, item)
		if err := p.b.checkTime(); err != nil {
			return nil, false, err
		}
	}
	return s, false, nil
}

func (p *regexParser) quantifier(item *node) (*node, error) {
	for p.pos < len(p.src) {
		lo, hi := 0, 0
		switch p.src[p.pos] {
		case '*':
			lo, hi = 0, -1
			p.pos++
		case '+':
			lo, hi = 1, -1
			p.pos++
		case '?':
			lo, hi = 0, 1
			p.pos++
		case '{':
			var ok bool
			var err error
			if lo, hi, ok, err = p.braces(); err != nil {
				return nil, err
			}
			if !ok {
				return item, nil // a literal {
			}
		default:
			return item, nil
		}
		if p.pos < len(p.src) && p.src[p.pos] == '?' { // lazy: same language
			p.pos++
		}
		if item.op == opRepeat {
			return nil, p.errf("nested quantifier")
		}
		item = rep(item, lo, hi)
	}
	return item, nil
}

// braces parses {n}, {n,}, {n,m}; ok is false when the text is not a quantifier.
func (p *regexParser) braces() (lo, hi int, ok bool, err error) {
	i := p.pos + 1
	num := func() (int, bool) {
		s := i
		for i < len(p.src) && p.src[i] >= '0' && p.src[i] <= '9' {
			i++
		}
		if s == i {
			return 0, false
		}
		v, e := strconv.Atoi(p.src[s:i])
		if e != nil || v > p.b.lim.MaxRepeat {
			return p.b.lim.MaxRepeat + 1, true
		}
		return v, true
	}
	lo, has := num()
	if !has {
		return 0, 0, false, nil
	}
	hi = lo
	if i < len(p.src) && p.src[i] == ',' {
		i++
		var hasHi bool
		if hi, hasHi = num(); !hasHi {
			hi = -1
		}
	}
	if i >= len(p.src) || p.src[i] != '}' {
		return 0, 0, false, nil
	}
	p.pos = i + 1
	if lo > p.b.lim.MaxRepeat || hi > p.b.lim.MaxRepeat {
		return 0, 0, false, p.errf("repetition count larger than %d", p.b.lim.MaxRepeat)
	}
	if hi >= 0 && hi < lo {
		return 0, 0, false, p.errf("repetition {%d,%d}: max below min", lo, hi)
	}
	return lo, hi, true, nil
}

func (p *regexParser) atom() (*node, error) {
	c := p.src[p.pos]
	switch c {
	case '(':
		p.depth++
		defer func() { p.depth-- }()
		if p.depth > p.b.lim.MaxDepth {
			return nil, p.errf("groups nested deeper than %d", p.b.lim.MaxDepth)
		}
		p.pos++
		if p.pos < len(p.src) && p.src[p.pos] == '?' {
			rest := p.src[p.pos:]
			switch {
			case len(rest) >= 2 && rest[1] == ':':
				p.pos += 2
			case len(rest) >= 3 && (rest[1] == '<' && rest[2] != '=' && rest[2] != '!' || rest[1] == 'P' && rest[2] == '<'):
				for p.pos < len(p.src) && p.src[p.pos] != '>' {
					p.pos++
				}
				p.pos++
			case len(rest) >= 2 && (rest[1] == '=' || rest[1] == '!' || rest[1] == '<'):
				return nil, p.errf("lookaround is not supported")
			default:
				return nil, p.errf("group flags are not supported")
			}
		}
		n, err := p.alternation()
		if err != nil {
			return nil, err
		}
		if p.pos >= len(p.src) || p.src[p.pos] != ')' {
			return nil, p.errf("unclosed (")
		}
		p.pos++
		return n, nil
	case '[':
		rs, err := p.class()
		if err != nil {
			return nil, err
		}
		return p.char(rs), nil
	case '.':
		p.pos++
		return p.char(negate([]runeRange{{'\n', '\n'}})), nil
	case '\\':
		rs, err := p.escape(false)
		if err != nil {
			return nil, err
		}
		return p.char(rs), nil
	}
	r, n := utf8.DecodeRuneInString(p.src[p.pos:])
	if r == utf8.RuneError && n <= 1 {
		return nil, p.errf("invalid UTF-8")
	}
	p.pos += n
	return p.char([]runeRange{{r, r}}), nil
}

var (
	digitRanges = []runeRange{{'0', '9'}}
	wordRanges  = []runeRange{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}
	spaceRanges = []runeRange{{'\t', '\n'}, {'\f', '\r'}, {' ', ' '}}
)

// escape parses a backslash escape; inClass makes \b a backspace.
func (p *regexParser) escape(inClass bool) ([]runeRange, error) {
	p.pos++
	if p.pos >= len(p.src) {
		return nil, p.errf("trailing backslash")
	}
	c := p.src[p.pos]
	p.pos++
	one := func(r rune) []runeRange { return []runeRange{{r, r}} }
	switch c {
	case 'd':
		return digitRanges, nil
	case 'D':
		return negate(digitRanges), nil
	case 'w':
		return wordRanges, nil
	case 'W':
		return negate(wordRanges), nil
	case 's':
		return spaceRanges, nil
	case 'S':
		return negate(spaceRanges), nil
	case 'n':
		return one('\n'), nil
	case 'r':
		return one('\r'), nil
	case 't':
		return one('\t'), nil
	case 'f':
		return one('\f'), nil
	case 'v':
		return one('\v'), nil
	case '0':
		return one(0), nil
	case 'b':
		if inClass {
			return one('\b'), nil
		}
		return nil, p.errf(`\b (word boundary) is not supported`)
	case 'x', 'u':
		n := 2
		if c == 'u' {
			n = 4
		}
		if c == 'u' && p.pos < len(p.src) && p.src[p.pos] == '{' {
			end := p.pos
			for end < len(p.src) && p.src[end] != '}' {
				end++
			}
			v, err := strconv.ParseUint(p.src[p.pos+1:min(end, len(p.src))], 16, 32)
			if err != nil || end >= len(p.src) || v > utf8.MaxRune {
				return nil, p.errf(`invalid \u{...} escape`)
			}
			p.pos = end + 1
			return one(rune(v)), nil
		}
		if len(p.src)-p.pos < n {
			return nil, p.errf(`short \%c escape`, c)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil {
			return nil, p.errf(`invalid \%c escape`, c)
		}
		p.pos += n
		return one(rune(v)), nil
	}
	if c >= '1' && c <= '9' {
		return nil, p.errf("backreferences are not supported")
	}
	if c < utf8.RuneSelf && !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
		return one(rune(c)), nil // escaped punctuation
	}
	return nil, p.errf(`unknown escape \%c`, c)
}

func (p *regexParser) class() ([]runeRange, error) {
	start := p.pos
	p.pos++
	neg := false
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		neg = true
		p.pos++
	}
	var rs []runeRange
	first := true
	for {
		if p.pos >= len(p.src) {
			p.pos = start
			return nil, p.errf("unclosed [")
		}
		if p.src[p.pos] == ']' && !first {
			p.pos++
			break
		}
		first = false
		lo, set, err := p.classAtom()
		if err != nil {
			return nil, err
		}
		if set != nil {
			rs = append(rs, set...)
			continue
		}
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			hi, set, err := p.classAtom()
			if err != nil {
				return nil, err
			}
			if set != nil {
				return nil, p.errf("class range ends in a class escape")
			}
			if hi < lo {
				return nil, p.errf("class range %q-%q is reversed", lo, hi)
			}
			rs = append(rs, runeRange{lo, hi})
			continue
		}
		rs = append(rs, runeRange{lo, lo})
	}
	if neg {
		return negate(rs), nil
	}
	return normalize(rs), nil
}

// classAtom returns one character, or a set for \d-style escapes.
func (p *regexParser) classAtom() (rune, []runeRange, error) {
	if p.src[p.pos] == '\\' {
		rs, err := p.escape(true)
		if err != nil {
			return 0, nil, err
		}
		if len(rs) == 1 && rs[0].lo == rs[0].hi {
			return rs[0].lo, nil, nil
		}
		return 0, rs, nil
	}
	r, n := utf8.DecodeRuneInString(p.src[p.pos:])
	if r == utf8.RuneError && n <= 1 {
		return 0, nil, p.errf("invalid UTF-8")
	}
	p.pos += n
	return r, nil, nil
}

// char matches one character from rs, as raw UTF-8 or as it is written inside a JSON string.
func (p *regexParser) char(rs []runeRange) *node {
	if !p.inJSON {
		return classNode(rs)
	}
	return jsonCharNode(rs)
}

// jsonCharNode matches one character of rs written inside a JSON string: " and \ and control
// characters in their canonical escaped form, everything else as UTF-8.
func jsonCharNode(rs []runeRange) *node {
	rs = normalize(rs)
	var plain []runeRange
	var alts []*node
	for _, r := range rs {
		for c := r.lo; c <= r.hi && c < 0x20; c++ {
			alts = append(alts, lit(jsonEscape(c)))
		}
		lo := max(r.lo, 0x20)
		for _, e := range []rune{'"', '\\'} {
			if lo <= e && e <= r.hi {
				alts = append(alts, lit(jsonEscape(e)))
			}
		}
		if lo <= r.hi {
			plain = append(plain, runeRange{lo, r.hi})
		}
	}
	plain = subtract(plain, '"', '\\')
	if len(plain) > 0 {
		alts = append(alts, classNode(plain))
	}
	if len(alts) == 1 {
		return alts[0]
	}
	return alt(alts...)
}

func subtract(rs []runeRange, cs ...rune) []runeRange {
	for _, c := range cs {
		var out []runeRange
		for _, r := range rs {
			if c < r.lo || c > r.hi {
				out = append(out, r)
				continue
			}
			if r.lo < c {
				out = append(out, runeRange{r.lo, c - 1})
			}
			if c < r.hi {
				out = append(out, runeRange{c + 1, r.hi})
			}
		}
		rs = out
	}
	return rs
}

// jsonEscape is the canonical JSON spelling of a character that must be escaped.
func jsonEscape(c rune) string {
	switch c {
	case '"':
		return `\"`
	case '\\':
		return `\\`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	}
	return fmt.Sprintf(`\u%04x`, c)
}

// CompileChoice compiles a grammar accepting exactly one of the given strings (vLLM's
// guided_choice).
func CompileChoice(choices []string) (*Grammar, error) {
	if len(choices) == 0 {
		return nil, fmt.Errorf("choice: no choices")
	}
	b := newBuilder(DefaultLimits())
	alts := make([]*node, len(choices))
	for i, c := range choices {
		alts[i] = lit(c)
	}
	root := b.rule("root")
	b.define(root, alt(alts...))
	g, err := b.finish(root)
	if err != nil {
		return nil, fmt.Errorf("choice: %w", err)
	}
	return g, nil
}
