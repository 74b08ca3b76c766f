package models

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/tokenizer"
)

// SynthPrefix starts a --model value that names an in-memory model with
// random weights instead of a checkpoint directory.
const SynthPrefix = "synth"

// SynthSpec is a parsed "synth:PRESET[:LAYERS]" model name.
type SynthSpec struct {
	Preset string // small, flash or pro
	Layers int    // main layers; 0 = all of the preset's
}

// IsSynth reports whether a --model value names a synthetic model.
func IsSynth(model string) bool {
	return model == SynthPrefix || strings.HasPrefix(model, SynthPrefix+":")
}

// ParseSynth parses "synth:small", "synth:flash:N" or "synth:pro:N" (N main
// layers, all when left out); a bare "synth" is synth:small.
func ParseSynth(model string) (SynthSpec, error) {
	parts := strings.Split(model, ":")
	if parts[0] != SynthPrefix || len(parts) > 3 {
		return SynthSpec{}, fmt.Errorf("model %q: want synth:small, synth:flash:N or synth:pro:N", model)
	}
	s := SynthSpec{Preset: "small"}
	if len(parts) > 1 {
		s.Preset = parts[1]
	}
	full, err := checkpoint.PresetConfig(s.Preset)
	if err != nil || s.Preset == "small-tp" {
		return SynthSpec{}, fmt.Errorf("model %q: preset %q, want small, flash or pro", model, s.Preset)
	}
	if len(parts) == 3 {
		n, err := strconv.Atoi(parts[2])
		if err != nil || n < 1 || n > full.Layers {
			return SynthSpec{}, fmt.Errorf("model %q: layers %q, want 1..%d", model, parts[2], full.Layers)
		}
		s.Layers = n
	}
	return s, nil
}

// String is the canonical name of the spec.
func (s SynthSpec) String() string {
	if s.Layers == 0 {
		return SynthPrefix + ":" + s.Preset
	}
	return fmt.Sprintf("%s:%s:%d", SynthPrefix, s.Preset, s.Layers)
}

// Config is the architecture the spec builds: the preset cut to its layers,
// without the MTP block (small keeps its own).
func (s SynthSpec) Config() (*checkpoint.Config, error) {
	c, err := checkpoint.PresetConfig(s.Preset)
	if err != nil {
		return nil, err
	}
	if s.Preset == "small" {
		if s.Layers == 0 {
			return c, nil
		}
		return checkpoint.CutLayers(c, s.Layers, true)
	}
	layers := s.Layers
	if layers == 0 {
		layers = c.Layers
	}
	return checkpoint.CutLayers(c, layers, false)
}

// Synth builds the spec's model in the official format from seed, with a
// tokenizer that covers its vocabulary: the small model's weights are drawn
// one by one (those `mkmodel --preset small --seed N` writes) and it takes
// the generated checkpoints' tokenizer; Flash and Pro share pooled random linears
// (checkpoint.RandomWeights, a few GB of host memory at any depth) and take
// tokenizer.SynthV4.
func Synth(s SynthSpec, seed uint64) (*checkpoint.Weights, *tokenizer.Tokenizer, error) {
	c, err := s.Config()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s, err)
	}
	var w *checkpoint.Weights
	var tok *tokenizer.Tokenizer
	if s.Preset == "small" {
		if w, err = checkpoint.GenWeights(c, checkpoint.GenOfficial, seed); err == nil {
			tok, err = smallTokenizer()
		}
	} else {
		if w, err = checkpoint.RandomWeights(c, checkpoint.GenOfficial, seed); err == nil {
			tok, err = tokenizer.SynthV4()
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s, err)
	}
	if tok.VocabSize() != c.Vocab {
		return nil, nil, fmt.Errorf("%s: tokenizer has %d ids, the model %d", s, tok.VocabSize(), c.Vocab)
	}
	return w, tok, nil
}

// smallTokenizer is the tokenizer of generated small checkpoints.
func smallTokenizer() (*tokenizer.Tokenizer, error) {
	data, err := checkpoint.GenTokenizerJSON()
	if err != nil {
		return nil, err
	}
	return tokenizer.Load(data)
}
