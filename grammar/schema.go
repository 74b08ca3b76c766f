package grammar

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// SchemaError is a JSON schema the compiler rejects: Path is a JSON pointer into the schema
// ("#/properties/a/items").
type SchemaError struct {
	Path string
	Msg  string
}

func (e *SchemaError) Error() string { return fmt.Sprintf("json schema at %s: %s", e.Path, e.Msg) }

// JSONLayout selects the separators of generated JSON. Compact is the layout of the package
// documentation; Python is json.dumps' default (", " and ": "), the layout of the V4 chat
// encoding's DSML tool-call parameters.
type JSONLayout uint8

const (
	Compact JSONLayout = iota
	Python
)

// seps returns the item and key separators.
func (l JSONLayout) seps() (item, key string) {
	if l == Python {
		return ", ", ": "
	}
	return ",", ":"
}

// format writes a JSON value (an enum or const) in the layout.
func (l JSONLayout) format(v *jval) string {
	var b strings.Builder
	item, key := l.seps()
	v.write(&b, item, key)
	return b.String()
}

// CompileJSONSchema compiles a JSON schema to a grammar of the JSON texts it accepts, in the
// compact layout described in the package documentation.
func CompileJSONSchema(schema []byte) (*Grammar, error) {
	return CompileJSONSchemaLayout(schema, Compact, DefaultLimits())
}

// CompileJSONSchemaLimits is CompileJSONSchema with explicit limits.
func CompileJSONSchemaLimits(schema []byte, lim Limits) (*Grammar, error) {
	return CompileJSONSchemaLayout(schema, Compact, lim)
}

// CompileJSONSchemaLayout is CompileJSONSchema with a layout and limits.
func CompileJSONSchemaLayout(schema []byte, layout JSONLayout, lim Limits) (*Grammar, error) {
	root, err := parseJSON(schema, lim.MaxDepth)
	if err != nil {
		return nil, &SchemaError{Path: "#", Msg: err.Error()}
	}
	c := &schemaCompiler{b: newBuilder(lim), layout: layout, root: root, refs: map[string]int32{}, common: map[string]int32{}}
	n, err := c.compile(root, "#", 0)
	if err != nil {
		return nil, err
	}
	r := c.b.rule("root")
	c.b.define(r, n)
	g, err := c.b.finish(r)
	if err != nil {
		return nil, &SchemaError{Path: "#", Msg: err.Error()}
	}
	return g, nil
}

// CompileJSON compiles free JSON: any JSON object when objectOnly (OpenAI's json_object
// response format), else any JSON value.
func CompileJSON(objectOnly bool) (*Grammar, error) {
	c := &schemaCompiler{b: newBuilder(DefaultLimits()), layout: Compact, refs: map[string]int32{}, common: map[string]int32{}}
	n := c.anyValue()
	if objectOnly {
		n = c.anyObject()
	}
	r := c.b.rule("root")
	c.b.define(r, n)
	return c.b.finish(r)
}

type schemaCompiler struct {
	b      *builder
	layout JSONLayout
	prefix string // of $ref rule names, when several schemas share a builder
	root   *jval
	refs   map[string]int32
	common map[string]int32
}

func (c *schemaCompiler) comma() *node { item, _ := c.layout.seps(); return lit(item) }
func (c *schemaCompiler) colon() *node { _, key := c.layout.seps(); return lit(key) }

func (c *schemaCompiler) errf(path, format string, args ...any) error {
	return &SchemaError{Path: path, Msg: fmt.Sprintf(format, args...)}
}

// shared returns the rule name, building it once (rules shared by all uses keep the automaton small).
func (c *schemaCompiler) shared(name string, body func() *node) *node {
	if id, ok := c.common[name]; ok {
		return ref(id)
	}
	id := c.b.rule(name)
	c.common[name] = id
	c.b.define(id, body())
	return ref(id)
}

var hexDigit = bytesIn("09afAF")

