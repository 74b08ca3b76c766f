package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseHTTP(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{nil, ""},
		{[]string{"--concurrency", "1,8", "--prompt-tokens", "32", "--max-tokens", "4"}, ""},
		{[]string{"--serve", "--model", "synth:small", "--device", "cpu"}, ""},
		{[]string{"--concurrency", "0"}, "--concurrency"},
		{[]string{"--concurrency", "1,x"}, "--concurrency"},
		{[]string{"--concurrency", "5000"}, "<= 4096"},
		{[]string{"--prompt-tokens", "-3"}, "--prompt-tokens"},
		{[]string{"--max-tokens", "0"}, "--max-tokens"},
		{[]string{"--requests", "0"}, "--requests"},
		{[]string{"--requests", "100001"}, "--requests"},
		{[]string{"--prompt-tokens", "1048576"}, "1048576"},
		{[]string{"--warmup", "-2"}, "--warmup"},
		{[]string{"--serve", "--url", "http://x"}, "exclude"},
		{[]string{"--serve", "--device", "tpu"}, "--device"},
		{[]string{"--serve", "--numerics", "odd"}, "--numerics"},
		{[]string{"--serve", "--max-num-batched-tokens", "0"}, "--max-num-batched-tokens"},
		{[]string{"--stack-prefill", "0"}, "--stack-prefill"},
		{[]string{"extra"}, "unexpected"},
	} {
		_, err := parseHTTP(tc.args, io.Discard)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.err)
		}
	}
}

// TestComplete: a stream counts only when it ends with [DONE] and carries
// exactly the asked-for tokens.
func TestComplete(t *testing.T) {
	for _, tc := range []struct {
		name, body, err string
	}{
		{"ok", `data: {"choices":[{"text":"a"}]}` + "\n\n" + `data: {"choices":[{"text":"b"}]}` + "\n\n" +
			`data: {"choices":[],"usage":{"completion_tokens":2}}` + "\n\ndata: [DONE]\n\n", ""},
		{"short", `data: {"choices":[{"text":"a"}]}` + "\n\n" + `data: {"choices":[],"usage":{"completion_tokens":1}}` + "\n\ndata: [DONE]\n\n", "1 completion tokens, want 2"},
		{"cut", `data: {"choices":[{"text":"a"}]}` + "\n\n", "without [DONE]"},
		{"error event", `data: {"error":{"message":"boom"}}` + "\n\n", "boom"},
		{"garbage", "data: {nope\n\n", "stream event"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req map[string]any
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req["ignore_eos"] != true || req["stream"] != true {
				http.Error(w, fmt.Sprintf("bad request %v: %v", req, err), http.StatusBadRequest)
				return
			}
			io.WriteString(w, tc.body)
		}))
		s := newClient(srv.URL, 1).complete(t.Context(), []int32{1, 2, 3}, 2)
		srv.Close()
		if tc.err == "" && (s.err != nil || s.tokens != 2 || s.ttft <= 0 || s.total < s.ttft) ||
			tc.err != "" && (s.err == nil || !strings.Contains(s.err.Error(), tc.err)) {
			t.Errorf("%s: %+v, want error %q", tc.name, s, tc.err)
		}
	}
}

// TestHTTPServeSmallCPU serves the small model in process and measures it:
// every level answers, with stack steps and the ratio beside the HTTP numbers.
func TestHTTPServeSmallCPU(t *testing.T) {
	jl := filepath.Join(t.TempDir(), "out.jsonl")
	f, err := parseHTTP([]string{"--serve", "--model", "synth:small", "--prompt-tokens", "8,24", "--concurrency", "1,3",
		"--max-tokens", "4", "--requests", "2", "--stack-prefill", "8", "--stack-decode", "2", "--threads", "1", "--jsonl", jl}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := benchHTTP(t.Context(), f, &out, &errb); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "TPOT/step") || !strings.Contains(errb.String(), "stack decode step at batch 3") {
		t.Errorf("output:\n%s\n%s", out.String(), errb.String())
	}
	data, err := os.ReadFile(jl)
	if err != nil {
		t.Fatal(err)
	}
	var cells []cell
	for sc := bufio.NewScanner(bytes.NewReader(data)); sc.Scan(); {
		var c cell
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		cells = append(cells, c)
	}
	want := [][2]int{{8, 1}, {8, 3}, {24, 1}, {24, 3}}
	if len(cells) != len(want) {
		t.Fatalf("%d JSON lines, want %d:\n%s", len(cells), len(want), data)
	}
	for i, c := range cells {
		if c.Prompt != want[i][0] || c.Concurrency != want[i][1] || c.Requests != max(2, c.Concurrency) || c.Failed != 0 ||
			c.Output != 4 || c.TTFTp50 <= 0 || c.TPOTp50 <= 0 || c.OutTokS <= 0 || c.StepMs <= 0 || c.TPOTOverStep <= 0 {
			t.Errorf("level %d: %+v", i, c)
		}
	}
}

// TestHTTPHostOnly: the host-only model serves V4's vocabulary with no stack
// steps, and --host-only refuses a --model.
func TestHTTPHostOnly(t *testing.T) {
	for _, sampling := range []string{"false", "true"} { // logits rows, or ids drawn by the model
		f, err := parseHTTP([]string{"--serve", "--host-only", "--device-sampling=" + sampling, "--prompt-tokens", "16",
			"--concurrency", "1,2", "--max-tokens", "8", "--requests", "2", "--warmup", "0"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		if err := benchHTTP(t.Context(), f, &out, &errb); err != nil {
			t.Fatalf("device sampling %s: %v\n%s\n%s", sampling, err, out.String(), errb.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 4 || !strings.Contains(lines[0], "model host-only") || strings.Contains(errb.String(), "stack decode step") {
			t.Errorf("device sampling %s: output:\n%s\n%s", sampling, out.String(), errb.String())
		}
	}
	for _, args := range [][]string{{"--host-only"}, {"--serve", "--host-only", "--model", "synth:small"}} {
		if _, err := parseHTTP(args, io.Discard); err == nil || !strings.Contains(err.Error(), "--host-only") {
			t.Errorf("%q: %v", args, err)
		}
	}
}
