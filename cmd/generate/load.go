package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

// loadModel returns the weights and, when the model has a tokenizer, a text
// encoder. "synth", "synth:small", "synth:flash:N" and "synth:pro:N" build an
// in-memory model with random weights (models.Synth, seed 1: synth:small is
// the embedded checkpoint), "" the embedded one. The checkpoint's memory maps
// stay open for the process.
func loadModel(dir string) (*checkpoint.Weights, func(string) ([]int32, error), error) {
	if models.IsSynth(dir) {
		spec, err := models.ParseSynth(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("--model: %w", err)
		}
		w, tok, err := models.Synth(spec, models.SmallSeed)
		if err != nil {
			return nil, nil, fmt.Errorf("--model: %w", err)
		}
		return w, encoder(tok), nil
	}
	if dir == "" {
		small, err := models.ExtractSmall()
		if err != nil {
			return nil, nil, err
		}
		dir = small
	}
	w, _, err := checkpoint.Load(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("--model %s: %w", dir, err)
	}
	path := filepath.Join(dir, "tokenizer.json")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return w, nil, nil
	}
	tok, err := tokenizer.LoadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--model %s: %w", dir, err)
	}
	return w, encoder(tok), nil
}

// encoder encodes a prompt to token ids.
func encoder(tok *tokenizer.Tokenizer) func(string) ([]int32, error) {
	return func(s string) ([]int32, error) {
		ids := tok.Encode(s)
		if len(ids) == 0 {
			return nil, errors.New("--prompt encodes to no tokens")
		}
		out := make([]int32, len(ids))
		for i, id := range ids {
			out[i] = int32(id)
		}
		return out, nil
	}
}
