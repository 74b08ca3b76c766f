package model

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

// loadSmall generates and loads the "small" checkpoint preset in format f.
func loadSmall(t testing.TB, f string) *checkpoint.Weights {
	return loadGenerated(t, checkpoint.GenSpec{Format: f, Seed: 1})
}

// loadGenerated generates and loads a checkpoint for the test.
func loadGenerated(t testing.TB, spec checkpoint.GenSpec) *checkpoint.Weights {
	t.Helper()
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), spec.Format+spec.Preset), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return w
}

// TestSmallCheckpoint runs the generated small checkpoint (6 layers: SWA, CSA,
// HCA, CSA, HCA, CSA + MTP) end to end: finite logits over a 300-token prompt,
// chunked == whole prefill, and the NVFP4 (lossless cast) checkpoint gives the
// same logits as the official MXFP4 one.
func TestSmallCheckpoint(t *testing.T) {
	official := loadSmall(t, checkpoint.GenOfficial)
	nv := loadSmall(t, checkpoint.GenNVFP4)
	c := official.Config
	toks := prompt(300, c.Vocab, 21)
	var res [2][][]float32
	for i, w := range []*checkpoint.Weights{official, nv} {
		m, err := New(w, nil, Options{})
		if err != nil {
			t.Fatal(err)
		}
		res[i] = run(t, m, toks, nil)
		if i == 0 {
			for p, row := range res[0] {
				for _, v := range row {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						t.Fatalf("non-finite logit at %d", p)
					}
				}
			}
			got := run(t, m, toks, []int{7})
			if d, at := maxRelDiff(res[0], got); d > tol["faithful"] {
				t.Errorf("chunks of 7: %.3g at %d", d, at)
			}
		}
	}
	if d, at := maxRelDiff(res[0], res[1]); d != 0 {
		t.Errorf("nvfp4 vs official: %.3g at %d", d, at)
	}
}
