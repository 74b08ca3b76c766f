package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestTokenizeRoundTrip(t *testing.T) {
	const tj = "../../tokenizer/testdata/deepseek_v3_tokenizer.json.gz"
	text := "Hello 世界 🦀<｜end▁of▁sentence｜>"
	var ids bytes.Buffer
	if err := run([]string{"--tokenizer", tj}, strings.NewReader(text), &ids); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ids.String(), "[") {
		t.Fatalf("output %q is not a JSON array", ids.String())
	}
	var back bytes.Buffer
	if err := run([]string{"--tokenizer", tj, "--decode"}, &ids, &back); err != nil {
		t.Fatal(err)
	}
	if back.String() != text {
		t.Errorf("round trip %q -> %q", text, back.String())
	}
	for _, bad := range []struct {
		args []string
		in   string
	}{
		{nil, "x"},
		{[]string{"--tokenizer", "missing.json"}, "x"},
		{[]string{"--tokenizer", tj, "--decode"}, "not json"},
		{[]string{"--tokenizer", tj, "--decode"}, "[999999999]"},
	} {
		if err := run(bad.args, strings.NewReader(bad.in), &bytes.Buffer{}); err == nil {
			t.Errorf("%v with %q accepted", bad.args, bad.in)
		}
	}
}
