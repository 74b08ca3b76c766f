package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// toolChoice is a parsed tool_choice: mode "auto", "none", "required" or
// "function" (with the function's name).
type toolChoice struct{ mode, name string }

func parseToolChoice(raw json.RawMessage) (toolChoice, error) {
	bad := func(format string, args ...any) error {
		return errorf(http.StatusBadRequest, "tool_choice", "", format, args...)
	}
	if len(bytes.TrimSpace(raw)) == 0 || string(raw) == "null" {
		return toolChoice{mode: "auto"}, nil
	}
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		switch mode {
		case "auto", "none", "required":
			return toolChoice{mode: mode}, nil
		}
		return toolChoice{}, bad("tool_choice %q, want none, auto, required or {\"type\":\"function\",\"function\":{\"name\":…}}", mode)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &named) != nil || named.Type != "function" || named.Function.Name == "" {
		return toolChoice{}, bad("tool_choice must be none, auto, required or {\"type\":\"function\",\"function\":{\"name\":…}}")
	}
	return toolChoice{mode: "function", name: named.Function.Name}, nil
}

// activeTools validates tools and applies tool_choice, returning the tools to
// render: none for "none", only the named one for a named function, all of
// them otherwise.
// For "required" and a named function, decoding is also constrained to the
// DSML tool-call block (toolCallSource).
func (r *chatRequest) activeTools() ([]json.RawMessage, error) {
	choice, err := parseToolChoice(r.ToolChoice)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(r.Tools))
	for i, t := range r.Tools {
		var fn struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(t, &fn) != nil || fn.Type != "function" || fn.Function.Name == "" {
			return nil, errorf(http.StatusBadRequest, "tools["+strconv.Itoa(i)+"]", "", "each tool must be {\"type\":\"function\",\"function\":{\"name\":…}}")
		}
		names[i] = fn.Function.Name
	}
	switch choice.mode {
	case "none":
		return nil, nil
	case "auto":
		return r.Tools, nil
	}
	if len(r.Tools) == 0 {
		return nil, errorf(http.StatusBadRequest, "tool_choice", "", "tool_choice %s needs tools", choice.mode)
	}
	if choice.mode == "required" {
		return r.Tools, nil
	}
	for i, name := range names {
		if name == choice.name {
			return r.Tools[i : i+1], nil
		}
	}
	return nil, errorf(http.StatusBadRequest, "tool_choice", "", "tool_choice names function %q, which is not in tools", choice.name)
}
