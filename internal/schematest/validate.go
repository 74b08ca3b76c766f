// Package schematest is an independent JSON-schema validator for tests of
// constrained outputs (the grammar compiler's and the API's).
package schematest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/mail"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Validator is an independent JSON-schema validator (the keywords of grammar/testdata/schemas) over
// encoding/json's decoding, written from the JSON Schema 2020-12 semantics rather than from
// the compiler: oneOf requires exactly one match, patterns use Go's regexp, formats the
// standard library's parsers.
type Validator struct{ root any }

// New parses a schema.
func New(schema []byte) (*Validator, error) {
	var root any
	if err := json.Unmarshal(schema, &root); err != nil {
		return nil, err
	}
	return &Validator{root: root}, nil
}

// Decode decodes one JSON value (numbers as json.Number), nothing after it.
func Decode(text string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("data after the value")
	}
	return v, nil
}

// Value validates a decoded value (Decode) against the schema.
func (v *Validator) Value(x any) error { return v.validate(v.root, x, "#") }

// Text decodes text and validates it against the schema.
func (v *Validator) Text(text string) error {
	x, err := Decode(text)
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return v.Value(x)
}

func (v *Validator) resolve(ref string) (any, error) {
	cur := v.root
	p := strings.TrimPrefix(ref, "#")
	if p == "" {
		return cur, nil
	}
	for _, part := range strings.Split(p[1:], "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("bad ref %s", ref)
		}
		cur = m[strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")]
	}
	return cur, nil
}

func num(x any) (float64, bool) {
	n, ok := x.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

func typeOK(t string, x any) bool {
	switch t {
	case "null":
		return x == nil
	case "boolean":
		_, ok := x.(bool)
		return ok
	case "string":
		_, ok := x.(string)
		return ok
	case "number":
		_, ok := num(x)
		return ok
	case "integer":
		f, ok := num(x)
		return ok && f == math.Trunc(f)
	case "array":
		_, ok := x.([]any)
		return ok
	case "object":
		_, ok := x.(map[string]any)
		return ok
	}
	return false
}

func equalJSON(a, b any) bool {
	fa, oka := num(a)
	if fb, okb := num(b); oka || okb {
		if fl, ok := b.(float64); ok { // schema numbers decode as float64
			fb, okb = fl, true
		}
		return oka && okb && fa == fb
	}
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for k, x := range av {
			y, ok := bv[k]
			if !ok || !equalJSON(x, y) {
				return false
			}
		}
		return true
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			return false
		}
		for i := range av {
			if !equalJSON(av[i], bv[i]) {
				return false
			}
		}
		return true
	}
	return a == b
}

var uuidRe = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
var labelRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

func formatOK(f, s string) error {
	var err error
	switch f {
	case "date":
		_, err = time.Parse(time.DateOnly, s)
	case "time":
		_, err = time.Parse("15:04:05Z07:00", s)
	case "date-time":
		_, err = time.Parse(time.RFC3339Nano, s)
	case "uuid":
		if !uuidRe.MatchString(s) {
			err = fmt.Errorf("not a uuid")
		}
	case "email":
		var a *mail.Address
		if a, err = mail.ParseAddress(s); err == nil && a.Address != s {
			err = fmt.Errorf("address parses as %q", a.Address)
		}
	case "ipv4":
		if ip := net.ParseIP(s); ip == nil || ip.To4() == nil || strings.Contains(s, ":") {
			err = fmt.Errorf("not an ipv4 address")
		}
	case "hostname":
		for _, l := range strings.Split(s, ".") {
			if !labelRe.MatchString(l) {
				err = fmt.Errorf("bad label %q", l)
			}
		}
	case "uri":
		var u *url.URL
		if u, err = url.Parse(s); err == nil && u.Scheme == "" {
			err = fmt.Errorf("no scheme")
		}
	default:
		err = fmt.Errorf("unknown format %q", f)
	}
	return err
}

