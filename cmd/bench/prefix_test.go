package main

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"testing"
)

// TestPrefixSmallCPU runs `bench prefix` on the small preset at toy sizes:
// with the cache the shared-prefix requests compute only their last block
// and the conversation's later turns find earlier turns cached: all of the
// previous turn but its last generated token, or in thinking mode its
// prompt but the generation prefix.
func TestPrefixSmallCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("about 2,000 tokens of prefill a case")
	}
	args := []string{"--device", "cpu", "--prefix", "300", "--suffix", "5", "--requests", "1", "--turns", "2", "--turn-tokens", "200", "--answer", "3"}
	for _, tc := range []struct {
		name  string
		extra []string
		want  []string
	}{
		{"chat", nil, []string{
			`(?m)^shared prefix: 300 \+ 5 tokens, 1 requests after the first$`,
			`(?m)^  prefill tokens computed: 305 without, 49 with \(cached \[256\]\)$`,
			`(?m)^  2 +478 +277 `, // turn 1: 75 + 200 tokens, 3 generated (2 computed), 200 more
			`(?m)^  after turn 1: 478 prompt tokens, 201 recomputed`, // the new 200 and the answer's last token
			`(?m)^\| 2-turn chat .*: prompt tokens computed after turn 1 \| 478 \| 201 \(42\.1 %\) \|$`,
		}},
		// Turn 1: 275 tokens and <think>; turn 2 resends the 275, </think>,
		// the answer but its 2 reasoning tokens, 200 more and <think>.
		{"thinking", []string{"--reasoning", "2"}, []string{
			`(?m)^multi-turn: .*, thinking: the first 2 of them reasoning, dropped from the next turn$`,
			`(?m)^  2 +478 +275 `,
			`(?m)^  after turn 1: 478 prompt tokens, 203 recomputed`,
			`(?m)^\| 2-turn chat .*thinking.*: prompt tokens computed after turn 1 \| 478 \| 203 \(42\.5 %\) \|$`,
		}},
	} {
		var out bytes.Buffer
		if err := runPrefix(append(args, tc.extra...), &out, io.Discard); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, re := range tc.want {
			if !regexp.MustCompile(re).MatchString(out.String()) {
				t.Errorf("%s: output lacks %s:\n%s", tc.name, re, out.String())
			}
		}
	}
}

func TestParsePrefix(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--prefix", "0"}, "--prefix"},
		{[]string{"--turns", "-1"}, "--turns >= 0"},
		{[]string{"--device", "tpu"}, "want cpu or cuda"},
		{[]string{"--kv-cache-gib", "0"}, "--kv-cache-gib"},
		{[]string{"--first-turn", "-1"}, "--first-turn"},
		{[]string{"--reasoning", "40"}, "--reasoning"},
		{[]string{"--reasoning", "-1"}, "--reasoning"},
		{[]string{"--reasoning", "39"}, ""},
		{[]string{"x"}, "unexpected arguments"},
		{[]string{"--model", "synth:flash:99"}, "layers"},
		{[]string{"--model", "synth:flash:4", "--device", "cuda"}, ""},
	} {
		_, err := parsePrefix(tc.args, io.Discard)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
	if f, err := parsePrefix([]string{"--model", "synth:flash:4"}, io.Discard); err != nil || f.stack.preset != "flash" || f.stack.layers != 4 {
		t.Errorf("--model synth:flash:4: %+v, %v", f, err)
	}
}
