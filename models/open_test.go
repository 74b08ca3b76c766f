package models

import (
	"strings"
	"testing"
)

// TestOpen: synthetic names build the model in memory (synth:small is
// the embedded checkpoint), bad names fail early with the flag named.
func TestOpen(t *testing.T) {
	for _, tc := range []struct {
		model, err string
		vocab      int
	}{
		{model: "synth:small", vocab: 1024},
		{model: "synth:small:2", vocab: 1024},
		{model: "synth:flash:99", err: "want 1..43"},
		{model: "synth:tiny", err: "--model"},
		{model: t.TempDir(), err: "--model"},
	} {
		w, tok, size, err := Open(tc.model)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.model, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.model, err)
			continue
		}
		if w.Config.Vocab != tc.vocab || tok.VocabSize() != tc.vocab || size <= 0 {
			t.Errorf("%s: vocab %d, tokenizer %d, %d bytes", tc.model, w.Config.Vocab, tok.VocabSize(), size)
		}
	}
}
