package checkpoint

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/megamoe/megamoe/safetensors"
	"github.com/megamoe/megamoe/tokenizer"
)

// corpus is the built-in training text of the small model's tokenizer
// (English prose, Go/Python/shell code, Chinese and Japanese).
//
//go:embed testdata/corpus.txt
var corpus string

// Generate writes a complete seeded checkpoint into dir: config.json,
// generation_config.json, tokenizer.json, tokenizer_config.json, sharded
// safetensors with model.safetensors.index.json and, for GenNVFP4,
// hf_quant_config.json. The same spec always produces byte-identical files,
// and the two formats of one seed hold identical expert weights.
func Generate(dir string, spec GenSpec) error {
	if err := generate(dir, spec); err != nil {
		return fmt.Errorf("generate %s: %w", dir, err)
	}
	return nil
}

// GenerateLoad generates a checkpoint into dir and loads it (the caller
// closes the returned store).
func GenerateLoad(dir string, spec GenSpec) (*Weights, *safetensors.Checkpoint, error) {
	if err := Generate(dir, spec); err != nil {
		return nil, nil, err
	}
	return Load(dir)
}

// GenTokenizerJSON is the tokenizer.json of generated (random-weight)
// checkpoints: byte-level BPE of SmallVocab ids learned on the built-in corpus.
func GenTokenizerJSON() ([]byte, error) {
	tj, err := tokenizer.TrainBPE(corpus, SmallVocab, tokenizer.DeepSeekV4SpecialTokens())
	if err != nil {
		return nil, fmt.Errorf("train tokenizer: %w", err)
	}
	return tj, nil
}

func generate(dir string, spec GenSpec) error {
	if _, err := genFormats(spec.Format); err != nil {
		return err
	}
	if spec.From != "" {
		return fromTrained(dir, spec)
	}
	var c *Config
	switch {
	case spec.Config != nil:
		cc := *spec.Config
		cc.CompressRatios = slices.Clone(cc.CompressRatios)
		c = &cc
	case spec.Preset == "" || spec.Preset == "small":
		c = SmallConfig()
	case spec.Preset == "small-tp":
		c = SmallTPConfig()
	case spec.Preset == "small-dspark":
		c = SmallDSparkConfig()
	default:
		return fmt.Errorf("unknown preset %q (want small, small-tp or small-dspark)", spec.Preset)
	}

	tokJSON, err := GenTokenizerJSON()
	if err != nil {
		return err
	}
	vocab, ids, err := tokenizerIDs(tokJSON, BOSToken, EOSToken)
	if err != nil {
		return err
	}
	c.Vocab, c.BOS, c.EOS = vocab, ids[0], ids[1]

	return writeModel(dir, c, spec.Format, spec.Seed, spec.MaxShardBytes, tokJSON, nil)
}

// fromTrained writes the trained model of spec.From in spec.Format.
func fromTrained(dir string, spec GenSpec) error {
	if spec.Tokenizer == "" {
		return fmt.Errorf("a trained model needs its tokenizer.json")
	}
	c, err := LoadConfig(spec.From)
	if err != nil {
		return err
	}
	tokJSON, err := os.ReadFile(spec.Tokenizer)
	if err != nil {
		return err
	}
	vocab, ids, err := tokenizerIDs(tokJSON, BOSToken, EOSToken)
	if err != nil {
		return err
	}
	if vocab != c.Vocab || ids[0] != c.BOS || ids[1] != c.EOS {
		return fmt.Errorf("tokenizer has %d ids (BOS %d, EOS %d), the trained config %d (%d, %d)", vocab, ids[0], ids[1], c.Vocab, c.BOS, c.EOS)
	}
	paths, err := filepath.Glob(filepath.Join(spec.From, "trained-*.safetensors"))
	if err != nil || len(paths) == 0 {
		return fmt.Errorf("%s: no trained-*.safetensors", spec.From)
	}
	src := tensorMap{}
	for _, p := range paths {
		f, err := safetensors.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		for _, t := range f.Tensors() {
			src[t.Name] = t
		}
	}
	return writeModel(dir, c, spec.Format, 0, spec.MaxShardBytes, tokJSON, src)
}
