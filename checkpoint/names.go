package checkpoint

import (
	"fmt"
	"slices"

	"github.com/megamoe/megamoe/safetensors"
)

// LinearKind is the family a linear belongs to; it decides which on-disk formats
// are acceptable for it (spec §8, §9).
type LinearKind int

const (
	// KindFP8 linears ship as F8_E4M3 + F8_E8M0 128×128 block scales; a
	// dequantised BF16 (or F32) weight without scale is also accepted.
	KindFP8 LinearKind = iota
	// KindPlain linears ship as BF16 (F32 accepted): head, router gate,
	// indexer weights_proj, compressor wkv/wgate.
	KindPlain
	// KindExpert are the routed experts: MXFP4 (I8 + E8M0 per 32) officially,
	// NVFP4 (U8 + E4M3 per 16 + F32 scalars) in ModelOpt checkpoints; FP8 block
	// and BF16 are accepted too.
	KindExpert
)

func (k LinearKind) String() string {
	switch k {
	case KindFP8:
		return "fp8-linear"
	case KindPlain:
		return "plain-linear"
	case KindExpert:
		return "routed-expert"
	}
	return "unknown-kind"
}

// allowed reports whether f is an acceptable format for a linear of kind k.
func (k LinearKind) allowed(f Format) bool {
	switch k {
	case KindFP8:
		return f == FormatFP8Block || f == FormatBF16 || f == FormatF32
	case KindPlain:
		return f == FormatBF16 || f == FormatF32
	case KindExpert:
		return f == FormatMXFP4 || f == FormatNVFP4 || f == FormatFP8Block || f == FormatBF16 || f == FormatF32
	}
	return false
}

// official is the format of kind k in the official release.
func (k LinearKind) official() Format {
	switch k {
	case KindFP8:
		return FormatFP8Block
	case KindExpert:
		return FormatMXFP4
	}
	return FormatBF16
}

// TensorSpec is one expected tensor. A scalar has Shape [] (validation also
// accepts [1] for it, as some exporters write).
type TensorSpec struct {
	Name  string
	DType safetensors.DType
	Shape []int
}

// Bytes returns the tensor's data size.
func (s TensorSpec) Bytes() int64 {
	n := int64(s.DType.Size())
	for _, d := range s.Shape {
		n *= int64(d)
	}
	return n
}

func (s TensorSpec) String() string { return fmt.Sprintf("%s %v", s.DType, s.Shape) }

// LinearSpec is one expected linear (Name is the prefix before ".weight").
type LinearSpec struct {
	Name    string
	Kind    LinearKind
	Out, In int
}

// FormatFunc picks the storage format of one linear.
type FormatFunc func(l LinearSpec) Format

// OfficialFormats is the official release: FP8 linears, MXFP4 experts.
func OfficialFormats(l LinearSpec) Format { return l.Kind.official() }

// NVFP4Formats is a ModelOpt NVFP4 checkpoint: the routed experts of the main
// layers are NVFP4, everything else (including the MTP experts) is official.
func NVFP4Formats(l LinearSpec) Format {
	if l.Kind == KindExpert && !isMTP(l.Name) {
		return FormatNVFP4
	}
	return l.Kind.official()
}

func isMTP(name string) bool { return len(name) >= 4 && name[:4] == "mtp." }

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// LinearTensors returns the tensors that store linear l in format f.
func LinearTensors(l LinearSpec, f Format) []TensorSpec {
	w := l.Name + ".weight"
	switch f {
	case FormatF32:
		return []TensorSpec{{w, safetensors.F32, []int{l.Out, l.In}}}
	case FormatFP8Block:
		return []TensorSpec{{w, safetensors.F8E4M3, []int{l.Out, l.In}},
			{l.Name + ".scale", safetensors.F8E8M0, []int{ceilDiv(l.Out, 128), ceilDiv(l.In, 128)}}}
	case FormatMXFP4:
		return []TensorSpec{{w, safetensors.I8, []int{l.Out, l.In / 2}},
			{l.Name + ".scale", safetensors.F8E8M0, []int{l.Out, ceilDiv(l.In, 32)}}}
	case FormatNVFP4:
		return []TensorSpec{{w, safetensors.U8, []int{l.Out, l.In / 2}},
			{l.Name + ".weight_scale", safetensors.F8E4M3, []int{l.Out, ceilDiv(l.In, 16)}},
			{l.Name + ".weight_scale_2", safetensors.F32, []int{}},
			{l.Name + ".input_scale", safetensors.F32, []int{}}}
	}
	return []TensorSpec{{w, safetensors.BF16, []int{l.Out, l.In}}}
}

