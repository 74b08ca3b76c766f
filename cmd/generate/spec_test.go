package main

import (
	"bytes"
	"strings"
	"testing"
)

// With drafts, generate prints plain greedy decoding's tokens (exact
// numerics) and the acceptance; bad speculative flags are errors naming them.
func TestGenerateSpeculative(t *testing.T) {
	base := []string{"--model", "synth", "--tokens", "0,17,42,99,3", "--steps", "12", "--numerics", "exact", "--threads", "1"}
	var plain, so, se bytes.Buffer
	if err := run(base, &plain, &se); err != nil {
		t.Fatalf("%v\n%s", err, se.String())
	}
	se.Reset()
	if err := run(append(base, "--num-speculative-tokens", "3"), &so, &se); err != nil {
		t.Fatalf("%v\n%s", err, se.String())
	}
	if so.String() != plain.String() {
		t.Errorf("with drafts %q, without %q", so.String(), plain.String())
	}
	if !strings.Contains(se.String(), "mean acceptance length") {
		t.Errorf("no acceptance report: %s", se.String())
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--speculative-config", `{"method":"mtp","num_speculative_tokens":2,"x":1}`}, `unknown field "x"`},
		{[]string{"--num-speculative-tokens", "99"}, "num_speculative_tokens 99"},
		{[]string{"--speculative-config", `{"method":"mtp","num_speculative_tokens":2}`, "--num-speculative-tokens", "3"}, "contradicts"},
		{[]string{"--num-speculative-tokens", "2", "--dump-logits", "x.safetensors"}, "do not combine"},
	} {
		err := run(append(base[:len(base):len(base)], tc.args...), &so, &se)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
