package models

import (
	"bytes"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

// TestSmallIsReproducible proves the committed model comes from mkmodel:
// regenerating with the recorded arguments gives the same files byte for byte.
func TestSmallIsReproducible(t *testing.T) {
	dir := t.TempDir()
	if err := checkpoint.Generate(dir, checkpoint.GenSpec{Format: SmallFormat, Seed: SmallSeed, Preset: "small"}); err != nil {
		t.Fatal(err)
	}
	names, err := smallFiles()
	if err != nil {
		t.Fatal(err)
	}
	gen, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(gen) != len(names) {
		t.Errorf("generated %d files, embedded %d", len(gen), len(names))
	}
	for _, n := range names {
		want, err := fs.ReadFile(Small(), n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: regenerated file differs from the committed one (%v); rerun go generate ./models", n, err)
		}
	}
}

// TestExtractSmall extracts once, reuses the extraction, and the result loads
// and runs with finite, O(1) logits.
func TestExtractSmall(t *testing.T) {
	root := t.TempDir()
	dir, err := extractSmall(root)
	if err != nil {
		t.Fatal(err)
	}
	again, err := extractSmall(root)
	if err != nil || again != dir {
		t.Fatalf("second extraction: %q, %v (first %q)", again, err, dir)
	}
	ents, _ := os.ReadDir(root)
	if len(ents) != 1 {
		t.Errorf("cache root holds %d entries, want 1 (no leftover temp dirs)", len(ents))
	}
	w, st, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := model.New(w, nil, model.Options{TraceNonFinite: true})
	if err != nil {
		t.Fatal(err)
	}
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	toks := make([]int32, 40) // longer than the 16-token window and several CSA/HCA blocks
	for i := range toks {
		toks[i] = int32((i*37 + 5) % w.Config.Vocab)
	}
	o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks, AllLogits: true}}})
	if err != nil {
		t.Fatal(err)
	}
	for i, row := range o.Rows(0) {
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		if rms := math.Sqrt(ss / float64(len(row))); !(rms > 0.1 && rms < 10) {
			t.Fatalf("position %d: logit rms %g, want a healthy O(1) value", i, rms)
		}
	}
}

// TestNVFP4SameLogits: the NVFP4 variant of the same seed is a lossless cast,
// so the forward pass gives the same logits as the embedded official model.
func TestNVFP4SameLogits(t *testing.T) {
	dirs := []string{"", t.TempDir()}
	var err error
	if dirs[0], err = extractSmall(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.Generate(dirs[1], checkpoint.GenSpec{Format: "nvfp4", Seed: SmallSeed}); err != nil {
		t.Fatal(err)
	}
	var logits [2][]float32
	for i, dir := range dirs {
		w, st, err := checkpoint.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		m, err := model.New(w, nil, model.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s := m.Cache().NewSequence()
		toks := []int32{3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19, 71}
		o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks, AllLogits: true}}})
		if err != nil {
			t.Fatal(err)
		}
		logits[i] = o.Logits[0]
		m.FreeSequence(s)
	}
	for j := range logits[0] {
		if logits[0][j] != logits[1][j] {
			t.Fatalf("logit %d: official %g, nvfp4 %g", j, logits[0][j], logits[1][j])
		}
	}
}
