// Package checkpoint reads a DeepSeek-V4 checkpoint directory: config.json,
// the quantisation metadata and the safetensors shards, and binds every tensor
// to typed structs (weights.go). Sizes always come from config.json.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// Config is the architecture of one checkpoint, parsed from the Hugging Face
// config.json (see spec §1.2). Field names follow the reference's ModelArgs.
type Config struct {
	Layers         int   `json:"num_hidden_layers"`
	Dim            int   `json:"hidden_size"`
	Heads          int   `json:"num_attention_heads"`
	KVHeads        int   `json:"num_key_value_heads"`
	HeadDim        int   `json:"head_dim"`
	RopeDim        int   `json:"qk_rope_head_dim"`
	QLoraRank      int   `json:"q_lora_rank"`
	OLoraRank      int   `json:"o_lora_rank"`
	OGroups        int   `json:"o_groups"`
	Window         int   `json:"sliding_window"`
	CompressRatios []int `json:"compress_ratios"`

	RopeTheta         float64      `json:"rope_theta"`
	CompressRopeTheta float64      `json:"compress_rope_theta"`
	RopeScaling       *RopeScaling `json:"rope_scaling"`

	IndexHeads   int `json:"index_n_heads"`
	IndexHeadDim int `json:"index_head_dim"`
	IndexTopK    int `json:"index_topk"`

	Experts       int     `json:"n_routed_experts"`
	SharedExperts int     `json:"n_shared_experts"`
	TopK          int     `json:"num_experts_per_tok"`
	MoEInter      int     `json:"moe_intermediate_size"`
	ScoringFunc   string  `json:"scoring_func"`
	NormTopKProb  bool    `json:"norm_topk_prob"`
	RouteScale    float64 `json:"routed_scaling_factor"`
	HashLayers    int     `json:"num_hash_layers"`
	SwigluLimit   float64 `json:"swiglu_limit"`
	HcMult        int     `json:"hc_mult"`
	HcSinkhorn    int     `json:"hc_sinkhorn_iters"`
	HcEps         float64 `json:"hc_eps"`
	NormEps       float64 `json:"rms_norm_eps"`
	MTPLayers     int     `json:"num_nextn_predict_layers"`
	Vocab         int     `json:"vocab_size"`
	BOS           int     `json:"bos_token_id"`
	EOS           int     `json:"eos_token_id"`
	MaxPositions  int     `json:"max_position_embeddings"`
	ExpertDType   string  `json:"expert_dtype"`
	TieEmbeddings bool    `json:"tie_word_embeddings"`
	ModelType     string  `json:"model_type"`

	// The DSpark block drafter of the later V4 checkpoints (docs/checkpoints.md).
	// Its stages are the entries of compress_ratios after the main layers
	// (DSparkLayers), stored under mtp.*, which then holds no MTP block.
	DSparkBlockSize    int   `json:"dspark_block_size"`
	DSparkTargetLayers []int `json:"dspark_target_layer_ids"`
	DSparkMarkovRank   int   `json:"dspark_markov_rank"`
	DSparkNoiseToken   *int  `json:"dspark_noise_token_id"`

	Quantization *QuantizationConfig `json:"quantization_config"`
	// NVIDIA ModelOpt NVFP4 checkpoints add these keys (spec §9).
	MoEQuantAlgo string `json:"moe_quant_algo"`
}

// RopeScaling is the YaRN block of config.json.
type RopeScaling struct {
	Type         string  `json:"type"`
	Factor       float64 `json:"factor"`
	OriginalLen  int     `json:"original_max_position_embeddings"`
	BetaFast     float64 `json:"beta_fast"`
	BetaSlow     float64 `json:"beta_slow"`
	MScale       float64 `json:"mscale"`
	MScaleAllDim float64 `json:"mscale_all_dim"`
}

// QuantizationConfig is config.json's quantization_config (FP8 block scaling).
type QuantizationConfig struct {
	QuantMethod     string `json:"quant_method"`
	Fmt             string `json:"fmt"`
	ScaleFmt        string `json:"scale_fmt"`
	WeightBlockSize []int  `json:"weight_block_size"`
	ActivationMode  string `json:"activation_scheme"`
}

