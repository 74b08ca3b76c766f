package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/models"
)

func TestCapacityFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
		check   func(*options) bool
	}{
		{nil, "", func(o *options) bool { return o.maxModelLen == 0 && o.kvCacheMemory == 0 && o.gpuMemUtil == 0.9 }},
		{[]string{"--max-model-len", "1048576", "--kv-cache-memory", "1000", "--gpu-memory-utilization", "1"}, "",
			func(o *options) bool { return o.maxModelLen == 1<<20 && o.kvCacheMemory == 1000 && o.gpuMemUtil == 1 }},
		{[]string{"--max-model-len", "0"}, "--max-model-len", nil},
		{[]string{"--max-model-len", "-5"}, "--max-model-len", nil},
		{[]string{"--kv-cache-memory", "0"}, "--kv-cache-memory", nil},
		{[]string{"--kv-cache-memory", "-1"}, "--kv-cache-memory", nil},
		{[]string{"--gpu-memory-utilization", "0"}, "--gpu-memory-utilization", nil},
		{[]string{"--gpu-memory-utilization", "1.5"}, "--gpu-memory-utilization", nil},
		{[]string{"--gpu-memory-utilization", "NaN"}, "--gpu-memory-utilization", nil},
	} {
		o, err := parseFlags(tc.args, io.Discard)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.wantErr)
		case tc.check != nil && !tc.check(o):
			t.Errorf("%q: options %+v", tc.args, o)
		}
	}
}

func TestContextLength(t *testing.T) {
	const mp = 1 << 20
	for _, tc := range []struct {
		name               string
		requested, maxPos  int
		fit                int
		want               int
		lowered            bool
		wantErr1, wantErr2 string
	}{
		{"default: the config's when it fits", 0, mp, mp + 256, mp, false, "", ""},
		{"default: the longest that fits", 0, mp, 4096, 4096, true, "", ""},
		{"default without max positions", 0, 0, 8192, 8192, false, "", ""},
		{"requested fits", 32768, mp, 32768, 32768, false, "", ""},
		{"requested beyond max positions", mp + 1, mp, 2 * mp, 0, false, "exceeds the model's max_position_embeddings 1048576", "--max-model-len 1048577"},
		{"requested beyond the cache", mp, mp, 4096, 0, false, "at most 4096 tokens", "--max-model-len 1048576 does not fit"},
		{"cache holds nothing", 0, mp, 0, 0, false, "cannot hold one sequence", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, lowered, err := contextLength(tc.requested, tc.maxPos, tc.fit, 1<<20)
			if tc.wantErr1 != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr1) || !strings.Contains(err.Error(), tc.wantErr2) {
					t.Fatalf("error %v, want %q and %q", err, tc.wantErr1, tc.wantErr2)
				}
				return
			}
			if err != nil || n != tc.want || lowered != tc.lowered {
				t.Fatalf("%d, lowered %v, %v; want %d, lowered %v", n, lowered, err, tc.want, tc.lowered)
			}
		})
	}
}

func TestDeviceBudget(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name    string
		d       deviceBudget
		want    int64
		wantErr string
	}{
		{"H100-like", deviceBudget{util: 0.9, total: 80 * gib, used: 40 * gib, workspace: 2 * gib, slots: gib}, 72*gib - 43*gib, ""},
		{"whole device", deviceBudget{util: 1, total: 10 * gib, used: 4 * gib}, 6 * gib, ""},
		{"others' memory counts", deviceBudget{util: 0.5, total: 10 * gib, used: 5 * gib}, 0, "nothing is left for the KV cache"},
		{"workspace too large", deviceBudget{util: 0.9, total: 10 * gib, used: 4 * gib, workspace: 5 * gib}, 0, "raise --gpu-memory-utilization"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.d.cacheBytes()
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
			case err != nil || got != tc.want:
				t.Fatalf("%d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// On the embedded model (CPU): the default context is the config's when the
// default cache holds it, else the longest the cache holds (logged with the
// cache figures); a --max-model-len the cache cannot hold is refused at
// start-up, naming the longest that fits.
func TestStartupContextLength(t *testing.T) {
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	cfg, err := checkpoint.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	start := func(args ...string) (int, string, error) {
		t.Helper()
		o, err := parseFlags(append([]string{"--device", "cpu", "--threads", "2"}, args...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		_, _, eng, err := load(dir, o, slog.New(slog.NewTextHandler(&logs, nil)), newProgress(io.Discard, 4))
		if err != nil {
			return 0, logs.String(), err
		}
		return eng.Config().MaxModelLen, logs.String(), nil
	}
	n, logs, err := start()
	if err != nil {
		t.Fatal(err)
	}
	if n != cfg.MaxPositions {
		t.Fatalf("default context %d with the default cache, want the config's %d", n, cfg.MaxPositions)
	}
	for _, want := range []string{"KV cache component", "bytes_per_token=", "fixed_bytes_per_seq=", "tokens_one_seq=", "tokens_at_max_num_seqs="} {
		if !strings.Contains(logs, want) {
			t.Errorf("start-up log lacks %q:\n%s", want, logs)
		}
	}
	fit, logs, err := start("--kv-cache-memory", "16777216")
	if err != nil {
		t.Fatal(err)
	}
	if fit >= cfg.MaxPositions || fit < 256 || !strings.Contains(logs, fmt.Sprintf("context length lowered to what the KV cache holds\" max_model_len=%d", fit)) {
		t.Fatalf("16 MiB cache: context %d, log:\n%s", fit, logs)
	}
	if _, _, err := start("--kv-cache-memory", "16777216", "--max-model-len", fmt.Sprint(fit)); err != nil {
		t.Fatalf("--max-model-len %d, the longest that fits: %v", fit, err)
	}
	_, _, err = start("--kv-cache-memory", "16777216", "--max-model-len", fmt.Sprint(fit+1))
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at most %d tokens", fit)) {
		t.Fatalf("--max-model-len %d beyond the cache: %v, want a refusal naming %d", fit+1, err, fit)
	}
}
