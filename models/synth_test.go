package models

import (
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

func TestParseSynth(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
		layers, vocab int
	}{
		{in: "synth", want: "synth:small", layers: 6, vocab: 1024},
		{in: "synth:small", want: "synth:small", layers: 6, vocab: 1024},
		{in: "synth:small:2", want: "synth:small:2", layers: 2, vocab: 1024},
		{in: "synth:flash:4", want: "synth:flash:4", layers: 4, vocab: 129280},
		{in: "synth:flash", want: "synth:flash", layers: 43, vocab: 129280},
		{in: "synth:pro:61", want: "synth:pro:61", layers: 61, vocab: 129280},
		{in: "synth:pro:62", err: "want 1..61"},
		{in: "synth:flash:0", err: "want 1..43"},
		{in: "synth:flash:x", err: "layers"},
		{in: "synth:tiny", err: "preset"},
		{in: "synth:small-tp", err: "preset"},
		{in: "synth:flash:4:5", err: "want synth:small"},
		{in: "synthetic", err: "want synth:small"},
	} {
		s, err := ParseSynth(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseSynth(%q) = %v, %v; want error with %q", tc.in, s, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseSynth(%q): %v", tc.in, err)
			continue
		}
		c, err := s.Config()
		if err != nil {
			t.Errorf("%s: config: %v", tc.in, err)
			continue
		}
		if s.String() != tc.want || c.Layers != tc.layers || c.Vocab != tc.vocab {
			t.Errorf("%s: %s, %d layers, vocab %d; want %s, %d, %d", tc.in, s, c.Layers, c.Vocab, tc.want, tc.layers, tc.vocab)
		}
		if s.Preset != "small" && c.MTPLayers != 0 {
			t.Errorf("%s: %d MTP layers, want none", tc.in, c.MTPLayers)
		}
	}
	for _, m := range []string{"synth", "synth:flash:4"} {
		if !IsSynth(m) {
			t.Errorf("IsSynth(%q) = false", m)
		}
	}
	for _, m := range []string{"", "synthetic", "/data/synth:x", "./synth"} {
		if IsSynth(m) {
			t.Errorf("IsSynth(%q) = true", m)
		}
	}
}

// TestSynthSmallIsGenerated: synth:small at SmallSeed has the weights and
// tokenizer `mkmodel --preset small --seed 1` writes.
func TestSynthSmallIsGenerated(t *testing.T) {
	w, tok, err := Synth(SynthSpec{Preset: "small"}, SmallSeed)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := checkpoint.Generate(dir, checkpoint.GenSpec{Seed: SmallSeed, Preset: "small"}); err != nil {
		t.Fatal(err)
	}
	gen, st, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if tok.VocabSize() != gen.Config.Vocab {
		t.Errorf("tokenizer %d ids, generated model vocab %d", tok.VocabSize(), gen.Config.Vocab)
	}
	a, b := w.Layers[2].Attn.WqA.Weight.Data, gen.Layers[2].Attn.WqA.Weight.Data
	if len(a) == 0 || string(a) != string(b) {
		t.Errorf("layer 2 wq_a differs from the generated model's (%d vs %d bytes)", len(a), len(b))
	}
}