func (v *Validator) validate(schema, x any, path string) error {
	if b, ok := schema.(bool); ok {
		if !b {
			return fmt.Errorf("%s: schema false", path)
		}
		return nil
	}
	s, ok := schema.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: bad schema", path)
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...))
	}
	if r, ok := s["$ref"].(string); ok {
		target, err := v.resolve(r)
		if err != nil {
			return err
		}
		if err := v.validate(target, x, path); err != nil {
			return err
		}
	}
	switch t := s["type"].(type) {
	case string:
		if !typeOK(t, x) {
			return fail("not of type %s", t)
		}
	case []any:
		ok := false
		for _, tt := range t {
			ok = ok || typeOK(tt.(string), x)
		}
		if !ok {
			return fail("not of types %v", t)
		}
	}
	if c, ok := s["const"]; ok && !equalJSON(x, c) {
		return fail("not the const")
	}
	if e, ok := s["enum"].([]any); ok {
		found := false
		for _, c := range e {
			found = found || equalJSON(x, c)
		}
		if !found {
			return fail("not in enum")
		}
	}
	if a, ok := s["anyOf"].([]any); ok {
		var errs []string
		for _, sub := range a {
			if err := v.validate(sub, x, path); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if len(errs) == len(a) {
			return fail("no anyOf matches: %v", errs)
		}
	}
	if a, ok := s["oneOf"].([]any); ok {
		n := 0
		for _, sub := range a {
			if v.validate(sub, x, path) == nil {
				n++
			}
		}
		if n != 1 {
			return fail("%d oneOf alternatives match", n)
		}
	}
	if a, ok := s["allOf"].([]any); ok {
		for _, sub := range a {
			if err := v.validate(sub, x, path); err != nil {
				return err
			}
		}
	}
	switch xv := x.(type) {
	case string:
		n := utf8.RuneCountInString(xv)
		if m, ok := s["minLength"].(float64); ok && float64(n) < m {
			return fail("shorter than %v", m)
		}
		if m, ok := s["maxLength"].(float64); ok && float64(n) > m {
			return fail("longer than %v", m)
		}
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(xv) {
			return fail("%q does not match %q", xv, p)
		}
		if f, ok := s["format"].(string); ok {
			if err := formatOK(f, xv); err != nil {
				return fail("format %s: %q: %v", f, xv, err)
			}
		}
	case json.Number:
		f, _ := xv.Float64()
		if m, ok := s["minimum"].(float64); ok && f < m {
			return fail("%v below minimum %v", f, m)
		}
		if m, ok := s["maximum"].(float64); ok && f > m {
			return fail("%v above maximum %v", f, m)
		}
		if m, ok := s["exclusiveMinimum"].(float64); ok && f <= m {
			return fail("%v not above %v", f, m)
		}
		if m, ok := s["exclusiveMaximum"].(float64); ok && f >= m {
			return fail("%v not below %v", f, m)
		}
	case []any:
		if m, ok := s["minItems"].(float64); ok && float64(len(xv)) < m {
			return fail("fewer than %v items", m)
		}
		if m, ok := s["maxItems"].(float64); ok && float64(len(xv)) > m {
			return fail("more than %v items", m)
		}
		pre, _ := s["prefixItems"].([]any)
		for i, it := range xv {
			sub, has := s["items"]
			if i < len(pre) {
				sub, has = pre[i], true
			}
			if has {
				if err := v.validate(sub, it, path+"/"+strconv.Itoa(i)); err != nil {
					return err
				}
			}
		}
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		if r, ok := s["required"].([]any); ok {
			for _, k := range r {
				if _, ok := xv[k.(string)]; !ok {
					return fail("missing required %q", k)
				}
			}
		}
		for k, val := range xv {
			sub, ok := props[k]
			if !ok {
				if sub, ok = s["additionalProperties"]; !ok {
					continue
				}
			}
			if err := v.validate(sub, val, path+"/"+k); err != nil {
				return err
			}
		}
	}
	return nil
}

// CheckCompact reports whitespace outside strings (the grammar's layout has none).
func CheckCompact(text string) error {
	in, esc := false, false
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case esc:
			esc = false
		case in && c == '\\':
			esc = true
		case c == '"':
			in = !in
		case !in && bytes.IndexByte([]byte(" \t\r\n"), c) >= 0:
			return fmt.Errorf("whitespace at offset %d", i)
		}
	}
	return nil
}
