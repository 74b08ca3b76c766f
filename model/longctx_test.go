package model

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/megamoe/megamoe/checkpoint"
)

// TestLongContext runs checkpoint.LongConfig (SWA, CSA and HCA layers) over
// 32,832 tokens: 8,208 CSA entries for index_topk 8, 256 HCA entries, RoPE
// positions 8x past YaRN's original context. In each numerics the whole
// prefill is compared with chunks of 1,000 followed by 128 decode steps
// (across HCA entry 255 at position 32,767), then 16 greedy steps.
// Exact numerics must give the same logits bit for bit: every op is row-local
// and each row reads its keys in the same order and 64-slot blocks in both
// schedules. Faithful numerics must give the same greedy token at every
// position; its logits difference is logged (0 on this config, but the §5.7
// P-rounding partition differs between schedules when the window is longer
// than a first chunk: consistency_test.go).
func TestLongContext(t *testing.T) {
	if testing.Short() {
		t.Skip("long context: about 2 minutes of CPU time")
	}
	checkLong(t, 32768+64, 1000, 128, 16)
}

// checkLong compares the whole prefill of n tokens with chunks then decode
// steps, in both numerics (the default store of each: fp32 for exact,
// compact for faithful).
func checkLong(t *testing.T, n, chunk, decode, gen int) {
	c := checkpoint.LongConfig()
	if n/4 <= 4*c.IndexTopK || n <= 2*c.RopeScaling.OriginalLen {
		t.Fatalf("%d tokens: want many more CSA entries than index_topk %d and positions past YaRN's %d", n, c.IndexTopK, c.RopeScaling.OriginalLen)
	}
	w := genWeights(t, c, 5)
	toks := prompt(n, c.Vocab, 13)
	for _, mode := range []string{"exact", "faithful"} {
		m, err := New(w, nil, Options{Numerics: mode, CacheBytes: 256 << 20})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		whole, gw := longRun(t, m, toks, n, 0, gen)
		mid := time.Now()
		split, gs := longRun(t, m, toks, chunk, decode, gen)
		t.Logf("%s: whole prefill of %d tokens + %d steps %v; chunks of %d + %d decode + %d steps %v",
			mode, n, gen, mid.Sub(start).Round(time.Millisecond), chunk, decode, gen, time.Since(mid).Round(time.Millisecond))
		for p, row := range whole {
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%s: non-finite logit at position %d", mode, p)
				}
			}
		}
		d, at := maxRelDiff(whole[:n], split[:n])
		t.Logf("%s: max rel diff %.3g at position %d; greedy whole %v, split %v", mode, d, at, gw, gs)
		if mode == "exact" {
			if d != 0 || math.IsNaN(d) {
				t.Errorf("exact: chunked/decoded logits differ from the whole prefill: %.3g at position %d", d, at)
			}
		}
		for p := range n {
			if a, b := argmax(whole[p]), argmax(split[p]); a != b {
				t.Errorf("%s: greedy token at position %d: whole %d, split %d", mode, p, a, b)
				break
			}
		}
		if !slices.Equal(gw, gs) {
			t.Errorf("%s: greedy continuation: whole %v, split %v", mode, gw, gs)
		}
	}
}

// longRun feeds toks to a fresh sequence: chunks of chunk tokens up to
// len(toks)-decode, then decode steps one token at a time, then gen greedy
// steps (each feeding the argmax of the previous logits). It returns the
// logits of every fed position and the generated tokens.
func longRun(t *testing.T, m *Model, toks []int32, chunk, decode, gen int) ([][]float32, []int32) {
	t.Helper()
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	var out [][]float32
	step := func(tk []int32) {
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: tk, AllLogits: true}}})
		if err != nil {
			t.Fatalf("forward at position %d: %v", len(out), err)
		}
		out = append(out, o.Rows(0)...)
	}
	pre := len(toks) - decode
	for i := 0; i < pre; i += chunk {
		step(toks[i:min(i+chunk, pre)])
	}
	for i := pre; i < len(toks); i++ {
		step(toks[i : i+1])
	}
	var got []int32
	for range gen {
		got = append(got, argmax(out[len(out)-1]))
		step(got[len(got)-1:])
	}
	return out, got
}
