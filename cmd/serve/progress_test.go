package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func TestRenderBar(t *testing.T) {
	for _, tc := range []struct {
		done, total int
		label       string
		elapsed     time.Duration
		want        string
	}{
		{0, 4, "reading checkpoint", 0, "[" + strings.Repeat(" ", 30) + "] 0/4 reading checkpoint 0s"},
		{1, 4, "loading tokenizer", 1234 * time.Millisecond, "[" + strings.Repeat("=", 7) + strings.Repeat(" ", 23) + "] 1/4 loading tokenizer 1.2s"},
		{2, 3, "x", time.Minute, "[" + strings.Repeat("=", 20) + strings.Repeat(" ", 10) + "] 2/3 x 1m0s"},
		{4, 4, "loaded", 0, "[" + strings.Repeat("=", 30) + "] 4/4 loaded 0s"},
		{9, 4, "clamped", 0, "[" + strings.Repeat("=", 30) + "] 4/4 clamped 0s"},
		{-1, 0, "no total", 0, "[" + strings.Repeat(" ", 30) + "] 0/1 no total 0s"},
	} {
		if got := renderBar(tc.done, tc.total, tc.label, tc.elapsed); got != tc.want {
			t.Errorf("renderBar(%d, %d, %q, %v) = %q, want %q", tc.done, tc.total, tc.label, tc.elapsed, got, tc.want)
		}
	}
}

func TestProgress(t *testing.T) {
	if p := newProgress(&bytes.Buffer{}, 2); p != nil {
		t.Fatal("a bar on a buffer, which is not a terminal")
	}
	if f, err := os.CreateTemp(t.TempDir(), "stderr"); err != nil {
		t.Fatal(err)
	} else if p := newProgress(f, 2); p != nil {
		t.Fatal("a bar on a regular file")
	}
	var nilBar *progress // what newProgress gives off a terminal: every call is a no-op
	nilBar.stage("x")
	nilBar.finish(true)

	for _, tc := range []struct {
		ok       bool
		lastLine string
	}{{true, "2/2 loaded"}, {false, "1/2 b"}} {
		var buf bytes.Buffer
		p := startProgress(&buf, 2)
		p.stage("a")
		p.stage("b")
		p.finish(tc.ok)
		out := buf.String()
		if !strings.HasSuffix(out, "\x1b[K\n") || strings.Count(out, "\n") != 1 {
			t.Errorf("ok=%v: output %q does not end in one cleared, finished line", tc.ok, out)
		}
		frames := strings.Split(strings.TrimSuffix(out, "\n"), "\r")[1:]
		if len(frames) < 3 || !strings.Contains(frames[0], "0/2 a") || !strings.Contains(frames[1], "1/2 b") ||
			!strings.Contains(frames[len(frames)-1], tc.lastLine) {
			t.Errorf("ok=%v: frames %q, want 0/2 a, 1/2 b, …, %s", tc.ok, frames, tc.lastLine)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {3 << 20, "3.0 MiB"}, {1536 << 20, "1.5 GiB"}, {5 << 40, "5.0 TiB"}, {5 << 50, "5120.0 TiB"}} {
		if got := formatBytes(tc.n); got != tc.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
