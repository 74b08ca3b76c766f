package checkpoint

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/safetensors"
)

// flatten lists every tensor of w with its linears' fp32 scalars, in walk
// order, as comparable strings and bytes.
func flatten(w *Weights) (names []string, data [][]byte) {
	add := func(t safetensors.Tensor) {
		if t.Valid() {
			names = append(names, fmt.Sprintf("%s %s %v", t.Name, t.DType, t.Shape))
			data = append(data, t.Data)
		}
	}
	w.Walk(func(l *Linear) {
		names = append(names, fmt.Sprintf("%s %v scalars %g %g", l.Name, l.Format, l.Scale2, l.InputScale))
		data = append(data, nil)
		add(l.Weight)
		add(l.Scale)
	}, add)
	return names, data
}

func sameWeights(t *testing.T, what string, got, want *Weights) {
	t.Helper()
	gn, gd := flatten(got)
	wn, wd := flatten(want)
	if !slices.Equal(gn, wn) {
		t.Fatalf("%s: %d tensors %v..., want %d %v...", what, len(gn), gn[:min(3, len(gn))], len(wn), wn[:min(3, len(wn))])
	}
	for i := range gd {
		if !bytes.Equal(gd[i], wd[i]) {
			t.Fatalf("%s: %s differs", what, gn[i])
		}
	}
}

// TestGenWeightsIsGenerate: the in-memory weights are the bytes Generate
// writes, and Save writes them back loadably.
func TestGenWeightsIsGenerate(t *testing.T) {
	for _, format := range []string{GenOfficial, GenNVFP4} {
		t.Run(format, func(t *testing.T) {
			if testing.Short() && format != GenOfficial {
				t.Skip("-short: the official format only (each format trains the tokenizer and writes a checkpoint)")
			}
			dir := filepath.Join(t.TempDir(), "gen")
			lw, st, err := GenerateLoad(dir, GenSpec{Format: format, Seed: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			w, err := GenWeights(lw.Config, format, 4)
			if err != nil {
				t.Fatal(err)
			}
			sameWeights(t, "GenWeights vs Generate", w, lw)

			sdir := filepath.Join(t.TempDir(), "saved")
			if err := Save(sdir, w); err != nil {
				t.Fatal(err)
			}
			sw, sst, err := Load(sdir)
			if err != nil {
				t.Fatal(err)
			}
			defer sst.Close()
			sameWeights(t, "Save then Load", sw, w)
		})
	}
}

func TestGenWeightsErrors(t *testing.T) {
	bad := SmallConfig()
	bad.Heads = 0
	for _, c := range []struct {
		name   string
		c      *Config
		format string
	}{{"format", SmallConfig(), "fp16"}, {"config", bad, GenOfficial}} {
		if _, err := GenWeights(c.c, c.format, 1); err == nil {
			t.Errorf("%s: GenWeights accepted it", c.name)
		}
	}
}
