package models

import (
	"encoding/json"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/tokenizer"
)

// TestSmallIsTrainedSmall: the embedded model has the small architecture
// (checkpoint.SmallConfig) with the trained tokenizer's vocabulary and an
// index_topk covering a training sequence (train/train.py's CONFIG), within
// the 32 MB budget in shards of at most 16 MiB.
func TestSmallIsTrainedSmall(t *testing.T) {
	dir, err := extractSmall(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := checkpoint.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := checkpoint.SmallConfig()
	want.Vocab, want.IndexTopK = 4096, 64
	if c.Layers != want.Layers || c.Dim != want.Dim || c.Vocab != want.Vocab || c.IndexTopK != want.IndexTopK ||
		c.Experts != want.Experts || !slices.Equal(c.CompressRatios, want.CompressRatios) || c.MTPLayers != 1 {
		t.Errorf("config %+v, want the small architecture with vocab 4096 and index_topk 64", c)
	}
	var total int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		total += info.Size()
		if info.Size() > 16<<20 {
			t.Errorf("%s: %d bytes, over 16 MiB", e.Name(), info.Size())
		}
	}
	if total > 32e6 {
		t.Errorf("model takes %d bytes, over 32 MB", total)
	}
}

// smallPerplexity is the embedded model's perplexity on testdata/heldout.txt
// (the project's own dictionary-style text), faithful numerics, windows of
// 128 tokens, as `generate --perplexity models/testdata/heldout.txt
// --ppl-window 128` prints it. Retraining the model updates it.
const smallPerplexity = 68.319

// TestSmallPerplexity: the embedded model's held-out perplexity stays within
// 0.5% of the recorded value.
func TestSmallPerplexity(t *testing.T) {
	dir, err := extractSmall(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, st, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile("testdata/heldout.txt")
	if err != nil {
		t.Fatal(err)
	}
	ids := []int32{int32(w.Config.BOS)}
	for _, id := range tok.Encode(string(text)) {
		ids = append(ids, int32(id))
	}
	m, err := model.New(w, nil, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	loss, n, err := m.Perplexity(ids, 128)
	if err != nil {
		t.Fatal(err)
	}
	ppl := math.Exp(loss)
	t.Logf("%d tokens: perplexity %.3f", n, ppl)
	if math.Abs(ppl/smallPerplexity-1) > 0.005 {
		t.Errorf("perplexity %.3f, recorded %.3f (more than 0.5%% apart)", ppl, smallPerplexity)
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

// TestNVFP4SameLogits: mkmodel's NVFP4 format of a seed is a lossless cast
// of its official format, so the forward pass gives the same logits.
func TestNVFP4SameLogits(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	for i, format := range []string{"official", "nvfp4"} {
		if err := checkpoint.Generate(dirs[i], checkpoint.GenSpec{Format: format, Seed: SmallSeed}); err != nil {
			t.Fatal(err)
		}
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

// TestSmallTokenizerParity: the embedded model's tokenizer (trained by
// TrainBPE) gives Hugging Face's ids; the reference ids were made by
// tokenizer/testdata/gen/gen.js with npm tokenizers 0.23.2.
func TestSmallTokenizerParity(t *testing.T) {
	data, err := fs.ReadFile(Small(), "tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := os.ReadFile("testdata/tokenizer-parity.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	}
	if err := json.Unmarshal(ref, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if got := tok.Encode(c.Text); !slices.Equal(got, c.IDs) {
			t.Errorf("encode %.60q: %d ids, Hugging Face %d", c.Text, len(got), len(c.IDs))
		}
		if dec := tok.Decode(c.IDs); dec != c.Text {
			t.Errorf("decode of Hugging Face's ids for %.60q differs", c.Text)
		}
	}
}
