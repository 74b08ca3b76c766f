package main

import (
	"bytes"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/megamoe/megamoe/checkpoint"
)

// TestFloorSplit: the layers' and the head's floors add up to the step's
// floor without the MTP block, and the head's is its weight and hc_head.
func TestFloorSplit(t *testing.T) {
	full, err := checkpoint.PresetConfig("flash")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		layers, batch int
		mtp           bool
	}{{4, 1, false}, {4, 64, false}, {43, 8, false}, {2, 1, true}} {
		c, err := checkpoint.CutLayers(full, tc.layers, tc.mtp)
		if err != nil {
			t.Fatal(err)
		}
		s := decodeFloorSplit(c, nil, tc.batch)
		noMTP, err := checkpoint.CutLayers(full, tc.layers, false)
		if err != nil {
			t.Fatal(err)
		}
		if total := decodeFloorBytes(noMTP, nil, tc.batch); s.layers+s.head != total {
			t.Errorf("%+v: layers %d + head %d != floor %d", tc, s.layers, s.head, total)
		}
		// head.weight is vocab × dim bf16; norm and hc_head add little.
		if hw := int64(c.Vocab) * int64(c.Dim) * 2; s.head < hw || s.head > hw+hw/100 {
			t.Errorf("%+v: head floor %d bytes, want about %d", tc, s.head, hw)
		}
	}
}

// TestFloorReport: the layers-alone and projection lines follow from the
// step, the head's time and the floors: what they print, and their sums.
func TestFloorReport(t *testing.T) {
	full, err := checkpoint.PresetConfig("flash")
	if err != nil {
		t.Fatal(err)
	}
	cut, err := checkpoint.CutLayers(full, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	const copyGBs = 3000
	num := `([0-9.]+)`
	layersRe := regexp.MustCompile(`(?m)^layers alone: ` + num + ` ms against ` + num + ` ms floor \(` + num +
		`×\): the step minus the head, ` + num + ` ms \((measured alone on the device; floor ` + num + ` ms|not measured: its floor)\)$`)
	projRe := regexp.MustCompile(`(?m)^projected full step \(43 layers at ` + num + ` ms each, and the head\): ` + num +
		` ms against its floor ` + num + ` ms \(` + num + `×\)$`)
	for _, tc := range []struct {
		name   string
		batch  int
		steps  []time.Duration
		headMs float64
		how    string
	}{
		{"measured head", 1, []time.Duration{1600 * time.Microsecond, 1450 * time.Microsecond, 1500 * time.Microsecond}, 0.42, "measured"},
		{"head floor", 8, []time.Duration{3360 * time.Microsecond}, 0, "not measured: its floor"},
		{"batch 64", 64, []time.Duration{11330 * time.Microsecond, 11000 * time.Microsecond}, 0.45, "measured"},
	} {
		var out bytes.Buffer
		fr := &floorReport{cut: cut, full: full, batch: tc.batch, copyGBs: copyGBs, headMs: tc.headMs}
		fr.print(&out, tc.steps)
		t.Log(out.String())
		m := layersRe.FindStringSubmatch(out.String())
		p := projRe.FindStringSubmatch(out.String())
		if m == nil || p == nil || !strings.HasPrefix(m[5], tc.how) {
			t.Errorf("%s: output lacks the layers-alone or projection line (head: %s):\n%s", tc.name, tc.how, out.String())
			continue
		}
		f := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
		split, whole := decodeFloorSplit(cut, nil, tc.batch), decodeFloorSplit(full, nil, tc.batch)
		msOf := func(b int64) float64 { return float64(b) / (copyGBs * 1e9) * 1e3 }
		sorted := slices.Clone(tc.steps)
		slices.Sort(sorted)
		step := ms(sorted[len(sorted)/2])
		head := tc.headMs
		if head == 0 {
			head = msOf(split.head)
		}
		layers := step - head
		perLayer := layers / 4
		type check struct {
			what      string
			got, want float64
		}
		checks := []check{
			{"layers alone", f(m[1]), layers},
			{"layers floor", f(m[2]), msOf(split.layers)},
			{"layers ratio", f(m[3]), layers / msOf(split.layers)},
			{"head", f(m[4]), head},
			{"per layer", f(p[1]), perLayer},
			{"projected", f(p[2]), head + 43*perLayer},
			{"full floor", f(p[3]), msOf(whole.layers + whole.head)},
			{"projected ratio", f(p[4]), (head + 43*perLayer) / msOf(whole.layers+whole.head)},
		}
		if tc.headMs > 0 {
			checks = append(checks, check{"head floor", f(m[6]), msOf(split.head)})
		}
		for _, c := range checks {
			if math.Abs(c.got-c.want) > 0.006*max(1, math.Abs(c.want)) {
				t.Errorf("%s: %s %v, want %.4f", tc.name, c.what, c.got, c.want)
			}
		}
	}
	// A head longer than the step leaves nothing to the layers.
	var out bytes.Buffer
	(&floorReport{cut: cut, full: full, batch: 1, copyGBs: copyGBs, headMs: 2}).print(&out, []time.Duration{time.Millisecond})
	if !regexp.MustCompile(`(?m)^layers alone: not measured \(the step median 1\.000 ms is not longer than the head, 2\.000 ms\)$`).MatchString(out.String()) {
		t.Errorf("head longer than the step:\n%s", out.String())
	}
}
