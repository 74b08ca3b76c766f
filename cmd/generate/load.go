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

// loadModel returns the weights and, when the directory has tokenizer.json, a
// text encoder. "synth" selects the in-memory synthetic small model
// (checkpoint.GenWeights of the small preset, seed 1), "" the embedded one.
// The checkpoint's memory maps stay open for the process.
func loadModel(dir string) (*checkpoint.Weights, func(string) ([]int32, error), error) {
	if dir == "synth" {
		w, err := checkpoint.GenWeights(checkpoint.SmallConfig(), checkpoint.GenOfficial, 1)
		if err != nil {
			return nil, nil, fmt.Errorf("--model synth: %w", err)
		}
		return w, nil, nil
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
	enc := func(s string) ([]int32, error) {
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
	return w, enc, nil
}
