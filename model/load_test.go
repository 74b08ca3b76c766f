package model

import (
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

// TestLoadedEqualsInMemory writes the synthetic checkpoint to disk, loads it
// with checkpoint.Load and checks that the forward pass is bit-identical.
func TestLoadedEqualsInMemory(t *testing.T) {
	dir := t.TempDir()
	w := genWeights(t, checkpoint.SmallConfig(), 1)
	if err := checkpoint.Save(dir, w); err != nil {
		t.Fatal(err)
	}
	lw, st, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	toks := prompt(40, 512, 2)
	var res [2][][]float32
	for i, ww := range []*checkpoint.Weights{w, lw} {
		m, err := New(ww, nil, Options{})
		if err != nil {
			t.Fatal(err)
		}
		res[i] = run(t, m, toks, nil)
	}
	if d, at := maxRelDiff(res[0], res[1]); d != 0 {
		t.Fatalf("loaded checkpoint differs: %.3g at %d", d, at)
	}
}
