package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"strings"
)

// strictFields rewrites the JSON value raw for decoding into a value of type t
// with encoding/json, which matches object keys in any letter case and lets a
// later alias win: keys that are not exactly a field's name are dropped (as
// unknown fields are), and a key given twice is an error. It recurses into the
// fields, slices and pointers of t; json.RawMessage values are kept as sent.
func strictFields(raw json.RawMessage, t reflect.Type, path string) (json.RawMessage, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[json.RawMessage]() {
		return raw, nil
	}
	trimmed := bytes.TrimSpace(raw)
	switch {
	case t.Kind() == reflect.Struct && len(trimmed) > 0 && trimmed[0] == '{':
		fields := map[string]reflect.Type{}
		collectFields(t, fields)
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		if _, err := dec.Token(); err != nil { // {
			return raw, nil // malformed: json.Unmarshal reports it
		}
		var out bytes.Buffer
		out.WriteByte('{')
		seen := map[string]bool{}
		for dec.More() {
			tk, err := dec.Token()
			if err != nil {
				return raw, nil
			}
			key, _ := tk.(string)
			var val json.RawMessage
			if err := dec.Decode(&val); err != nil {
				return raw, nil
			}
			if seen[key] {
				return nil, errorf(http.StatusBadRequest, joinPath(path, key), "duplicate_field", "field %q appears more than once", joinPath(path, key))
			}
			seen[key] = true
			ft, ok := fields[key]
			if !ok {
				continue
			}
			val, err = strictFields(val, ft, joinPath(path, key))
			if err != nil {
				return nil, err
			}
			if out.Len() > 1 {
				out.WriteByte(',')
			}
			k, _ := json.Marshal(key)
			out.Write(k)
			out.WriteByte(':')
			out.Write(val)
		}
		out.WriteByte('}')
		return out.Bytes(), nil
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && len(trimmed) > 0 && trimmed[0] == '[':
		var elems []json.RawMessage
		if err := json.Unmarshal(trimmed, &elems); err != nil {
			return raw, nil
		}
		for i, e := range elems {
			var err error
			if elems[i], err = strictFields(e, t.Elem(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return nil, err
			}
		}
		return json.Marshal(elems)
	}
	return raw, nil
}

// collectFields maps the JSON names of t's fields (embedded structs' too) to their types.
func collectFields(t reflect.Type, into map[string]reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			collectFields(f.Type, into)
			continue
		}
		if name == "" {
			name = f.Name
		}
		into[name] = f.Type
	}
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// unsupported are the request fields of OpenAI's or vLLM's API for endpoint
// ("chat" or "completions") that this server does not implement: a request
// setting one (to anything but null) gets a 400 naming it rather than an
// answer that silently ignores it.
func unsupported(endpoint string) []string {
	common := []string{"use_beam_search",
		"length_penalty", "truncate_prompt_tokens", "allowed_token_ids", "bad_words", "priority"}
	switch endpoint {
	case "chat":
		return append(common, "functions", "function_call", "modalities", "audio", "prediction", "web_search_options",
			"documents", "chat_template", "mm_processor_kwargs")
	case "completions":
		return append(common, "suffix", "prompt_embeds")
	}
	return nil
}

// checkUnsupported rejects a request body that sets any field of names.
func checkUnsupported(body []byte, names []string) error {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return nil // not an object: decoding reports it
	}
	for _, n := range names {
		if v, ok := top[n]; ok && string(bytes.TrimSpace(v)) != "null" {
			return errorf(http.StatusBadRequest, n, "unsupported_parameter", "%s is not supported by this server", n)
		}
	}
	return nil
}
