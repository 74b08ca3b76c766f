package main

import (
	"bytes"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestKVReport checks `bench kv`: one line per component, the fp32 line and
// the final compact line, against the byte targets of issue 31.
func TestKVReport(t *testing.T) {
	cases := []struct {
		args       []string
		preset     string
		components int
		tokens     int
		fp32       float64 // today's bytes/token
		maxCompact float64 // target bytes/token
	}{
		{[]string{"--preset", "flash"}, "flash", 10, 1 << 20, 13760, 3600},
		{[]string{"--preset", "pro", "--context", "131072"}, "pro", 9, 131072, 19696, 5100},
		{[]string{"--preset", "small", "--context", "4096"}, "small", 10, 4096, 584, 584},
	}
	row := regexp.MustCompile(`^(window ring|compressed KV|indexer keys|compressor state|indexer compressor state) \((SWA|CSA|HCA|MTP)\) +\d+ +(\d+|-) +[0-9.]+ +\d+ +[0-9.]+ +\d+$`)
	last := regexp.MustCompile(`^(\w+): ([0-9.]+) bytes/token, ([0-9.]+) GiB at (\d+) tokens$`)
	for _, c := range cases {
		var out bytes.Buffer
		if err := runKV(c.args, &out, io.Discard); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		rows := 0
		for _, l := range lines {
			if row.MatchString(l) {
				rows++
			}
		}
		if rows != c.components {
			t.Errorf("%s: %d component lines, want %d:\n%s", c.preset, rows, c.components, out.String())
		}
		m := last.FindStringSubmatch(lines[len(lines)-1])
		f := regexp.MustCompile(`^fp32 store: ([0-9.]+) bytes/token, [0-9.]+ GiB at \d+ tokens$`).FindStringSubmatch(lines[len(lines)-2])
		if m == nil || f == nil {
			t.Fatalf("%s: last lines are not the fp32 and the compact totals:\n%s", c.preset, out.String())
		}
		b, _ := strconv.ParseFloat(m[2], 64)
		g, _ := strconv.ParseFloat(m[3], 64)
		b32, _ := strconv.ParseFloat(f[1], 64)
		if m[1] != c.preset || m[4] != strconv.Itoa(c.tokens) {
			t.Errorf("%s: last line %q", c.preset, lines[len(lines)-1])
		}
		if b > c.maxCompact || b32 != c.fp32 || b >= b32/3 {
			t.Errorf("%s: %v bytes/token compact (target %v), %v fp32 (want %v)", c.preset, b, c.maxCompact, b32, c.fp32)
		}
		// The entries dominate at length: the GiB figure is at least B·N.
		if lo := b * float64(c.tokens) / (1 << 30); g < lo-0.01 || (c.tokens >= 1<<17 && g > 1.1*lo) {
			t.Errorf("%s: %v GiB at %d tokens for %v bytes/token", c.preset, g, c.tokens, b)
		}
	}
	for _, args := range [][]string{{"--preset", "huge"}, {"--context", "-5"}, {"extra"}} {
		if err := runKV(args, io.Discard, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
