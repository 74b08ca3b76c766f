package grammar

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// CompileGBNF compiles a grammar in llama.cpp's GBNF dialect: rules `name ::= body`, one per
// line (a body continues over newlines inside parentheses or after `|`), the start rule
// `root`, alternation `|`, grouping `( )`, postfix `*` `+` `?` `{m}` `{m,}` `{m,n}` `{,n}`,
// string literals "..." and character classes [...] / [^...] with escapes \n \r \t \\ \" \]
// \xHH \uHHHH \UHHHHHHHH, `.` (any character) and `#` comments. Classes and `.` match whole
// UTF-8 characters; literals match their UTF-8 bytes.
func CompileGBNF(src string) (*Grammar, error) { return CompileGBNFLimits(src, DefaultLimits()) }

// CompileGBNFLimits is CompileGBNF with explicit limits.
func CompileGBNFLimits(src string, lim Limits) (*Grammar, error) {
	p := &gbnfParser{src: src, b: newBuilder(lim)}
	if err := p.parse(); err != nil {
		return nil, err
	}
	root, ok := p.b.byName["root"]
	if !ok {
		return nil, fmt.Errorf("gbnf: no rule named root")
	}
	for id, body := range p.b.bodies {
		if body == nil {
			return nil, fmt.Errorf("gbnf: undefined rule %q (first used at %s)", p.b.names[id], p.used[int32(id)])
		}
	}
	g, err := p.b.finish(root)
	if err != nil {
		return nil, fmt.Errorf("gbnf: %w", err)
	}
	return g, nil
}

type gbnfParser struct {
	src   string
	pos   int
	b     *builder
	used  map[int32]string
	depth int
}

func (p *gbnfParser) where(at int) string {
	line, col := 1, 1
	for i := 0; i < at && i < len(p.src); i++ {
		if p.src[i] == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return fmt.Sprintf("line %d col %d", line, col)
}

func (p *gbnfParser) errf(at int, format string, args ...any) error {
	return fmt.Errorf("gbnf: %s: %s", p.where(at), fmt.Sprintf(format, args...))
}

func (p *gbnfParser) space(newlines bool) {
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch {
		case c == ' ' || c == '\t':
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		case newlines && (c == '\n' || c == '\r'):
			p.pos++
		default:
			return
		}
	}
}

func isNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func (p *gbnfParser) name() string {
	s := p.pos
	for p.pos < len(p.src) && isNameChar(p.src[p.pos]) {
		p.pos++
	}
	return p.src[s:p.pos]
}

func (p *gbnfParser) parse() error {
	p.used = map[int32]string{}
	for {
		p.space(true)
		if p.pos >= len(p.src) {
			return nil
		}
		at := p.pos
		name := p.name()
		if name == "" {
			return p.errf(at, "expected a rule name, found %q", p.src[at:min(at+10, len(p.src))])
		}
		p.space(false)
		if len(p.src)-p.pos < 3 || p.src[p.pos:p.pos+3] != "::=" {
			return p.errf(p.pos, "expected ::= after rule name %q", name)
		}
		p.pos += 3
		p.space(true)
		id := p.b.rule(name)
		if p.b.bodies[id] != nil {
			return p.errf(at, "rule %q defined twice", name)
		}
		body, err := p.alternates(false)
		if err != nil {
			return err
		}
		p.b.define(id, body)
		if err := p.b.checkTime(); err != nil {
			return err
		}
		if p.pos < len(p.src) && p.src[p.pos] != '\n' && p.src[p.pos] != '\r' {
			return p.errf(p.pos, "unexpected %q", p.src[p.pos])
		}
	}
}

func (p *gbnfParser) alternates(nested bool) (*node, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > p.b.lim.MaxDepth {
		return nil, p.errf(p.pos, "nesting deeper than %d", p.b.lim.MaxDepth)
	}
	var alts []*node
	for {
		s, err := p.sequence(nested)
		if err != nil {
			return nil, err
		}
		alts = append(alts, s)
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			p.space(true)
			continue
		}
		break
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return alt(alts...), nil
}