// visitor is driven by walk over the whole architecture; it either records
// what is expected (the name table) or hands out bound tensors.
type visitor interface {
	tensor(name string, dt safetensors.DType, shape ...int) safetensors.Tensor
	linear(l LinearSpec) Linear
}

// walk visits every tensor of the architecture of c in a fixed order (the
// order of the generated checkpoints) and assembles the typed structs from
// what the visitor returns. This is the single definition of the spec §8
// name table.
func walk(c *Config, v visitor) *Weights {
	d := c.Dim
	w := &Weights{Config: c}
	w.Embed = v.tensor("embed.weight", safetensors.BF16, c.Vocab, d)
	for i := range c.Layers {
		w.Layers = append(w.Layers, walkLayer(c, v, i, fmt.Sprintf("layers.%d.", i)))
	}
	for i := range c.MTPLayers {
		pre := fmt.Sprintf("mtp.%d.", i)
		m := MTP{Layer: walkLayer(c, v, c.Layers+i, pre)}
		m.EProj = v.linear(LinearSpec{pre + "e_proj", KindFP8, d, d})
		m.HProj = v.linear(LinearSpec{pre + "h_proj", KindFP8, d, d})
		m.ENorm = v.tensor(pre+"enorm.weight", safetensors.BF16, d)
		m.HNorm = v.tensor(pre+"hnorm.weight", safetensors.BF16, d)
		m.Norm = v.tensor(pre+"norm.weight", safetensors.BF16, d)
		m.HcHead = walkHC(c, v, pre+"hc_head", c.HcMult, 1)
		w.MTP = append(w.MTP, m)
	}
	if c.HasDSpark() {
		w.DSpark = walkDSpark(c, v)
	}
	w.Norm = v.tensor("norm.weight", safetensors.BF16, d)
	w.HcHead = walkHC(c, v, "hc_head", c.HcMult, 1)
	w.Head = v.linear(LinearSpec{"head", KindPlain, c.Vocab, d})
	return w
}

func walkHC(c *Config, v visitor, name string, mix, scales int) HC {
	return HC{
		Fn:    v.tensor(name+"_fn", safetensors.F32, mix, c.HcDim()),
		Base:  v.tensor(name+"_base", safetensors.F32, mix),
		Scale: v.tensor(name+"_scale", safetensors.F32, scales),
	}
}

func walkCompressor(c *Config, v visitor, pre string, ratio, dim int) Compressor {
	cc := 1
	if ratio == 4 {
		cc = 2 // overlapping windows: "a" and "b" halves
	}
	return Compressor{Ratio: ratio, Dim: dim,
		WKV:   v.linear(LinearSpec{pre + ".wkv", KindPlain, cc * dim, c.Dim}),
		WGate: v.linear(LinearSpec{pre + ".wgate", KindPlain, cc * dim, c.Dim}),
		APE:   v.tensor(pre+".ape", safetensors.F32, ratio, cc*dim),
		Norm:  v.tensor(pre+".norm.weight", safetensors.BF16, dim),
	}
}