func (c *schemaCompiler) jsonChar() *node {
	return c.shared("char", func() *node {
		plain := classNode(subtract([]runeRange{{0x20, 0x10FFFF}}, '"', '\\'))
		// \u escapes exclude surrogates so that every escape is exactly one character
		u := alt(seq(bytesIn("09acACefEF"), hexDigit, hexDigit, hexDigit), seq(setOf("dD"), bytesIn("07"), hexDigit, hexDigit))
		esc := seq(lit(`\`), alt(setOf(`"\/bfnrt`), seq(lit("u"), u)))
		return alt(plain, esc)
	})
}

func setOf(chars string) *node {
	var s byteSet
	for i := 0; i < len(chars); i++ {
		s.add(chars[i])
	}
	return setNode(s)
}

func (c *schemaCompiler) anyString() *node {
	return c.shared("string", func() *node { return seq(lit(`"`), star(c.jsonChar()), lit(`"`)) })
}

var digit = bytesIn("09")

// intPart has at most 18 digits and exponents at most 2, so that every number fits an int64
// or a float64 (consumers reject or round larger ones).
func intPart() *node { return alt(lit("0"), seq(bytesIn("19"), rep(digit, 0, 17))) }

func (c *schemaCompiler) anyNumber() *node {
	return c.shared("number", func() *node {
		return seq(opt(lit("-")), intPart(), opt(seq(lit("."), plus(digit))), opt(seq(setOf("eE"), opt(setOf("+-")), rep(digit, 1, 2))))
	})
}

func (c *schemaCompiler) anyInteger() *node {
	return c.shared("integer", func() *node { return seq(opt(lit("-")), intPart()) })
}

func (c *schemaCompiler) anyValue() *node {
	if id, ok := c.common["value"]; ok {
		return ref(id)
	}
	id := c.b.rule("value")
	c.common["value"] = id
	c.b.define(id, alt(c.anyObject(), c.anyArray(), c.anyString(), c.anyNumber(), lit("true"), lit("false"), lit("null")))
	return ref(id)
}

func (c *schemaCompiler) anyObject() *node {
	return c.shared("object", func() *node {
		kv := seq(c.anyString(), c.colon(), c.anyValue())
		return seq(lit("{"), opt(seq(kv, star(seq(c.comma(), kv)))), lit("}"))
	})
}

func (c *schemaCompiler) anyArray() *node {
	return c.shared("array", func() *node {
		v := c.anyValue()
		return seq(lit("["), opt(seq(v, star(seq(c.comma(), v)))), lit("]"))
	})
}

// Keywords that change what validates but that the compiler cannot express: rejected so that
// a constrained output is never silently invalid.
var unsupportedKeywords = []string{"not", "if", "then", "else", "patternProperties", "propertyNames",
	"dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems",
	"contains", "minContains", "maxContains", "minProperties", "maxProperties", "multipleOf",
	"$dynamicRef", "$recursiveRef"}

func pathJoin(path string, parts ...string) string {
	for _, p := range parts {
		path += "/" + strings.ReplaceAll(strings.ReplaceAll(p, "~", "~0"), "/", "~1")
	}
	return path
}

func (c *schemaCompiler) compile(s *jval, path string, depth int) (*node, error) {
	if depth > c.b.lim.MaxDepth {
		return nil, c.errf(path, "schema nested deeper than %d", c.b.lim.MaxDepth)
	}
	if err := c.b.checkTime(); err != nil {
		return nil, c.errf(path, "%v", err)
	}
	switch s.kind {
	case 'b':
		if s.b {
			return c.anyValue(), nil
		}
		return nil, c.errf(path, "schema false accepts no value")
	case 'o':
	default:
		return nil, c.errf(path, "a schema must be an object or a boolean")
	}
	for _, k := range unsupportedKeywords {
		if s.get(k) != nil {
			return nil, c.errf(pathJoin(path, k), "keyword %q is not supported", k)
		}
	}
	if u := s.get("uniqueItems"); u != nil && u.kind == 'b' && u.b {
		return nil, c.errf(pathJoin(path, "uniqueItems"), "uniqueItems true is not supported")
	}
	if r := s.get("$ref"); r != nil {
		if r.kind != 's' {
			return nil, c.errf(pathJoin(path, "$ref"), "$ref must be a string")
		}
		for _, k := range []string{"type", "properties", "items", "enum", "const", "anyOf", "oneOf", "allOf"} {
			if s.get(k) != nil {
				return nil, c.errf(path, "$ref beside %q is not supported", k)
			}
		}
		return c.ref(r.str, pathJoin(path, "$ref"))
	}
	if v := s.get("const"); v != nil {
		return lit(c.layout.format(v)), nil
	}
	if e := s.get("enum"); e != nil {
		if e.kind != 'a' || len(e.arr) == 0 {
			return nil, c.errf(pathJoin(path, "enum"), "enum must be a non-empty array")
		}
		var alts []*node
		for _, v := range e.arr {
			alts = append(alts, lit(c.layout.format(v)))
		}
		return alt(alts...), nil
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf"} {
		v := s.get(k)
		if v == nil {
			continue
		}
		p := pathJoin(path, k)
		if v.kind != 'a' || len(v.arr) == 0 {
			return nil, c.errf(p, "%s must be a non-empty array", k)
		}
		if k == "allOf" && len(v.arr) != 1 {
			return nil, c.errf(p, "allOf with more than one schema is not supported")
		}
		for _, other := range []string{"type", "properties", "items", "anyOf", "oneOf", "allOf"} {
			if other != k && s.get(other) != nil {
				return nil, c.errf(path, "%s beside %q is not supported", k, other)
			}
		}
		// oneOf is compiled as anyOf: the alternatives are not checked for exclusivity
		var alts []*node
		for i, sub := range v.arr {
			n, err := c.compile(sub, pathJoin(p, strconv.Itoa(i)), depth+1)
			if err != nil {
				return nil, err
			}
			alts = append(alts, n)
		}
		return alt(alts...), nil
	}
	var types []string
	switch t := s.get("type"); {
	case t == nil:
		types = inferTypes(s)
	case t.kind == 's':
		types = []string{t.str}
	case t.kind == 'a' && len(t.arr) > 0:
		for i, x := range t.arr {
			if x.kind != 's' {
				return nil, c.errf(pathJoin(path, "type", strconv.Itoa(i)), "type must be a string")
			}
			types = append(types, x.str)
		}
	default:
		return nil, c.errf(pathJoin(path, "type"), "type must be a string or a non-empty array of strings")
	}
	var alts []*node
	for _, t := range types {
		n, err := c.typed(s, t, path, depth)
		if err != nil {
			return nil, err
		}
		alts = append(alts, n)
	}
	return alt(alts...), nil
}

func inferTypes(s *jval) []string {
	has := func(ks ...string) bool {
		for _, k := range ks {
			if s.get(k) != nil {
				return true
			}
		}
		return false
	}
	switch {
	case has("properties", "additionalProperties", "required"):
		return []string{"object"}
	case has("items", "prefixItems", "minItems", "maxItems"):
		return []string{"array"}
	case has("pattern", "format", "minLength", "maxLength"):
		return []string{"string"}
	case has("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
		return []string{"number"}
	}
	return []string{"any"}
}

func (c *schemaCompiler) typed(s *jval, t, path string, depth int) (*node, error) {
	switch t {
	case "any":
		return c.anyValue(), nil
	case "null":
		return lit("null"), nil
	case "boolean":
		return alt(lit("true"), lit("false")), nil
	case "string":
		return c.str(s, path)
	case "integer":
		return c.integer(s, path)
	case "number":
		return c.number(s, path)
	case "array":
		return c.array(s, path, depth)
	case "object":
		return c.object(s, path, depth)
	}
	return nil, c.errf(pathJoin(path, "type"), "unknown type %q", t)
}

func (c *schemaCompiler) ref(target, path string) (*node, error) {
	if id, ok := c.refs[target]; ok {
		return ref(id), nil
	}
	if !strings.HasPrefix(target, "#") {
		return nil, c.errf(path, "only local $ref (starting with #) is supported, got %q", target)
	}
	v := c.root
	if p := strings.TrimPrefix(target, "#"); p != "" {
		if !strings.HasPrefix(p, "/") {
			return nil, c.errf(path, "$ref %q: anchors are not supported, use a JSON pointer", target)
		}
		for _, part := range strings.Split(p[1:], "/") {
			part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
			switch {
			case v.kind == 'o' && v.get(part) != nil:
				v = v.get(part)
			case v.kind == 'a':
				i, err := strconv.Atoi(part)
				if err != nil || i < 0 || i >= len(v.arr) {
					return nil, c.errf(path, "$ref %q does not resolve", target)
				}
				v = v.arr[i]
			default:
				return nil, c.errf(path, "$ref %q does not resolve", target)
			}
		}
	}
	id := c.b.rule(c.prefix + "ref " + target)
	c.refs[target] = id
	n, err := c.compile(v, target, 0)
	if err != nil {
		return nil, err
	}
	c.b.define(id, n)
	return ref(id), nil
}

// count reads a non-negative integer keyword (-1 when absent).
func (c *schemaCompiler) count(s *jval, k, path string) (int, error) {
	v := s.get(k)
	if v == nil {
		return -1, nil
	}
	n, err := strconv.Atoi(v.num.String())
	if v.kind != 'n' || err != nil || n < 0 {
		return 0, c.errf(pathJoin(path, k), "%s must be a non-negative integer", k)
	}
	if n > c.b.lim.MaxRepeat {
		return 0, c.errf(pathJoin(path, k), "%s %d is larger than the supported %d", k, n, c.b.lim.MaxRepeat)
	}
	return n, nil
}

// String formats, as regular expressions over the characters inside the quotes.
const (
	reYear     = `\d{4}`
	reLeapYear = `(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)`
	reDate     = `(?:` + reYear + `-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))|` + reLeapYear + `-02-29)`
	reTime     = `(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)`
	reOctet    = `(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)`
	reLabel    = `[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?`
	rePchar    = `[A-Za-z0-9\-._~!$&'()*+,;=:@]`
)

var formats = map[string]string{
	"date":      reDate,
	"time":      reTime,
	"date-time": reDate + `T` + reTime,
	"uuid":      `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`,
	"email":     `[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*@` + reLabel + `(?:\.` + reLabel + `)*\.[A-Za-z]{2,}`,
	"ipv4":      reOctet + `(?:\.` + reOctet + `){3}`,
	"hostname":  reLabel + `(?:\.` + reLabel + `)*`,
	// absolute URI (RFC 3986) without percent-escapes or IP-literal hosts
	"uri": `[A-Za-z][A-Za-z0-9+.-]*:(?://[A-Za-z0-9\-._~!$&'()*+,;=]+(?::\d{1,5})?(?:/` + rePchar + `*)*|` +
		rePchar + `+(?:/` + rePchar + `*)*)(?:\?(?:` + rePchar + `|[/?])*)?(?:#(?:` + rePchar + `|[/?])*)?`,
}

func (c *schemaCompiler) str(s *jval, path string) (*node, error) {
	lo, err := c.count(s, "minLength", path)
	if err != nil {
		return nil, err
	}
	hi, err := c.count(s, "maxLength", path)
	if err != nil {
		return nil, err
	}
	if hi >= 0 && lo > hi {
		return nil, c.errf(path, "minLength %d above maxLength %d", lo, hi)
	}
	pat, fmtv := s.get("pattern"), s.get("format")
	if (pat != nil || fmtv != nil) && (lo >= 0 || hi >= 0) {
		return nil, c.errf(path, "minLength/maxLength beside pattern or format is not supported")
	}
	if pat != nil && fmtv != nil {
		return nil, c.errf(path, "pattern beside format is not supported")
	}
	var body *node
	switch {
	case pat != nil:
		if pat.kind != 's' {
			return nil, c.errf(pathJoin(path, "pattern"), "pattern must be a string")
		}
		if body, err = regexNode(c.b, pat.str, true, true); err != nil {
			return nil, c.errf(pathJoin(path, "pattern"), "%v", err)
		}
	case fmtv != nil:
		re, ok := formats[fmtv.str]
		if !ok {
			return nil, c.errf(pathJoin(path, "format"), "format %q is not supported", fmtv.str)
		}
		return c.shared("format "+fmtv.str, func() *node {
			n, err := regexNode(c.b, re, true, false)
			if err != nil {
				panic(err) // the format table is fixed and tested
			}
			return seq(lit(`"`), n, lit(`"`))
		}), nil
	case lo >= 0 || hi >= 0:
		body = rep(c.jsonChar(), max(lo, 0), hi)
	default:
		return c.anyString(), nil
	}
	return seq(lit(`"`), body, lit(`"`)), nil
}

// maxBound bounds numeric limits so that the digit arithmetic stays exact.
const maxBound = 1e15

// bound reads a numeric keyword; ok is false when absent.
func (c *schemaCompiler) bound(s *jval, k, path string) (float64, bool, error) {
	v := s.get(k)
	if v == nil {
		return 0, false, nil
	}
	if v.kind != 'n' {
		return 0, false, c.errf(pathJoin(path, k), "%s must be a number", k)
	}
	f, err := strconv.ParseFloat(v.num.String(), 64)
	if err != nil || math.Abs(f) > maxBound {
		return 0, false, c.errf(pathJoin(path, k), "%s %s is outside the supported ±1e15", k, v.num)
	}
	return f, true, nil
}

// intBounds returns the inclusive integer bounds (nil: unbounded).
func (c *schemaCompiler) intBounds(s *jval, path string) (lo, hi *int64, err error) {
	set := func(p **int64, v int64, better func(a, b int64) bool) {
		if *p == nil || better(v, **p) {
			*p = &v
		}
	}
	greater := func(a, b int64) bool { return a > b }
	less := func(a, b int64) bool { return a < b }
	if f, ok, err := c.bound(s, "minimum", path); err != nil {
		return nil, nil, err
	} else if ok {
		set(&lo, int64(math.Ceil(f)), greater)
	}
	if f, ok, err := c.bound(s, "exclusiveMinimum", path); err != nil {
		return nil, nil, err
	} else if ok {
		set(&lo, int64(math.Floor(f))+1, greater)
	}
	if f, ok, err := c.bound(s, "maximum", path); err != nil {
		return nil, nil, err
	} else if ok {
		set(&hi, int64(math.Floor(f)), less)
	}
	if f, ok, err := c.bound(s, "exclusiveMaximum", path); err != nil {
		return nil, nil, err
	} else if ok {
		set(&hi, int64(math.Ceil(f))-1, less)
	}
	if lo != nil && hi != nil && *lo > *hi {
		return nil, nil, c.errf(path, "no integer satisfies the bounds")
	}
	return lo, hi, nil
}

func (c *schemaCompiler) integer(s *jval, path string) (*node, error) {
	lo, hi, err := c.intBounds(s, path)
	if err != nil {
		return nil, err
	}
	if lo == nil && hi == nil {
		return c.anyInteger(), nil
	}
	var alts []*node
	if lo == nil || *lo < 0 { // negative values -y, y in [ylo, yhi]
		ylo, yhi := int64(1), int64(-1)
		if hi != nil && *hi < 0 {
			ylo = -*hi
		}
		if lo != nil {
			yhi = -*lo
		}
		alts = append(alts, seq(lit("-"), uintRange(ylo, yhi)))
	}
	if hi == nil || *hi >= 0 {
		plo := int64(0)
		if lo != nil {
			plo = max(*lo, 0)
		}
		phi := int64(-1)
		if hi != nil {
			phi = *hi
		}
		alts = append(alts, uintRange(plo, phi))
	}
	return alt(alts...), nil
}

// number supports integral inclusive bounds (fractions allowed, no exponent); other bounds
// are rejected.
func (c *schemaCompiler) number(s *jval, path string) (*node, error) {
	for _, k := range []string{"minimum", "maximum"} {
		if f, ok, err := c.bound(s, k, path); err != nil {
			return nil, err
		} else if ok && f != math.Trunc(f) {
			return nil, c.errf(pathJoin(path, k), "a non-integral bound on a number is not supported")
		}
	}
	for _, k := range []string{"exclusiveMinimum", "exclusiveMaximum"} {
		if s.get(k) != nil {
			return nil, c.errf(pathJoin(path, k), "%s on a number is not supported (use integer, or minimum/maximum)", k)
		}
	}
	lo, hi, err := c.intBounds(s, path)
	if err != nil {
		return nil, err
	}
	if lo == nil && hi == nil {
		return c.anyNumber(), nil
	}
	frac := opt(seq(lit("."), plus(digit)))
	zeros := opt(seq(lit("."), plus(lit("0"))))
	// magnitude m with an optional fraction, m in [a, b] (b < 0: unbounded)
	mag := func(a, b int64) *node {
		if b < 0 {
			return seq(uintRange(a, -1), frac)
		}
		var alts []*node
		if a <= b-1 {
			alts = append(alts, seq(uintRange(a, b-1), frac))
		}
		alts = append(alts, seq(lit(strconv.FormatInt(b, 10)), zeros))
		return alt(alts...)
	}
	var alts []*node
	if lo == nil || *lo < 0 {
		ylo, yhi := int64(0), int64(-1)
		if hi != nil && *hi < 0 {
			ylo = -*hi
		}
		if lo != nil {
			yhi = -*lo
		}
		alts = append(alts, seq(lit("-"), mag(ylo, yhi)))
	}
	if hi == nil || *hi >= 0 {
		plo, phi := int64(0), int64(-1)
		if lo != nil {
			plo = max(*lo, 0)
		}
		if hi != nil {
			phi = *hi
		}
		alts = append(alts, mag(plo, phi))
	}
	return alt(alts...), nil
}

// uintRange matches the decimal integers in [lo, hi] without leading zeros (hi < 0: up to 18
// digits, as intPart).
func uintRange(lo, hi int64) *node {
	if hi < 0 {
		hi = pow10(18) - 1
	}
	var alts []*node
	for l := len(strconv.FormatInt(lo, 10)); ; l++ {
		a := lo
		if l > 1 {
			a = max(lo, pow10(l-1))
		}
		b := min(hi, pow10(l)-1)
		if a <= b {
			alts = append(alts, digitRange(strconv.FormatInt(a, 10), strconv.FormatInt(b, 10)))
		}
		if b == hi {
			break
		}
	}
	return alt(alts...)
}

func pow10(n int) int64 {
	p := int64(1)
	for range n {
		p *= 10
	}
	return p
}

// digitRange matches the digit strings of x's length between x and y (same length).
func digitRange(x, y string) *node {
	if x == "" {
		return empty()
	}
	if x[0] == y[0] {
		return seq(lit(x[:1]), digitRange(x[1:], y[1:]))
	}
	n := len(x) - 1
	if strings.Trim(x[1:], "0") == "" && strings.Trim(y[1:], "9") == "" {
		return seq(bytesIn(string([]byte{x[0], y[0]})), rep(digit, n, n))
	}
	alts := []*node{seq(lit(x[:1]), digitRange(x[1:], strings.Repeat("9", n)))}
	if x[0]+1 <= y[0]-1 {
		alts = append(alts, seq(bytesIn(string([]byte{x[0] + 1, y[0] - 1})), rep(digit, n, n)))
	}
	alts = append(alts, seq(lit(y[:1]), digitRange(strings.Repeat("0", n), y[1:])))
	return alt(alts...)
}

func (c *schemaCompiler) array(s *jval, path string, depth int) (*node, error) {
	lo, err := c.count(s, "minItems", path)
	if err != nil {
		return nil, err
	}
	hi, err := c.count(s, "maxItems", path)
	if err != nil {
		return nil, err
	}
	if hi >= 0 && lo > hi {
		return nil, c.errf(path, "minItems %d above maxItems %d", lo, hi)
	}
	lo = max(lo, 0)
	var item *node
	closed := false // items: false
	if it := s.get("items"); it == nil {
		item = c.anyValue()
	} else if it.kind == 'b' && !it.b {
		closed = true
	} else if item, err = c.compile(it, pathJoin(path, "items"), depth+1); err != nil {
		return nil, err
	}
	if pre := s.get("prefixItems"); pre != nil {
		if pre.kind != 'a' {
			return nil, c.errf(pathJoin(path, "prefixItems"), "prefixItems must be an array")
		}
		if s.get("minItems") != nil || s.get("maxItems") != nil {
			return nil, c.errf(path, "prefixItems beside minItems/maxItems is not supported")
		}
		out := seq(lit("["))
		for i, p := range pre.arr { // every prefix item is emitted
			n, err := c.compile(p, pathJoin(path, "prefixItems", strconv.Itoa(i)), depth+1)
			if err != nil {
				return nil, err
			}
			if i > 0 {
				out.kids = append(out.kids, c.comma())
			}
			out.kids = append(out.kids, n)
		}
		if !closed {
			if len(pre.arr) == 0 {
				out.kids = append(out.kids, opt(seq(item, star(seq(c.comma(), item)))))
			} else {
				out.kids = append(out.kids, star(seq(c.comma(), item)))
			}
		}
		out.kids = append(out.kids, lit("]"))
		return out, nil
	}
	if closed || hi == 0 {
		if lo > 0 {
			return nil, c.errf(path, "minItems %d but no items are allowed", lo)
		}
		return lit("[]"), nil
	}
	restHi := -1
	if hi >= 0 {
		restHi = hi - 1
	}
	more := rep(seq(c.comma(), item), max(lo-1, 0), restHi)
	body := seq(item, more)
	if lo == 0 {
		return seq(lit("["), opt(body), lit("]")), nil
	}
	return seq(lit("["), body, lit("]")), nil
}

func (c *schemaCompiler) object(s *jval, path string, depth int) (*node, error) {
	props := s.get("properties")
	if props != nil && props.kind != 'o' {
		return nil, c.errf(pathJoin(path, "properties"), "properties must be an object")
	}
	required := map[string]bool{}
	if r := s.get("required"); r != nil {
		if r.kind != 'a' {
			return nil, c.errf(pathJoin(path, "required"), "required must be an array of strings")
		}
		for i, k := range r.arr {
			if k.kind != 's' {
				return nil, c.errf(pathJoin(path, "required", strconv.Itoa(i)), "required must be an array of strings")
			}
			if props.get(k.str) == nil {
				return nil, c.errf(pathJoin(path, "required", strconv.Itoa(i)), "required property %q is not in properties", k.str)
			}
			required[k.str] = true
		}
	}
	// additionalProperties: absent means none when properties are listed (strict mode), any
	// value otherwise.
	var extra *node
	switch ap := s.get("additionalProperties"); {
	case ap == nil && props == nil:
		extra = c.anyValue()
	case ap == nil, ap.kind == 'b' && !ap.b:
	default:
		n, err := c.compile(ap, pathJoin(path, "additionalProperties"), depth+1)
		if err != nil {
			return nil, err
		}
		extra = n
	}
	type prop struct {
		kv  *node
		req bool
	}
	var list []prop
	if props != nil {
		for i, k := range props.keys {
			v, err := c.compile(props.vals[i], pathJoin(path, "properties", k), depth+1)
			if err != nil {
				return nil, err
			}
			var kb strings.Builder
			writeJSONString(&kb, k)
			_, key := c.layout.seps()
			kb.WriteString(key)
			list = append(list, prop{seq(lit(kb.String()), v), required[k]})
		}
	}
	var extraKV *node
	if extra != nil {
		extraKV = seq(c.anyString(), c.colon(), extra)
	}
	// rest(i, comma): properties i.. in order, required ones present, each after a comma when
	// one came before; then the additional properties.
	memo := map[[2]int]*node{}
	var rest func(i int, comma bool) *node
	rest = func(i int, comma bool) *node {
		key := [2]int{i, 0}
		if comma {
			key[1] = 1
		}
		if n, ok := memo[key]; ok {
			return n
		}
		sep := empty()
		if comma {
			sep = c.comma()
		}
		var n *node
		if i == len(list) {
			n = empty()
			if extraKV != nil {
				n = opt(seq(sep, extraKV, star(seq(c.comma(), extraKV))))
			}
		} else {
			take := seq(sep, list[i].kv, rest(i+1, true))
			if list[i].req {
				n = take
			} else {
				n = alt(take, rest(i+1, comma))
			}
		}
		n = ref(c.b.anon("props", n))
		memo[key] = n
		return n
	}
	return seq(lit("{"), rest(0, false), lit("}")), nil
}
