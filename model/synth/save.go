package synth

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/safetensors"
)

// Save writes w as a checkpoint directory (config.json + model.safetensors).
func Save(dir string, w *checkpoint.Weights) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg, err := json.MarshalIndent(w.Config, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		return err
	}
	wr := safetensors.NewWriter()
	for _, t := range w.Tensors() {
		if err := wr.Add(t.Name, t.DType, t.Shape, t.Data); err != nil {
			return fmt.Errorf("synth save: %w", err)
		}
	}
	return wr.WriteFile(filepath.Join(dir, "model.safetensors"), nil)
}
