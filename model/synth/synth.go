// Package synth builds small random DeepSeek-V4 checkpoints in memory (no
// files) for tests and benchmarks of the forward pass: FP8 block-scaled
// linears, MXFP4 (or NVFP4) routed experts, hash layers, CSA/HCA/SWA layers and
// the MTP block, with value scales that keep activations O(1).
package synth

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/safetensors"
)

// Config returns a tiny config: dim 256, 6 heads × 128 (rope 64), window 16,
// layers [SWA, CSA, HCA, CSA] + SWA MTP, 2 hash layers, 8 experts top-2.
func Config() *checkpoint.Config {
	return &checkpoint.Config{
		Layers: 4, Dim: 256, Heads: 6, KVHeads: 1, HeadDim: 128, RopeDim: 64,
		QLoraRank: 64, OLoraRank: 64, OGroups: 2, Window: 16,
		CompressRatios: []int{0, 4, 128, 4, 0},
		RopeTheta:      10000, CompressRopeTheta: 160000,
		RopeScaling: &checkpoint.RopeScaling{Type: "yarn", Factor: 16, OriginalLen: 65536, BetaFast: 32, BetaSlow: 1},
		IndexHeads:  4, IndexHeadDim: 64, IndexTopK: 4,
		Experts: 8, SharedExperts: 1, TopK: 2, MoEInter: 128, ScoringFunc: "sqrtsoftplus",
		NormTopKProb: true, RouteScale: 1.5, HashLayers: 2, SwigluLimit: 10,
		HcMult: 4, HcSinkhorn: 20, HcEps: 1e-6, NormEps: 1e-6, MTPLayers: 1,
		Vocab: 512, BOS: 0, EOS: 1, MaxPositions: 1 << 20, ExpertDType: "fp4",
	}
}

type gen struct {
	rng   *rand.Rand
	nvfp4 bool
}

func (g *gen) normal(n int, std float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(g.rng.NormFloat64() * std)
	}
	return v
}

func bf16Tensor(name string, v []float32, shape ...int) safetensors.Tensor {
	b := make([]byte, 2*len(v))
	num.EncodeBF16(v, b)
	return safetensors.Tensor{Name: name, DType: safetensors.BF16, Shape: shape, Data: b}
}

func f32Tensor(name string, v []float32, shape ...int) safetensors.Tensor {
	b := make([]byte, 4*len(v))
	num.EncodeF32(v, b)
	return safetensors.Tensor{Name: name, DType: safetensors.F32, Shape: shape, Data: b}
}

func (g *gen) bf16Linear(name string, out, in int, std float64) checkpoint.Linear {
	return checkpoint.Linear{Name: name, Format: checkpoint.FormatBF16, Out: out, In: in,
		Weight: bf16Tensor(name+".weight", g.normal(out*in, std), out, in)}
}

// fp8Linear quantises N(0, std²) values to e4m3 with 128×128 e8m0 block scales.
func (g *gen) fp8Linear(name string, out, in int, std float64) checkpoint.Linear {
	v := g.normal(out*in, std)
	sr, sc := (out+127)/128, (in+127)/128
	w := make([]byte, out*in)
	s := make([]byte, sr*sc)
	for br := range sr {
		for bc := range sc {
			var amax float32
			for r := br * 128; r < min(out, br*128+128); r++ {
				for c := bc * 128; c < min(in, bc*128+128); c++ {
					amax = max(amax, float32(math.Abs(float64(v[r*in+c]))))
				}
			}
			e := num.CeilLog2(max(amax, 1e-30) / 448)
			s[br*sc+bc] = num.E8M0FromExp(e)
			sv := num.Pow2F32(e)
			for r := br * 128; r < min(out, br*128+128); r++ {
				for c := bc * 128; c < min(in, bc*128+128); c++ {
					w[r*in+c] = num.F32ToE4M3(v[r*in+c] / sv)
				}
			}
		}
	}
	return checkpoint.Linear{Name: name, Format: checkpoint.FormatFP8Block, Out: out, In: in,
		Weight: safetensors.Tensor{Name: name + ".weight", DType: safetensors.F8E4M3, Shape: []int{out, in}, Data: w},
		Scale:  safetensors.Tensor{Name: name + ".scale", DType: safetensors.F8E8M0, Shape: []int{sr, sc}, Data: s}}
}

