package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestParseSpecErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--num-speculative-tokens", "0"}, "--num-speculative-tokens"},
		{[]string{"--num-speculative-tokens", "2,x"}, "--num-speculative-tokens"},
		{[]string{"--temperature", "-1"}, "--temperature"},
		{[]string{"--max-tokens", "0"}, "--max-tokens"},
		{[]string{"--device", "tpu"}, "--device"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		_, err := parseSpec(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestSpecSmall measures the acceptance on the embedded small model over
// two chats: greedy answers with drafts equal plain decoding's, and the
// trained MTP block gets drafts accepted.
func TestSpecSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the small model and decodes through the engine")
	}
	chats := filepath.Join(t.TempDir(), "chats.jsonl")
	lines := `{"messages":[{"role":"user","content":"What does the word \"lantern\" mean?"}]}
{"messages":[{"role":"user","content":"What does the word \"river\" mean?"}]}
`
	if err := os.WriteFile(chats, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	args := []string{"--chats", chats, "--num-speculative-tokens", "1,2", "--temperature", "0,1", "--max-tokens", "24"}
	if err := runSpec(args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`(?m)^temperature 0  N=1: \d+ tokens, \d+ verifications, mean acceptance length 1\.[1-9]\d*, acceptance per position 0\.\d+, in \S+  outputs identical to plain decoding: yes$`,
		`(?m)^temperature 0  N=2: .* acceptance per position 0\.\d+ 0\.\d+, in \S+  outputs identical to plain decoding: yes$`,
		`(?m)^temperature 1  N=2: \d+ tokens, .*mean acceptance length [12]\.\d+`,
	} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("output lacks %s:\n%s", re, out.String())
		}
	}
}

func TestReadChatsErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, text, want string }{
		{"bad.jsonl", "{not json\n", "bad.jsonl:1"},
		{"nouser.jsonl", `{"messages":[{"role":"assistant","content":"x"}]}` + "\n", "no user message"},
		{"empty.jsonl", "", "no chats"},
	} {
		p := filepath.Join(dir, tc.name)
		if err := os.WriteFile(p, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readChats(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}
