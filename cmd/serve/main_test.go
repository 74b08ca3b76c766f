package main

import (
	"io"
	"log/slog"

	"github.com/megamoe/megamoe/backend/gpu"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"--device", "cpu", "--port", "9000", "--max-num-seqs", "8"}, ""},
		{[]string{"--device", "cuda"}, ""},
		{[]string{"--device", "tpu"}, "want cpu, cuda or auto"},
		{[]string{"--port", "70000"}, "out of range"},
		{[]string{"--max-num-seqs", "0"}, "--max-num-seqs"},
		{[]string{"--max-num-batched-tokens", "0"}, "--max-num-batched-tokens"},
		{[]string{"--max-num-batched-tokens", "1000000"}, "--max-num-batched-tokens"},
		{[]string{"--max-model-len", "1"}, "--max-model-len"},
		{[]string{"--kv-cache-memory", "0"}, "--kv-cache-memory"},
		{[]string{"--threads", "-1"}, "--threads"},
		{[]string{"--shutdown-timeout", "0s"}, "--shutdown-timeout"},
		{[]string{"--shutdown-timeout", "5s"}, ""},
		{[]string{"--read-timeout", "0s"}, "--read-timeout"},
		{[]string{"--idle-timeout", "-1s"}, "--idle-timeout"},
		{[]string{"--write-idle-timeout", "2s", "--read-timeout", "3s", "--idle-timeout", "4s"}, ""},
		{[]string{"--max-header-bytes", "100"}, "--max-header-bytes"},
		{[]string{"--max-queued-per-conn", "-1"}, "--max-queued-per-conn"},
		{[]string{"--max-queued-per-conn", "0"}, ""},
		{[]string{"--served-model-name", "a,b", "--served-model-name", "c"}, ""},
		{[]string{"--served-model-name", "a,,b"}, "empty model name"},
		{[]string{"--allowed-origins", `["https://a.example","*"]`}, ""},
		{[]string{"--allowed-origins", `[1]`}, "allowed-origins"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--tensor-parallel", "2"}, ""},
		{[]string{"--tensor-parallel", "0"}, "--tensor-parallel"},
		{[]string{"--speculative-config", `{"method":"mtp","num_speculative_tokens":2}`}, ""},
		{[]string{"--speculative-config", `{"method":"mtp","num_speculative_tokens":2}`, "--num-speculative-tokens", "2"}, ""},
		{[]string{"--speculative-config", `{"method":"mtp","num_speculative_tokens":2}`, "--num-speculative-tokens", "3"}, "contradicts"},
		{[]string{"--speculative-config", `{"method":"mtp","num_speculative_tokens":20}`}, "num_speculative_tokens 20 out of"},
		{[]string{"--speculative-config", `{"method":"ngram","num_speculative_tokens":2}`}, `method "ngram"`},
		{[]string{"--speculative-config", `{"method":"mtp",`}, "speculative config"},
		{[]string{"--num-speculative-tokens", "2"}, ""},
		{[]string{"--num-speculative-tokens", "-1"}, "--num-speculative-tokens"},
		{[]string{"--no-enable-prefix-caching"}, ""},
		{[]string{"--enable-prefix-caching=false"}, ""},
	} {
		o, err := parseFlags(tc.args, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.wantErr)
		case tc.wantErr == "" && (o.host != "0.0.0.0" || o.port == 0):
			t.Errorf("%q: defaults %+v", tc.args, o)
		case tc.wantErr == "" && o.prefixCaching == strings.Contains(strings.Join(tc.args, " "), "prefix-caching"):
			t.Errorf("%q: prefix caching %v", tc.args, o.prefixCaching)
		}
	}
}

// TestPickBackend: without a usable GPU, cuda is a clear error and auto falls
// back to the CPU (nil backend).
func TestPickBackend(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if be, err := pickBackend("cpu", gpu.Options{Graphs: true}, log); be != nil || err != nil {
		t.Fatalf("cpu: %v, %v", be, err)
	}
	g, gerr := gpu.New(gpu.Options{})
	if gerr == nil {
		g.Close()
		t.Skip("a GPU is usable here")
	}
	if _, err := pickBackend("cuda", gpu.Options{Graphs: true}, log); err == nil || !strings.Contains(err.Error(), "--device cuda") {
		t.Errorf("cuda without GPU: %v", err)
	}
	if be, err := pickBackend("auto", gpu.Options{Graphs: true}, log); be != nil || err != nil {
		t.Errorf("auto without GPU: %v, %v", be, err)
	}
}
