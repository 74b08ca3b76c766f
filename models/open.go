package models

import (
	"fmt"
	"path/filepath"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/tokenizer"
)

// Open reads the checkpoint directory dir and its tokenizer, or builds the
// in-memory model a "synth:…" name gives (ParseSynth; seed SmallSeed, so
// synth:small is what `mkmodel --preset small` writes), and returns the bytes its weights
// take on a device.
func Open(dir string) (*checkpoint.Weights, *tokenizer.Tokenizer, int64, error) {
	if IsSynth(dir) {
		spec, err := ParseSynth(dir)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("--model: %w", err)
		}
		w, tok, err := Synth(spec, SmallSeed)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("--model: %w", err)
		}
		return w, tok, checkpoint.TotalBytes(checkpoint.Tensors(w.Config, checkpoint.OfficialFormats)), nil
	}
	w, st, err := checkpoint.Load(dir)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("--model %s: %w", dir, err)
	}
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, nil, 0, fmt.Errorf("--model %s: %w", dir, err)
	}
	var size int64
	for _, name := range st.Names() {
		t, _ := st.Get(name)
		size += int64(len(t.Data))
	}
	return w, tok, size, nil
}
