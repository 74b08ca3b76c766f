package checkpoint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/tokenizer"
)

// TestGenerate: the public Generate writes a loadable checkpoint whose config
// matches its tokenizer, in both formats; bad specs are rejected.
func TestGenerate(t *testing.T) {
	for _, format := range []string{GenOfficial, GenNVFP4} {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			if err := Generate(dir, GenSpec{Format: format, Seed: 3}); err != nil {
				t.Fatal(err)
			}
			w, st, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			tokJSON, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			n, ids, err := tokenizerIDs(tokJSON, BOSToken, EOSToken, "<｜User｜>", "<｜Assistant｜>")
			if err != nil {
				t.Fatal(err)
			}
			c := w.Config
			if c.Vocab != n || c.BOS != ids[0] || c.EOS != ids[1] || n < SmallVocab/2 || n > 2*SmallVocab {
				t.Errorf("config vocab %d bos %d eos %d; tokenizer has %d ids, bos %d eos %d", c.Vocab, c.BOS, c.EOS, n, ids[0], ids[1])
			}
			if len(w.Embed.Shape) != 2 || w.Embed.Shape[0] != n {
				t.Errorf("embed shape %v for %d tokens", w.Embed.Shape, n)
			}
			var tc map[string]any
			data, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(data, &tc); err != nil {
				t.Fatal(err)
			}
			bos, _ := tc["bos_token"].(map[string]any)
			eos, _ := tc["eos_token"].(map[string]any)
			if tc["add_bos_token"] != false || bos["content"] != BOSToken || eos["content"] != EOSToken || tc["model_max_length"] != float64(1048576) {
				t.Errorf("tokenizer_config.json = %s", data)
			}
			_, err = os.Stat(filepath.Join(dir, QuantConfigFile))
			if (err == nil) != (format == GenNVFP4) {
				t.Errorf("%s present: %v", QuantConfigFile, err == nil)
			}
			if format == GenNVFP4 && c.MoEQuantAlgo != "NVFP4" {
				t.Errorf("moe_quant_algo %q", c.MoEQuantAlgo)
			}
		})
	}
	for _, spec := range []GenSpec{{Format: "int4"}, {Preset: "huge"}} {
		if err := Generate(t.TempDir(), spec); err == nil || !strings.Contains(err.Error(), "unknown") {
			t.Errorf("Generate(%+v) = %v, want an unknown-format/preset error", spec, err)
		}
	}
	// The trainer itself must be deterministic for the committed model to be reproducible.
	a, err := tokenizer.TrainBPE(corpus, SmallVocab, tokenizer.DeepSeekV4SpecialTokens())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := tokenizer.TrainBPE(corpus, SmallVocab, tokenizer.DeepSeekV4SpecialTokens())
	if string(a) != string(b) {
		t.Error("TrainBPE is not deterministic")
	}
}
