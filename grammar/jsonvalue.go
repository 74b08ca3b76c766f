package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// jval is a parsed JSON value that keeps object keys in document order (schemas list
// properties in the order the output should use).
type jval struct {
	kind byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' bool, 'z' null
	keys []string
	vals []*jval
	arr  []*jval
	str  string
	num  json.Number
	b    bool
}

func parseJSON(data []byte, maxDepth int) (*jval, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSON(dec, 0, maxDepth)
	if err != nil {
		if strings.HasPrefix(err.Error(), "invalid JSON") || strings.HasPrefix(err.Error(), "JSON nested") {
			return nil, err
		}
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("invalid JSON: data after the value")
	}
	return v, nil
}

func decodeJSON(dec *json.Decoder, depth, maxDepth int) (*jval, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("JSON nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := &jval{kind: 'o'}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("invalid JSON: %w", err)
				}
				k, _ := kt.(string)
				val, err := decodeJSON(dec, depth+1, maxDepth)
				if err != nil {
					return nil, err
				}
				if i := v.index(k); i >= 0 { // duplicate key: the last one wins, as in encoding/json
					v.vals[i] = val
					continue
				}
				v.keys = append(v.keys, k)
				v.vals = append(v.vals, val)
			}
			_, err := dec.Token()
			return v, err
		case '[':
			v := &jval{kind: 'a'}
			for dec.More() {
				val, err := decodeJSON(dec, depth+1, maxDepth)
				if err != nil {
					return nil, err
				}
				v.arr = append(v.arr, val)
			}
			_, err := dec.Token()
			return v, err
		}
	case string:
		return &jval{kind: 's', str: t}, nil
	case json.Number:
		return &jval{kind: 'n', num: t}, nil
	case bool:
		return &jval{kind: 'b', b: t}, nil
	case nil:
		return &jval{kind: 'z'}, nil
	}
	return nil, fmt.Errorf("invalid JSON token %v", tok)
}

func (v *jval) index(k string) int {
	for i, kk := range v.keys {
		if kk == k {
			return i
		}
	}
	return -1
}

// get returns the member k of an object (nil if absent or not an object).
func (v *jval) get(k string) *jval {
	if v == nil || v.kind != 'o' {
		return nil
	}
	if i := v.index(k); i >= 0 {
		return v.vals[i]
	}
	return nil
}

// write writes v with the given separators, keys in order, strings with only the required
// escapes (", \ and control characters).
func (v *jval) write(b *strings.Builder, itemSep, keySep string) {
	switch v.kind {
	case 'o':
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteString(itemSep)
			}
			writeJSONString(b, k)
			b.WriteString(keySep)
			v.vals[i].write(b, itemSep, keySep)
		}
		b.WriteByte('}')
	case 'a':
		b.WriteByte('[')
		for i, x := range v.arr {
			if i > 0 {
				b.WriteString(itemSep)
			}
			x.write(b, itemSep, keySep)
		}
		b.WriteByte(']')
	case 's':
		writeJSONString(b, v.str)
	case 'n':
		b.WriteString(v.num.String())
	case 'b':
		if v.b {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case 'z':
		b.WriteString("null")
	}
}

func writeJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		if r < 0x20 || r == '"' || r == '\\' {
			b.WriteString(jsonEscape(r))
			continue
		}
		if r == utf8.RuneError {
			r = '\uFFFD'
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
}
