package checkpoint

import (
	"fmt"
	"slices"
)

// DSparkShape is a DSpark drafter's config besides its target layers: the
// stages (trailing compress_ratios entries), the target layers it reads
// (the last Targets main layers), dspark_block_size, dspark_markov_rank and
// dspark_noise_token_id.
type DSparkShape struct {
	Stages, Targets, BlockSize, MarkovRank, NoiseToken int
}

// PublishedDSpark is the drafter of DeepSeek-V4-Flash-0731
// (docs/checkpoints.md): 3 stages over the target layers [40, 41, 42] (the
// last three), blocks of 5, Markov rank 256, noise token 128799.
var PublishedDSpark = DSparkShape{Stages: 3, Targets: 3, BlockSize: 5, MarkovRank: 256, NoiseToken: 128799}

// PresetDSpark is the drafter a preset gets with DSpark: the published one
// for flash and pro, the small-dspark preset's for small and small-tp (its
// vocabulary is too small for the published noise token).
func PresetDSpark(preset string) (DSparkShape, error) {
	switch preset {
	case "flash", "pro":
		return PublishedDSpark, nil
	case "small", "small-tp":
		c := SmallDSparkConfig()
		return DSparkShape{Stages: c.DSparkLayers(), Targets: len(c.DSparkTargetLayers), BlockSize: c.DSparkBlockSize,
			MarkovRank: c.DSparkMarkovRank, NoiseToken: *c.DSparkNoiseToken}, nil
	}
	return DSparkShape{}, fmt.Errorf("unknown preset %q (want small, small-tp, flash or pro)", preset)
}

// WithDSpark returns a copy of c with the DSpark drafter s in place of its
// MTP block, reading c's last s.Targets layers: on the whole Flash the
// published [40, 41, 42], on a cut stack (CutLayers) the last layers built.
// The stages' tensors are then part of Tensors and RandomWeights like the
// rest.
func WithDSpark(c *Config, s DSparkShape) (*Config, error) {
	if s.Targets < 1 || s.Targets > c.Layers {
		return nil, fmt.Errorf("dspark: %d target layers need at least as many main layers, not %d", s.Targets, c.Layers)
	}
	out := *c
	out.MTPLayers = 0
	out.CompressRatios = append(slices.Clone(c.CompressRatios[:c.Layers]), make([]int, s.Stages)...)
	out.DSparkTargetLayers = make([]int, s.Targets)
	for i := range out.DSparkTargetLayers {
		out.DSparkTargetLayers[i] = c.Layers - s.Targets + i
	}
	noise := s.NoiseToken
	out.DSparkBlockSize, out.DSparkMarkovRank, out.DSparkNoiseToken = s.BlockSize, s.MarkovRank, &noise
	if err := out.Validate(); err != nil {
		return nil, fmt.Errorf("dspark: %w", err)
	}
	return &out, nil
}