func (p *gbnfParser) sequence(nested bool) (*node, error) {
	s := &node{op: opSeq}
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		at := p.pos
		var item *node
		switch {
		case c == '"':
			p.pos++
			n := &node{op: opSeq}
			for {
				if p.pos >= len(p.src) {
					return nil, p.errf(at, "unterminated string literal")
				}
				if p.src[p.pos] == '"' {
					p.pos++
					break
				}
				r, err := p.char()
				if err != nil {
					return nil, err
				}
				n.kids = append(n.kids, runeLit(r))
			}
			item = n
		case c == '[':
			n, err := p.class()
			if err != nil {
				return nil, err
			}
			item = n
		case c == '.':
			p.pos++
			item = classNode([]runeRange{{0, utf8.MaxRune}})
		case c == '(':
			p.pos++
			p.space(true)
			n, err := p.alternates(true)
			if err != nil {
				return nil, err
			}
			p.space(true)
			if p.pos >= len(p.src) || p.src[p.pos] != ')' {
				return nil, p.errf(at, "unclosed (")
			}
			p.pos++
			item = n
		case isNameChar(c):
			name := p.name()
			// a name followed by ::= starts the next rule (only reachable when nested spans lines)
			save := p.pos
			p.space(false)
			if len(p.src)-p.pos >= 3 && p.src[p.pos:p.pos+3] == "::=" {
				return nil, p.errf(at, "missing newline before rule %q", name)
			}
			p.pos = save
			id := p.b.rule(name)
			if _, ok := p.used[id]; !ok {
				p.used[id] = p.where(at)
			}
			item = ref(id)
		case c == '*' || c == '+' || c == '?' || c == '{':
			if len(s.kids) == 0 {
				return nil, p.errf(at, "%q without an element before it", c)
			}
			last := s.kids[len(s.kids)-1]
			lo, hi, err := p.repetition()
			if err != nil {
				return nil, err
			}
			s.kids[len(s.kids)-1] = rep(last, lo, hi)
			p.space(nested)
			continue
		default:
			return s, nil
		}
		s.kids = append(s.kids, item)
		p.space(nested)
	}
	return s, nil
}

func (p *gbnfParser) repetition() (int, int, error) {
	at := p.pos
	c := p.src[p.pos]
	p.pos++
	switch c {
	case '*':
		return 0, -1, nil
	case '+':
		return 1, -1, nil
	case '?':
		return 0, 1, nil
	}
	num := func() (int, bool, error) {
		p.space(false)
		s := p.pos
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
		}
		if s == p.pos {
			return 0, false, nil
		}
		v, err := strconv.Atoi(p.src[s:p.pos])
		if err != nil || v > p.b.lim.MaxRepeat {
			return 0, false, p.errf(s, "repetition count %s larger than %d", p.src[s:p.pos], p.b.lim.MaxRepeat)
		}
		p.space(false)
		return v, true, nil
	}
	lo, hasLo, err := num()
	if err != nil {
		return 0, 0, err
	}
	hi := lo
	if p.pos < len(p.src) && p.src[p.pos] == ',' {
		p.pos++
		var hasHi bool
		if hi, hasHi, err = num(); err != nil {
			return 0, 0, err
		}
		if !hasHi {
			hi = -1
		}
	} else if !hasLo {
		return 0, 0, p.errf(at, "expected a number in {}")
	}
	if p.pos >= len(p.src) || p.src[p.pos] != '}' {
		return 0, 0, p.errf(at, "unclosed {")
	}
	p.pos++
	if hi >= 0 && hi < lo {
		return 0, 0, p.errf(at, "repetition {%d,%d}: max below min", lo, hi)
	}
	return lo, hi, nil
}

// char reads one (possibly escaped) character of a literal or class.
func (p *gbnfParser) char() (rune, error) {
	at := p.pos
	if p.src[p.pos] != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		if r == utf8.RuneError && n <= 1 {
			return 0, p.errf(at, "invalid UTF-8")
		}
		p.pos += n
		return r, nil
	}
	p.pos++
	if p.pos >= len(p.src) {
		return 0, p.errf(at, "escape at end of input")
	}
	c := p.src[p.pos]
	p.pos++
	hex := 0
	switch c {
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'x':
		hex = 2
	case 'u':
		hex = 4
	case 'U':
		hex = 8
	case '\\', '"', '[', ']', '-', '^', '/', '\'', '.', '*', '+', '?', '(', ')', '{', '}', '|', '#':
		return rune(c), nil
	default:
		return 0, p.errf(at, "unknown escape \\%c", c)
	}
	if len(p.src)-p.pos < hex {
		return 0, p.errf(at, "short \\%c escape", c)
	}
	v, err := strconv.ParseUint(p.src[p.pos:p.pos+hex], 16, 32)
	if err != nil || v > utf8.MaxRune || (v >= 0xD800 && v <= 0xDFFF) {
		return 0, p.errf(at, "invalid \\%c escape %q", c, p.src[p.pos:p.pos+hex])
	}
	p.pos += hex
	return rune(v), nil
}

func (p *gbnfParser) class() (*node, error) {
	at := p.pos
	p.pos++ // [
	neg := false
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		neg = true
		p.pos++
	}
	var rs []runeRange
	for {
		if p.pos >= len(p.src) {
			return nil, p.errf(at, "unclosed [")
		}
		if p.src[p.pos] == ']' {
			p.pos++
			break
		}
		lo, err := p.char()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			if hi, err = p.char(); err != nil {
				return nil, err
			}
			if hi < lo {
				return nil, p.errf(at, "class range %q-%q is reversed", lo, hi)
			}
		}
		rs = append(rs, runeRange{lo, hi})
	}
	if neg {
		rs = negate(rs)
	}
	return classNode(rs), nil
}
