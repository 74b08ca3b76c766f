package main

import (
	"fmt"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model/synth"
)

// loadModel returns the weights and, when available, a text encoder.
// "" and "synth" select the in-memory synthetic small model (model/synth).
// The checkpoint's memory maps stay open for the life of the process.
func loadModel(dir string) (*checkpoint.Weights, func(string) ([]int32, error), error) {
	if dir == "" || dir == "synth" {
		return synth.Weights(synth.Config(), 1, synth.Options{}), nil, nil
	}
	w, _, err := checkpoint.Load(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("--model %s: %w", dir, err)
	}
	return w, nil, nil
}
