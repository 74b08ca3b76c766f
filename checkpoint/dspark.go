package checkpoint

import (
	"fmt"

	"github.com/megamoe/megamoe/safetensors"
)

// Bounds of the DSpark config values: far above the published ones (block
// 5, rank 256, 3 stages over 3 target layers), low enough that a corrupt
// config cannot make the name table or a draft step huge.
const (
	maxDSparkLayers    = 16
	maxDSparkBlockSize = 64
	maxDSparkRank      = 1 << 14
)

// HasDSpark reports whether the config describes a DSpark drafter (any
// dspark_* field is present).
func (c *Config) HasDSpark() bool {
	return c.DSparkBlockSize != 0 || len(c.DSparkTargetLayers) > 0 || c.DSparkMarkovRank != 0 || c.DSparkNoiseToken != nil
}

// DSparkLayers is the number of DSpark stages: the compress_ratios entries
// after the main layers (0 without DSpark).
func (c *Config) DSparkLayers() int {
	if !c.HasDSpark() {
		return 0
	}
	return max(len(c.CompressRatios)-c.Layers-c.MTPLayers, 0)
}

// validateDSpark checks the dspark_* fields and the stages' compress_ratios.
func (c *Config) validateDSpark() []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.MTPLayers != 0 {
		bad("a DSpark config stores its stages under mtp.*: it cannot also have an MTP block")
	}
	if n := len(c.CompressRatios) - c.Layers; n < 1 || n > maxDSparkLayers {
		bad("compress_ratios has %d entries for %d layers: want 1 to %d trailing entries for the DSpark stages", len(c.CompressRatios), c.Layers, maxDSparkLayers)
	}
	if c.DSparkBlockSize < 1 || c.DSparkBlockSize > maxDSparkBlockSize {
		bad("dspark_block_size = %d out of [1, %d]", c.DSparkBlockSize, maxDSparkBlockSize)
	}
	if c.DSparkMarkovRank < 1 || c.DSparkMarkovRank > maxDSparkRank {
		bad("dspark_markov_rank = %d out of [1, %d]", c.DSparkMarkovRank, maxDSparkRank)
	}
	switch t := c.DSparkNoiseToken; {
	case t == nil:
		bad("dspark_noise_token_id missing")
	case *t < 0 || *t >= c.Vocab:
		bad("dspark_noise_token_id = %d outside vocab %d", *t, c.Vocab)
	}
	if len(c.DSparkTargetLayers) == 0 {
		bad("dspark_target_layer_ids missing or empty")
	}
	for i, l := range c.DSparkTargetLayers {
		if l < 0 || l >= c.Layers {
			bad("dspark_target_layer_ids[%d] = %d outside the %d layers", i, l, c.Layers)
		} else if i > 0 && l <= c.DSparkTargetLayers[i-1] {
			bad("dspark_target_layer_ids %v must increase", c.DSparkTargetLayers)
			break
		}
	}
	return errs
}

// DSpark is the block drafter's weights (stored under mtp.0 … mtp.N-1): its
// stages are blocks like the main layers (sliding-window attention); stage 0
// also holds main_proj/main_norm, which map the concatenated final streams of
// the target layers, the last stage the head: norm, hc_head, the low-rank
// Markov head and the confidence head. Embedding and vocabulary head are the
// target's.
type DSpark struct {
	Layers     []Layer            // Index: Config.Layers + stage
	MainProj   Linear             // fp8 [d, d·len(target layers)]
	MainNorm   safetensors.Tensor // bf16 [d]
	Norm       safetensors.Tensor // bf16 [d]
	HcHead     HC
	MarkovW1   Linear // [vocab, rank]: the previous token's embedding
	MarkovW2   Linear // [vocab, rank]: its bias over the vocabulary
	Confidence Linear // [1, d+rank]
}

// walkDSpark visits the DSpark tensors of c (HasDSpark) in table order.
func walkDSpark(c *Config, v visitor) *DSpark {
	d, r, n := c.Dim, c.DSparkMarkovRank, c.DSparkLayers()
	ds := &DSpark{}
	for s := range n {
		pre := fmt.Sprintf("mtp.%d.", s)
		ds.Layers = append(ds.Layers, walkLayer(c, v, c.Layers+s, pre))
		if s == 0 {
			ds.MainProj = v.linear(LinearSpec{pre + "main_proj", KindFP8, d, d * len(c.DSparkTargetLayers)})
			ds.MainNorm = v.tensor(pre+"main_norm.weight", safetensors.BF16, d)
		}
		if s == n-1 {
			ds.Norm = v.tensor(pre+"norm.weight", safetensors.BF16, d)
			ds.HcHead = walkHC(c, v, pre+"hc_head", c.HcMult, 1)
			ds.MarkovW1 = v.linear(LinearSpec{pre + "markov_head.markov_w1", KindPlain, c.Vocab, r})
			ds.MarkovW2 = v.linear(LinearSpec{pre + "markov_head.markov_w2", KindPlain, c.Vocab, r})
			ds.Confidence = v.linear(LinearSpec{pre + "confidence_head.proj", KindPlain, 1, d + r})
		}
	}
	return ds
}