// ParseConfig decodes and validates a config.json document.
func ParseConfig(data []byte) (*Config, error) {
	c := &Config{HcEps: 1e-6, NormEps: 1e-6, HcSinkhorn: 20, MTPLayers: 1, KVHeads: 1, SharedExperts: 1}
	if err := json.Unmarshal(data, c); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	if c.HasDSpark() {
		// num_nextn_predict_layers stays 1 in DSpark configs, but mtp.* holds
		// the DSpark stages, not the serial MTP block.
		c.MTPLayers = 0
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	return c, nil
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Validate checks internal consistency and reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	pos := map[string]int{
		"num_hidden_layers": c.Layers, "hidden_size": c.Dim, "num_attention_heads": c.Heads,
		"head_dim": c.HeadDim, "qk_rope_head_dim": c.RopeDim, "q_lora_rank": c.QLoraRank,
		"o_lora_rank": c.OLoraRank, "o_groups": c.OGroups, "sliding_window": c.Window,
		"n_routed_experts": c.Experts, "num_experts_per_tok": c.TopK,
		"moe_intermediate_size": c.MoEInter, "hc_mult": c.HcMult, "hc_sinkhorn_iters": c.HcSinkhorn,
		"vocab_size": c.Vocab,
	}
	for _, k := range sortedKeys(pos) {
		if pos[k] <= 0 {
			bad("%s = %d, want > 0", k, pos[k])
		}
	}
	// Sanity caps: far above any released model, low enough that a corrupt
	// config cannot make the name table allocate billions of entries.
	for _, lim := range []struct {
		key    string
		v, max int
	}{{"num_hidden_layers", c.Layers, 1024}, {"n_routed_experts", c.Experts, 1 << 16}, {"num_attention_heads", c.Heads, 1 << 12}} {
		if lim.v > lim.max {
			bad("%s = %d exceeds the supported maximum %d", lim.key, lim.v, lim.max)
		}
	}
	if c.KVHeads != 1 {
		bad("num_key_value_heads = %d, DeepSeek-V4 has one shared K=V head", c.KVHeads)
	}
	if c.SharedExperts != 1 {
		bad("n_shared_experts = %d, only 1 is supported", c.SharedExperts)
	}
	if c.RopeDim > c.HeadDim || c.RopeDim%2 != 0 {
		bad("qk_rope_head_dim = %d must be even and <= head_dim %d", c.RopeDim, c.HeadDim)
	}
	if c.Dim%2 != 0 || c.MoEInter%2 != 0 {
		bad("hidden_size %d and moe_intermediate_size %d must be even (FP4 experts pack two values per byte)", c.Dim, c.MoEInter)
	}
	if c.OGroups > 0 && c.Heads%c.OGroups != 0 {
		bad("num_attention_heads %d not divisible by o_groups %d", c.Heads, c.OGroups)
	}
	if c.TopK > c.Experts {
		bad("num_experts_per_tok %d > n_routed_experts %d", c.TopK, c.Experts)
	}
	if c.HashLayers < 0 || c.HashLayers > c.Layers {
		bad("num_hash_layers = %d out of [0, %d]", c.HashLayers, c.Layers)
	}
	if c.MTPLayers < 0 || c.MTPLayers > 1 {
		bad("num_nextn_predict_layers = %d, only 0 or 1 supported", c.MTPLayers)
	}
	if c.HasDSpark() {
		errs = append(errs, c.validateDSpark()...)
	} else if n := c.Layers + c.MTPLayers; len(c.CompressRatios) != n {
		bad("compress_ratios has %d entries, want num_hidden_layers+num_nextn_predict_layers = %d", len(c.CompressRatios), n)
	}
	hasCompressed, hasCSA := false, false
	for i, r := range c.CompressRatios {
		switch r {
		case 0:
		case 4:
			hasCompressed, hasCSA = true, true
		case 128:
			hasCompressed = true
		default:
			bad("compress_ratios[%d] = %d, want 0, 4 or 128", i, r)
		}
		if i >= c.Layers && r != 0 {
			bad("compress_ratios[%d] = %d: the MTP block and DSpark stages must be sliding-window (0)", i, r)
		}
	}
	if hasCompressed && c.CompressRopeTheta <= 0 {
		bad("compress_rope_theta = %g, want > 0", c.CompressRopeTheta)
	}
	if c.RopeTheta <= 0 {
		bad("rope_theta = %g, want > 0", c.RopeTheta)
	}
	if hasCSA {
		if c.IndexHeads <= 0 || c.IndexHeadDim <= 0 || c.IndexTopK <= 0 {
			bad("CSA layers need index_n_heads, index_head_dim, index_topk > 0 (got %d, %d, %d)", c.IndexHeads, c.IndexHeadDim, c.IndexTopK)
		}
		if c.IndexHeadDim < c.RopeDim || c.IndexHeadDim&(c.IndexHeadDim-1) != 0 {
			bad("index_head_dim = %d must be a power of two >= qk_rope_head_dim %d (Hadamard)", c.IndexHeadDim, c.RopeDim)
		}
	}
	if c.ScoringFunc != "" && c.ScoringFunc != "sqrtsoftplus" {
		bad("scoring_func %q unsupported, want sqrtsoftplus", c.ScoringFunc)
	}
	if c.RopeScaling != nil && c.RopeScaling.Type != "" && c.RopeScaling.Type != "yarn" {
		bad("rope_scaling.type %q unsupported, want yarn", c.RopeScaling.Type)
	}
	if c.HcEps <= 0 || c.NormEps <= 0 || math.IsNaN(c.HcEps) || math.IsNaN(c.NormEps) {
		bad("hc_eps/rms_norm_eps must be > 0")
	}
	if c.SwigluLimit < 0 {
		bad("swiglu_limit = %g, want >= 0", c.SwigluLimit)
	}
	if c.RouteScale <= 0 {
		bad("routed_scaling_factor = %g, want > 0", c.RouteScale)
	}
	if c.BOS < 0 || c.BOS >= c.Vocab || c.EOS < 0 || c.EOS >= c.Vocab {
		bad("bos/eos ids %d/%d outside vocab %d", c.BOS, c.EOS, c.Vocab)
	}
	if q := c.Quantization; q != nil && len(q.WeightBlockSize) != 0 &&
		(len(q.WeightBlockSize) != 2 || q.WeightBlockSize[0] != 128 || q.WeightBlockSize[1] != 128) {
		bad("quantization_config.weight_block_size %v unsupported, want [128,128]", q.WeightBlockSize)
	}
	return errors.Join(errs...)
}

// Ratio is the compression ratio of layer i (i == Layers is the MTP block).
func (c *Config) Ratio(i int) int { return c.CompressRatios[i] }

// GroupHeads is the number of query heads per output-projection group.
func (c *Config) GroupHeads() int { return c.Heads / c.OGroups }

// HcDim is the flattened width of the residual streams (hc_mult·d).
func (c *Config) HcDim() int { return c.HcMult * c.Dim }

// HcMix is the number of mixing values per HcPre: (2+n)·n.
func (c *Config) HcMix() int { return (2 + c.HcMult) * c.HcMult }

// NopeDim is the head width without the rope part.
func (c *Config) NopeDim() int { return c.HeadDim - c.RopeDim }

func sortedKeys(m map[string]int) []string { return slices.Sorted(maps.Keys(m)) }
