package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/megamoe/megamoe/safetensors"
)

// Save writes w as a checkpoint directory that Load reads back: config.json
// (w.Config) and one model.safetensors with every tensor of w. Unlike
// Generate it writes no tokenizer and no generation or quantisation configs.
func Save(dir string, w *Weights) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	cfg, err := json.MarshalIndent(w.Config, "", "  ")
	if err != nil {
		return fmt.Errorf("save %s: config: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	wr := safetensors.NewWriter()
	var errs []error
	add := func(t safetensors.Tensor) {
		if t.Valid() {
			errs = append(errs, wr.Add(t.Name, t.DType, t.Shape, t.Data))
		}
	}
	w.Walk(func(l *Linear) {
		add(l.Weight)
		add(l.Scale)
		if l.Format == FormatNVFP4 { // the fp32 scalars Bind reads into Scale2 and InputScale
			add(safetensors.Tensor{Name: l.Name + ".weight_scale_2", DType: safetensors.F32, Shape: []int{}, Data: f32Bytes([]float32{l.Scale2})})
			add(safetensors.Tensor{Name: l.Name + ".input_scale", DType: safetensors.F32, Shape: []int{}, Data: f32Bytes([]float32{l.InputScale})})
		}
	}, add)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	if err := wr.WriteFile(filepath.Join(dir, "model.safetensors"), nil); err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	return nil
}