// fp4Linear quantises to e2m1 with per-32 e8m0 scales (MXFP4) or per-16 e4m3
// scales and a global scale (NVFP4).
func (g *gen) fp4Linear(name string, out, in int, std float64) checkpoint.Linear {
	v := g.normal(out*in, std)
	blk := 32
	if g.nvfp4 {
		blk = 16
	}
	codes := make([]uint8, out*in)
	s := make([]byte, out*in/blk)
	const global = 1.0 / 256
	for r := range out {
		for b0 := 0; b0 < in; b0 += blk {
			var amax float32
			for c := b0; c < b0+blk; c++ {
				amax = max(amax, float32(math.Abs(float64(v[r*in+c]))))
			}
			var sv float32
			if g.nvfp4 {
				code := num.F32ToE4M3(max(amax/6, 1e-12) / global)
				s[(r*in+b0)/blk] = code
				sv = num.E4M3ToF32(code) * global
			} else {
				e := num.CeilLog2(max(amax, 1e-30) / 6)
				s[(r*in+b0)/blk] = num.E8M0FromExp(e)
				sv = num.Pow2F32(e)
			}
			for c := b0; c < b0+blk; c++ {
				codes[r*in+c] = num.F32ToE2M1(v[r*in+c] / sv)
			}
		}
	}
	l := checkpoint.Linear{Name: name, Format: checkpoint.FormatMXFP4, Out: out, In: in,
		Weight: safetensors.Tensor{Name: name + ".weight", DType: safetensors.I8, Shape: []int{out, in / 2}, Data: num.PackFP4(codes)},
		Scale:  safetensors.Tensor{Name: name + ".scale", DType: safetensors.F8E8M0, Shape: []int{out, in / blk}, Data: s}}
	if g.nvfp4 {
		l.Format = checkpoint.FormatNVFP4
		l.Weight.DType = safetensors.U8
		l.Scale.DType = safetensors.F8E4M3
		l.Scale2 = global
	}
	return l
}

func (g *gen) ones(name string, n int, jitter float64) safetensors.Tensor {
	v := g.normal(n, jitter)
	for i := range v {
		v[i] += 1
	}
	return bf16Tensor(name, v, n)
}

func (g *gen) hc(name string, c *checkpoint.Config, mix int, head bool) checkpoint.HC {
	n := c.HcMult
	fn := g.normal(mix*n*c.Dim, 0.02/math.Sqrt(float64(n*c.Dim)))
	base := g.normal(mix, 0.1)
	if !head {
		for j := range n {
			base[2*n+j*n+j] += 2 // comb near identity
		}
	}
	ns := 3
	if head {
		ns = 1
	}
	scale := make([]float32, ns)
	for i := range scale {
		scale[i] = 0.5 + float32(g.rng.Float64())
	}
	return checkpoint.HC{Fn: f32Tensor(name+"_fn", fn, mix, n*c.Dim), Base: f32Tensor(name+"_base", base, mix), Scale: f32Tensor(name+"_scale", scale, ns)}
}

func (g *gen) compressor(pre string, c *checkpoint.Config, ratio, dim int) checkpoint.Compressor {
	cc := 1
	if ratio == 4 {
		cc = 2
	}
	std := 1 / math.Sqrt(float64(c.Dim))
	return checkpoint.Compressor{Ratio: ratio, Dim: dim,
		WKV:   g.bf16Linear(pre+".wkv", cc*dim, c.Dim, std),
		WGate: g.bf16Linear(pre+".wgate", cc*dim, c.Dim, std),
		APE:   f32Tensor(pre+".ape", g.normal(ratio*cc*dim, 0.5), ratio, cc*dim),
		Norm:  g.ones(pre+".norm.weight", dim, 0.1)}
}