func walkLayer(c *Config, v visitor, idx int, pre string) Layer {
	d := c.Dim
	r := c.Ratio(idx)
	l := Layer{Index: idx, Ratio: r}
	l.HcAttn = walkHC(c, v, pre+"hc_attn", c.HcMix(), 3)
	l.HcFFN = walkHC(c, v, pre+"hc_ffn", c.HcMix(), 3)
	l.AttnNorm = v.tensor(pre+"attn_norm.weight", safetensors.BF16, d)
	l.FFNNorm = v.tensor(pre+"ffn_norm.weight", safetensors.BF16, d)

	a := &l.Attn
	ap := pre + "attn."
	a.Sink = v.tensor(ap+"attn_sink", safetensors.F32, c.Heads)
	a.WqA = v.linear(LinearSpec{ap + "wq_a", KindFP8, c.QLoraRank, d})
	a.QNorm = v.tensor(ap+"q_norm.weight", safetensors.BF16, c.QLoraRank)
	a.WqB = v.linear(LinearSpec{ap + "wq_b", KindFP8, c.Heads * c.HeadDim, c.QLoraRank})
	a.WKV = v.linear(LinearSpec{ap + "wkv", KindFP8, c.HeadDim, d})
	a.KVNorm = v.tensor(ap+"kv_norm.weight", safetensors.BF16, c.HeadDim)
	a.WoA = v.linear(LinearSpec{ap + "wo_a", KindFP8, c.OGroups * c.OLoraRank, c.GroupHeads() * c.HeadDim})
	a.WoB = v.linear(LinearSpec{ap + "wo_b", KindFP8, d, c.OGroups * c.OLoraRank})
	if r != 0 {
		cp := walkCompressor(c, v, ap+"compressor", r, c.HeadDim)
		a.Compressor = &cp
	}
	if r == 4 {
		a.Indexer = &Indexer{
			WqB:         v.linear(LinearSpec{ap + "indexer.wq_b", KindFP8, c.IndexHeads * c.IndexHeadDim, c.QLoraRank}),
			WeightsProj: v.linear(LinearSpec{ap + "indexer.weights_proj", KindPlain, c.IndexHeads, d}),
			Compressor:  walkCompressor(c, v, ap+"indexer.compressor", r, c.IndexHeadDim),
		}
	}

	m := &l.FFN
	fp := pre + "ffn."
	m.Gate = v.linear(LinearSpec{fp + "gate", KindPlain, c.Experts, d})
	if idx < c.HashLayers && idx < c.Layers {
		m.Tid2Eid = v.tensor(fp+"gate.tid2eid", safetensors.I64, c.Vocab, c.TopK)
	} else {
		m.Bias = v.tensor(fp+"gate.bias", safetensors.F32, c.Experts)
	}
	I := c.MoEInter
	sp := fp + "shared_experts."
	m.Shared = Expert{
		W1: v.linear(LinearSpec{sp + "w1", KindFP8, I, d}),
		W2: v.linear(LinearSpec{sp + "w2", KindFP8, d, I}),
		W3: v.linear(LinearSpec{sp + "w3", KindFP8, I, d}),
	}
	m.Experts = make([]Expert, c.Experts)
	for e := range c.Experts {
		ep := fmt.Sprintf("%sexperts.%d.", fp, e)
		m.Experts[e] = Expert{
			W1: v.linear(LinearSpec{ep + "w1", KindExpert, I, d}),
			W2: v.linear(LinearSpec{ep + "w2", KindExpert, d, I}),
			W3: v.linear(LinearSpec{ep + "w3", KindExpert, I, d}),
		}
	}
	return l
}

// tableVisitor records the name table.
type tableVisitor struct {
	formats FormatFunc
	tensors []TensorSpec
	linears []LinearSpec
}

func (t *tableVisitor) tensor(name string, dt safetensors.DType, shape ...int) safetensors.Tensor {
	t.tensors = append(t.tensors, TensorSpec{name, dt, slices.Clone(shape)})
	return safetensors.Tensor{}
}

func (t *tableVisitor) linear(l LinearSpec) Linear {
	t.linears = append(t.linears, l)
	if t.formats != nil {
		t.tensors = append(t.tensors, LinearTensors(l, t.formats(l))...)
	}
	return Linear{}
}

// Tensors returns the full list of tensors a checkpoint of architecture c must
// hold when its linears are stored as formats says (nil: OfficialFormats), in
// a fixed order. c must be valid (Validate).
func Tensors(c *Config, formats FormatFunc) []TensorSpec {
	if formats == nil {
		formats = OfficialFormats
	}
	t := &tableVisitor{formats: formats}
	walk(c, t)
	return t.tensors
}

// Linears returns every linear of architecture c in table order.
func Linears(c *Config) []LinearSpec {
	t := &tableVisitor{}
	walk(c, t)
	return t.linears
}

// TotalBytes sums the data sizes of specs.
func TotalBytes(specs []TensorSpec) int64 {
	var n int64
	for _, s := range specs {
		n += s.Bytes()
	}
	return n
}
