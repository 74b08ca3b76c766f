package checkpoint

import "github.com/megamoe/megamoe/safetensors"

// Format is how one linear's weight is stored on disk.
type Format int

const (
	FormatBF16     Format = iota // plain bf16 [out, in]
	FormatF32                    // plain fp32 [out, in]
	FormatFP8Block               // e4m3 [out, in] + e8m0 scale [ceil(out/128), ceil(in/128)]
	FormatMXFP4                  // packed e2m1 I8 [out, in/2] + e8m0 scale [out, in/32]
	FormatNVFP4                  // packed e2m1 U8 [out, in/2] + e4m3 scale [out, in/16] + fp32 weight_scale_2 (+ input_scale)
)

func (f Format) String() string {
	switch f {
	case FormatBF16:
		return "bf16"
	case FormatF32:
		return "f32"
	case FormatFP8Block:
		return "fp8-block"
	case FormatMXFP4:
		return "mxfp4"
	case FormatNVFP4:
		return "nvfp4"
	}
	return "unknown"
}

// Linear is one weight matrix applied as y = W·x, W stored [Out, In].
// Weight and Scale are zero-copy views into the checkpoint.
type Linear struct {
	Name       string // tensor name prefix, e.g. "layers.3.attn.wq_a"
	Format     Format
	Out, In    int // logical shape (In counts elements, not packed bytes)
	Weight     safetensors.Tensor
	Scale      safetensors.Tensor // FP8Block/MXFP4: e8m0; NVFP4: e4m3; empty otherwise
	Scale2     float32            // NVFP4 per-tensor global scale (weight_scale_2)
	InputScale float32            // NVFP4 calibrated activation scale (unused by W4A16 paths)
}

// HC holds the mixing parameters of one hyper-connection site (spec §4.1).
type HC struct {
	Fn    safetensors.Tensor // f32 [mix, hc·d]
	Base  safetensors.Tensor // f32 [mix]
	Scale safetensors.Tensor // f32 [3] for attn/ffn sites, [1] for the head collapse
}

// Compressor pools r tokens into one KV entry (spec §5.4).
type Compressor struct {
	Ratio int
	Dim   int                // output width Dc (head_dim for the main compressor, index_head_dim for the indexer's)
	WKV   Linear             // bf16 [c·Dc, d]
	WGate Linear             // bf16 [c·Dc, d]
	APE   safetensors.Tensor // f32 [r, c·Dc]
	Norm  safetensors.Tensor // bf16 [Dc]
}

// Indexer is the lightning indexer of a CSA layer (spec §5.5).
type Indexer struct {
	WqB         Linear // fp8 [index_heads·index_head_dim, q_lora_rank]
	WeightsProj Linear // bf16 [index_heads, d]
	Compressor  Compressor
}

// Attention holds one layer's attention weights (spec §5).
type Attention struct {
	Sink       safetensors.Tensor // f32 [heads]
	WqA        Linear             // fp8 [q_lora_rank, d]
	QNorm      safetensors.Tensor // bf16 [q_lora_rank]
	WqB        Linear             // fp8 [heads·head_dim, q_lora_rank]
	WKV        Linear             // fp8 [head_dim, d]
	KVNorm     safetensors.Tensor // bf16 [head_dim]
	WoA        Linear             // fp8 [o_groups·o_lora_rank, heads/o_groups·head_dim]
	WoB        Linear             // fp8 [d, o_groups·o_lora_rank]
	Compressor *Compressor        // nil on ratio-0 layers
	Indexer    *Indexer           // non-nil on ratio-4 layers only
}

// Expert is one SwiGLU FFN: w2(silu(w1·x) · w3·x).
type Expert struct {
	W1, W2, W3 Linear
}

// MoE holds the router, the shared expert and the routed experts (spec §6).
type MoE struct {
	Gate    Linear             // bf16 [experts, d]
	Bias    safetensors.Tensor // f32 [experts]; empty on hash layers
	Tid2Eid safetensors.Tensor // i64 [vocab, top_k]; only on hash layers
	Shared  Expert             // fp8
	Experts []Expert           // routed: mxfp4 or nvfp4
}

// Hash reports whether this layer routes by token id.
func (m *MoE) Hash() bool { return m.Tid2Eid.Data != nil }

// Layer is one transformer block (also the body of the MTP block).
type Layer struct {
	Index    int // layer id: 0..Layers-1, Layers for the MTP block
	Ratio    int // 0, 4 or 128
	HcAttn   HC
	HcFFN    HC
	AttnNorm safetensors.Tensor // bf16 [d]
	FFNNorm  safetensors.Tensor // bf16 [d]
	Attn     Attention
	FFN      MoE
}

// MTP is the multi-token-prediction block (spec §7.2); it shares embed and head.
type MTP struct {
	Layer
	EProj  Linear             // fp8 [d, d]
	HProj  Linear             // fp8 [d, d]
	ENorm  safetensors.Tensor // bf16 [d]
	HNorm  safetensors.Tensor // bf16 [d]
	Norm   safetensors.Tensor // bf16 [d]
	HcHead HC
}

// Weights is a whole bound checkpoint.
type Weights struct {
	Config *Config
	Embed  safetensors.Tensor // bf16 [vocab, d]
	Head   Linear             // bf16 [vocab, d]
	Norm   safetensors.Tensor // bf16 [d]
	HcHead HC
	Layers []Layer
	MTP    []MTP   // len == Config.MTPLayers
	DSpark *DSpark // the block drafter of DSpark checkpoints, else nil
	Part   *Part   // this rank's slice of a sharded model; nil = the whole model
}
