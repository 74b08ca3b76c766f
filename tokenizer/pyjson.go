package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// PyJSON re-serialises a JSON document the way Python's
// json.dumps(json.loads(raw), ensure_ascii=False) writes it: key order kept
// (a repeated key keeps its first place and takes its last value), non-ASCII
// kept, numbers as Python's int/float print them, separators item/key (", "
// and ": " by default; "," and ":" for the compact form). Python's NaN and
// Infinity literals are not accepted.
func PyJSON(raw []byte, compact bool) (string, error) {
	v, err := parsePy(raw)
	if err != nil {
		return "", err
	}
	return v.String(compact), nil
}

// pyValue is a parsed JSON value as json.loads builds it.
type pyValue struct {
	kind byte   // '{', '[', 's' (string), 'n' (number), 'l' (true, false, null)
	text string // string value; number or literal as Python prints it
	keys []string
	vals []*pyValue
}

func parsePy(raw []byte) (*pyValue, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodePy(dec)
	if err != nil {
		return nil, fmt.Errorf("json: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("json: trailing data")
	}
	return v, nil
}

func decodePy(dec *json.Decoder) (*pyValue, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t != '{' && t != '[' {
			return nil, fmt.Errorf("unexpected %c", t)
		}
		v := &pyValue{kind: byte(t)}
		at := map[string]int{}
		for dec.More() {
			var k string
			if t == '{' {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k = kt.(string)
			}
			e, err := decodePy(dec)
			if err != nil {
				return nil, err
			}
			if i, dup := at[k]; dup && t == '{' {
				v.vals[i] = e
				continue
			}
			at[k] = len(v.vals)
			v.keys, v.vals = append(v.keys, k), append(v.vals, e)
		}
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		return v, nil
	case string:
		return &pyValue{kind: 's', text: t}, nil
	case json.Number:
		return &pyValue{kind: 'n', text: pyNumber(string(t))}, nil
	case bool:
		return &pyValue{kind: 'l', text: strconv.FormatBool(t)}, nil
	default:
		return &pyValue{kind: 'l', text: "null"}, nil
	}
}

// get returns the value of key k of an object, or nil.
func (v *pyValue) get(k string) *pyValue {
	if v.kind != '{' {
		return nil
	}
	for i, key := range v.keys {
		if key == k {
			return v.vals[i]
		}
	}
	return nil
}

// truthy is Python's bool() of the value.
func (v *pyValue) truthy() bool {
	switch v.kind {
	case '{', '[':
		return len(v.vals) > 0
	case 's':
		return v.text != ""
	case 'n':
		f, _ := strconv.ParseFloat(v.text, 64)
		return f != 0
	}
	return v.text == "true"
}

// String writes the value as json.dumps(ensure_ascii=False) does.
func (v *pyValue) String(compact bool) string {
	item, key := ", ", ": "
	if compact {
		item, key = ",", ":"
	}
	var b strings.Builder
	v.write(&b, item, key)
	return b.String()
}

func (v *pyValue) write(b *strings.Builder, item, key string) {
	switch v.kind {
	case '{', '[':
		b.WriteByte(v.kind)
		for i, e := range v.vals {
			if i > 0 {
				b.WriteString(item)
			}
			if v.kind == '{' {
				pyString(b, v.keys[i])
				b.WriteString(key)
			}
			e.write(b, item, key)
		}
		b.WriteByte(v.kind + 2) // '}' and ']' follow '{' and '[' by two
	case 's':
		pyString(b, v.text)
	default:
		b.WriteString(v.text)
	}
}

// pyNumber prints a JSON number literal as Python does after json.loads: an
// integer literal as an int, anything with a fraction or exponent as a float
// (repr: shortest round-trip digits, fixed notation for exponents -4..15,
// otherwise d.ddde±XX; out-of-range values become Infinity).
func pyNumber(lit string) string {
	if !strings.ContainsAny(lit, ".eE") {
		if lit == "-0" {
			return "0"
		}
		return lit
	}
	f, _ := strconv.ParseFloat(lit, 64) // a range error still gives ±Inf or 0
	if math.IsInf(f, 0) {
		if f > 0 {
			return "Infinity"
		}
		return "-Infinity"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expPart, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expPart)
	sign := ""
	if strings.HasPrefix(mant, "-") {
		sign, mant = "-", mant[1:]
	}
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	for len(digits) < exp+1 {
		digits += "0"
	}
	frac := digits[exp+1:]
	if frac == "" {
		frac = "0"
	}
	return sign + digits[:exp+1] + "." + frac
}

// pyString writes s as Python's json.dumps(ensure_ascii=False) does.
func pyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