func (g *gen) layer(c *checkpoint.Config, idx int, pre string) checkpoint.Layer {
	d := c.Dim
	sd := func(in int) float64 { return 1 / math.Sqrt(float64(in)) }
	r := c.Ratio(idx)
	l := checkpoint.Layer{Index: idx, Ratio: r,
		HcAttn: g.hc(pre+"hc_attn", c, c.HcMix(), false), HcFFN: g.hc(pre+"hc_ffn", c, c.HcMix(), false),
		AttnNorm: g.ones(pre+"attn_norm.weight", d, 0.1), FFNNorm: g.ones(pre+"ffn_norm.weight", d, 0.1)}
	a := &l.Attn
	a.Sink = f32Tensor(pre+"attn.attn_sink", g.normal(c.Heads, 1), c.Heads)
	a.WqA = g.fp8Linear(pre+"attn.wq_a", c.QLoraRank, d, sd(d))
	a.QNorm = g.ones(pre+"attn.q_norm.weight", c.QLoraRank, 0.1)
	a.WqB = g.fp8Linear(pre+"attn.wq_b", c.Heads*c.HeadDim, c.QLoraRank, sd(c.QLoraRank))
	a.WKV = g.fp8Linear(pre+"attn.wkv", c.HeadDim, d, sd(d))
	a.KVNorm = g.ones(pre+"attn.kv_norm.weight", c.HeadDim, 0.1)
	gk := c.Heads / c.OGroups * c.HeadDim
	a.WoA = g.fp8Linear(pre+"attn.wo_a", c.OGroups*c.OLoraRank, gk, sd(gk))
	a.WoB = g.fp8Linear(pre+"attn.wo_b", d, c.OGroups*c.OLoraRank, sd(c.OGroups*c.OLoraRank))
	if r > 0 {
		cp := g.compressor(pre+"attn.compressor", c, r, c.HeadDim)
		a.Compressor = &cp
	}
	if r == 4 {
		a.Indexer = &checkpoint.Indexer{
			WqB:         g.fp8Linear(pre+"attn.indexer.wq_b", c.IndexHeads*c.IndexHeadDim, c.QLoraRank, sd(c.QLoraRank)),
			WeightsProj: g.bf16Linear(pre+"attn.indexer.weights_proj", c.IndexHeads, d, sd(d)),
			Compressor:  g.compressor(pre+"attn.indexer.compressor", c, r, c.IndexHeadDim),
		}
	}
	m := &l.FFN
	m.Gate = g.bf16Linear(pre+"ffn.gate", c.Experts, d, sd(d))
	if idx < c.HashLayers && idx < c.Layers {
		t := make([]byte, 8*c.Vocab*c.TopK)
		for v := range c.Vocab {
			perm := g.rng.Perm(c.Experts)
			for k := range c.TopK {
				binary.LittleEndian.PutUint64(t[8*(v*c.TopK+k):], uint64(perm[k]))
			}
		}
		m.Tid2Eid = safetensors.Tensor{Name: pre + "ffn.gate.tid2eid", DType: safetensors.I64, Shape: []int{c.Vocab, c.TopK}, Data: t}
	} else {
		m.Bias = f32Tensor(pre+"ffn.gate.bias", g.normal(c.Experts, 0.1), c.Experts)
	}
	I := c.MoEInter
	m.Shared = checkpoint.Expert{W1: g.fp8Linear(pre+"ffn.shared_experts.w1", I, d, sd(d)),
		W2: g.fp8Linear(pre+"ffn.shared_experts.w2", d, I, sd(I)), W3: g.fp8Linear(pre+"ffn.shared_experts.w3", I, d, sd(d))}
	for e := range c.Experts {
		ep := fmt.Sprintf("%sffn.experts.%d.", pre, e)
		m.Experts = append(m.Experts, checkpoint.Expert{W1: g.fp4Linear(ep+"w1", I, d, sd(d)),
			W2: g.fp4Linear(ep+"w2", d, I, sd(I)), W3: g.fp4Linear(ep+"w3", I, d, sd(d))})
	}
	return l
}

// Options tweak the generated weights.
type Options struct {
	NVFP4 bool // routed experts of the main layers as NVFP4
}

// Weights generates random weights for c (deterministic in seed).
func Weights(c *checkpoint.Config, seed uint64, o Options) *checkpoint.Weights {
	g := &gen{rng: rand.New(rand.NewPCG(seed, 0x5eed)), nvfp4: o.NVFP4}
	d := c.Dim
	w := &checkpoint.Weights{Config: c,
		Embed:  bf16Tensor("embed.weight", g.normal(c.Vocab*d, 1), c.Vocab, d),
		Head:   g.bf16Linear("head", c.Vocab, d, 1/math.Sqrt(float64(d))),
		Norm:   g.ones("norm.weight", d, 0.1),
		HcHead: g.hc("hc_head", c, c.HcMult, true)}
	for i := range c.Layers {
		w.Layers = append(w.Layers, g.layer(c, i, fmt.Sprintf("layers.%d.", i)))
	}
	if c.MTPLayers > 0 {
		g.nvfp4 = false // MTP experts stay MXFP4 (spec §9)
		pre := "mtp.0."
		m := checkpoint.MTP{Layer: g.layer(c, c.Layers, pre),
			EProj: g.fp8Linear(pre+"e_proj", d, d, 1/math.Sqrt(float64(d))),
			HProj: g.fp8Linear(pre+"h_proj", d, d, 1/math.Sqrt(float64(d))),
			ENorm: g.ones(pre+"enorm.weight", d, 0.1), HNorm: g.ones(pre+"hnorm.weight", d, 0.1),
			Norm: g.ones(pre+"norm.weight", d, 0.1), HcHead: g.hc(pre+"hc_head", c, c.HcMult, true)}
		w.MTP = append(w.MTP, m)
	}
	return w
}
