package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadTorchFP8(t *testing.T) {
	for _, c := range []struct {
		name, text string
		want       map[torchKey]float64
		err        string
	}{
		{"fp8 only", `{"kind": "copy", "shape": "1 GiB d2d", "us": 700, "gbs": 3000}
{"kind": "bf16", "model": "flash", "shape": "wq_a", "m": 512, "n": 1024, "k": 4096, "us": 20}
{"kind": "fp8", "model": "flash", "shape": "wq_a", "m": 512, "n": 1024, "k": 4096, "us": 10.5}
{"kind": "fp8", "model": "pro", "shape": "wq_b", "m": 4096, "n": 65536, "k": 1536, "error": "refused"}
`, map[torchKey]float64{{"flash", "wq_a", 512}: 10.5}, ""},
		{"no fp8", `{"kind": "copy", "us": 1}` + "\n", nil, "no fp8 records"},
		{"bad line", "{\"kind\": \"fp8\"\nnot json\n", nil, "line 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "torch.jsonl")
			if err := os.WriteFile(p, []byte(c.text), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := loadTorchFP8(p)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || len(got) != len(c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Errorf("%v = %v, want %v", k, got[k], v)
				}
			}
		})
	}
}

func TestWriteBestPaths(t *testing.T) {
	torch := map[torchKey]float64{{"flash", "wq_b", 4096}: 90}
	recs := []kernelRecord{
		{Model: "flash", Op: "linear_fp8", Shape: "wq_b", Tokens: 4096, Path: "wg", Auto: true, Us: 150, Pass: true},
		{Model: "flash", Op: "linear_fp8", Shape: "wq_b", Tokens: 4096, Path: "wg-bulk", Us: 100, Pass: true},
		{Model: "flash", Op: "linear_fp8", Shape: "wq_b", Tokens: 4096, Path: "wg-n192", Us: 90, Pass: false},      // failed: not a pick
		{Model: "flash", Op: "linear_fp8", Shape: "wq_a", Tokens: 512, Path: "wg", Auto: true, Us: 10, Pass: true}, // one path
	}
	var b strings.Builder
	writeBestPaths(&b, recs, torch)
	out := b.String()
	for _, want := range []string{"auto wg", "150.0 us  60.0%", "best wg-bulk", "100.0 us  90.0%"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "wq_a") || strings.Contains(out, "wg-n192") {
		t.Errorf("single-path shape or failed path listed:\n%s", out)
	}
}
