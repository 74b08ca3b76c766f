package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// PyJSON re-serialises a JSON document the way Python's json.dumps(obj,
// ensure_ascii=False) writes it: key order kept, non-ASCII kept, separators
// item/key (", " and ": " by default; "," and ":" for the compact form).
// Numbers are copied as written.
func PyJSON(raw []byte, compact bool) (string, error) {
	item, key := ", ", ": "
	if compact {
		item, key = ",", ":"
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := pyValue(dec, &b, item, key); err != nil {
		return "", fmt.Errorf("json: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", fmt.Errorf("json: trailing data")
	}
	return b.String(), nil
}

func pyValue(dec *json.Decoder, b *strings.Builder, item, key string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch v := tok.(type) {
	case json.Delim:
		closer := json.Delim('}')
		if v == '[' {
			closer = ']'
		}
		b.WriteRune(rune(v))
		for n := 0; dec.More(); n++ {
			if n > 0 {
				b.WriteString(item)
			}
			if v == '{' {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				pyString(b, k.(string))
				b.WriteString(key)
			}
			if err := pyValue(dec, b, item, key); err != nil {
				return err
			}
		}
		if end, err := dec.Token(); err != nil || end != closer {
			return fmt.Errorf("unbalanced %c", v)
		}
		b.WriteRune(rune(closer))
	case string:
		pyString(b, v)
	case json.Number:
		b.WriteString(v.String())
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	}
	return nil
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
