package opcheck

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/rope"
	"github.com/megamoe/megamoe/safetensors"
)

// OpDims are the model dimensions CheckOps runs every backend op at.
type OpDims struct {
	Name                                     string
	Dim, Heads, HeadDim, RopeDim             int
	QLora, OGroups, OLora                    int
	HcMult, Sinkhorn                         int
	Window                                   int
	IndexHeads, IndexHeadDim, IndexTopK      int
	Experts, TopK, Inter, ExpertSample       int // ExpertSample distinct experts are built
	Vocab                                    int
	SwigluLimit, RouteScale, NormEps, HcEps  float32
	RopeTheta, CompressTheta                 float64
	YaRN                                     *rope.YaRN
	Tokens                                   []int // rows for cheap ops
	BigTokens                                []int // rows for linears, experts, router
	HeadRows                                 []int // rows for the vocab head
	Prefill, Prefill2, DecodeSteps, HashRows int   // KV schedule, tid2eid rows
}

// FlashDims are DeepSeek-V4-Flash's dimensions.
func FlashDims() OpDims { return presetDims("flash") }

// ProDims are DeepSeek-V4-Pro's dimensions.
func ProDims() OpDims { return presetDims("pro") }

func presetDims(name string) OpDims {
	c, err := checkpoint.PresetConfig(name)
	if err != nil {
		panic(err) // embedded configs: cannot fail
	}
	d := OpDims{Name: name, Dim: c.Dim, Heads: c.Heads, HeadDim: c.HeadDim, RopeDim: c.RopeDim,
		QLora: c.QLoraRank, OGroups: c.OGroups, OLora: c.OLoraRank, HcMult: c.HcMult, Sinkhorn: c.HcSinkhorn,
		Window: c.Window, IndexHeads: c.IndexHeads, IndexHeadDim: c.IndexHeadDim, IndexTopK: c.IndexTopK,
		Experts: c.Experts, TopK: c.TopK, Inter: c.MoEInter, ExpertSample: 16, Vocab: c.Vocab,
		SwigluLimit: float32(c.SwigluLimit), RouteScale: float32(c.RouteScale), NormEps: float32(c.NormEps), HcEps: float32(c.HcEps),
		RopeTheta: c.RopeTheta, CompressTheta: c.CompressRopeTheta,
		Tokens: []int{1, 64, 512}, BigTokens: []int{1, 64}, HeadRows: []int{1, 16},
		Prefill: 2048, Prefill2: 300, DecodeSteps: 3, HashRows: 1000}
	if rs := c.RopeScaling; rs != nil && rs.OriginalLen > 0 {
		d.YaRN = &rope.YaRN{Factor: rs.Factor, OriginalLen: rs.OriginalLen, BetaFast: rs.BetaFast, BetaSlow: rs.BetaSlow}
	}
	return d
}

// Abort is the panic value a Reporter's Fatalf may use to end the current op
// group; CheckOps recovers it and records a failed row.
type Abort struct{ Msg string }

// CheckOps runs every backend op at dims d on fresh random inputs, the
// device b (a *gpu.Backend) against a CPU reference, and returns one row per
// comparison. Op groups whose name does not contain only (case-insensitive)
// are skipped. b's numerics are set to mode.
func CheckOps(b Device, d OpDims, mode backend.Numerics, seed uint64, only string, r Reporter) []Row {
	b.SetNumerics(mode)
	var rows []Row
	tab := &embedTable{}
	for i, g := range opGroups {
		if only != "" && !strings.Contains(g.name, strings.ToLower(only)) {
			continue
		}
		// A fresh CPU backend per group: its dense-weight budget is per backend.
		c := cpu.New(cpu.Options{DenseBudget: 16 << 30, DenseMaxElems: 1 << 31})
		c.SetNumerics(mode)
		p := NewPair(r, c, b, seed+uint64(i)*0x9e3779b97f4a7c15)
		p.prefix = fmt.Sprintf("%s %s ", d.Name, mode)
		if msg := runGroup(func() { g.run(p, d, tab) }); msg != "" {
			p.rows = append(p.rows, Row{Name: p.prefix + g.name, Err: msg})
		}
		p.Release()
		if sink, ok := r.(RowSink); ok {
			for _, row := range p.rows {
				sink.Row(row)
			}
		}
		rows = append(rows, p.rows...)
	}
	return rows
}

// RowSink is implemented by Reporters that want CheckOps' rows as each op
// group finishes (progress output).
type RowSink interface{ Row(Row) }

// runGroup runs f and returns the message of an Abort panic ("" otherwise).
func runGroup(f func()) (msg string) {
	defer func() {
		if v := recover(); v != nil {
			a, ok := v.(Abort)
			if !ok {
				panic(v)
			}
			msg = a.Msg
			if msg == "" {
				msg = "aborted"
			}
		}
	}()
	f()
	return ""
}

type opGroup struct {
	name string
	run  func(p *Pair, d OpDims, tab *embedTable)
}

var opGroups = []opGroup{
	{name: "rmsnorm", run: checkRMSNorm},
	{name: "hc_pre hc_head", run: checkHcPreHead},
	{name: "hc_post", run: checkHcPost},
	{name: "linear", run: checkLinears},
	{name: "grouped_out_proj", run: checkGroupedOutProj},
	{name: "head_norm", run: checkHeadNorm},
	{name: "rope", run: checkRope},
	{name: "kv_quant", run: checkKVQuant},
	{name: "head_norm_rope rmsnorm_rope_kvq", run: checkEpilogues},
	{name: "hadamard_fp4 rope_hadamard_fp4", run: checkHadamard},
	{name: "kv_path compress indexer_topk sparse_attention write_window", run: checkKVPath},
	{name: "copy_slot", run: checkCopySlot},
	{name: "copy_block", run: checkCopyBlock},
	{name: "router", run: checkRouter},
	{name: "experts", run: checkExperts},
	{name: "swiglu combine add_streams scale", run: checkElementwise},
	{name: "embed", run: checkEmbed},
	{name: "head_linear_f32", run: checkHead},
}

// gpu runs an op on the GPU, timed, aborting the group on an error.
func (p *Pair) gpu(name string, f func() error) {
	p.t.Helper()
	if err := p.timeGPU(f); err != nil {
		p.t.Fatalf("%s gpu: %v", name, err)
	}
}

func (p *Pair) cpu(name string, err error) {
	p.t.Helper()
	if err != nil {
		p.t.Fatalf("%s cpu: %v", name, err)
	}
}

func (p *Pair) vec(v []float32) (backend.Vec, backend.Vec) {
	g, err := p.G.NewVec(v)
	p.Must(err)
	return cpu.NewVec(v), g
}

// NormWeights are RMSNorm weights of d bf16 values near 1, both sides.
func (p *Pair) NormWeights(d int) (backend.Vec, backend.Vec) {
	w := make([]float32, d)
	for i := range w {
		w[i] = num.RoundBF16(float32(1 + 0.1*p.Rng.NormFloat64()))
	}
	return p.vec(w)
}

func (p *Pair) prep(l *checkpoint.Linear) (backend.Linear, backend.Linear) {
	c, err := p.C.PrepareLinear(l)
	p.Must(err)
	g, err := p.G.PrepareLinear(l)
	p.Must(err)
	return c, g
}

func checkRMSNorm(p *Pair, d OpDims, _ *embedTable) {
	cw, gw := p.NormWeights(d.Dim)
	for _, n := range d.Tokens {
		for _, segs := range []int{1, d.HcMult} { // attn_norm on [N, d], and hc-wide rows
			x := p.Rand(n, segs*d.Dim, 1)
			o := p.Out(n, segs*d.Dim)
			p.cpu("rmsnorm", p.C.RMSNorm(x.C, cw, d.NormEps, o.C))
			p.gpu("rmsnorm", func() error { return p.G.RMSNorm(x.G, gw, d.NormEps, o.G) })
			p.Check(fmt.Sprintf("rmsnorm %dx%dx%d", n, segs, d.Dim), o, 1e-3)
		}
	}
}

func (p *Pair) hcArgs(d OpDims) backend.HcArgs {
	return backend.HcArgs{Streams: d.HcMult, Sinkhorn: d.Sinkhorn, Eps: d.HcEps, NormEps: d.NormEps}
}

func checkHcPreHead(p *Pair, d OpDims, _ *embedTable) {
	n, a := d.HcMult, p.hcArgs(d)
	lim := 2e-3
	if p.C.Numerics() == backend.Exact {
		lim = 1e-5
	}
	cPre, gPre := p.HCParams((2+n)*n, n, d.Dim, []float32{0.7, 1.3, 0.9})
	cHead, gHead := p.HCParams(n, n, d.Dim, []float32{1.1})
	cw, gw := p.NormWeights(d.Dim)
	for _, rows := range d.Tokens {
		tag := fmt.Sprintf("%dx%dx%d iters=%d", rows, n, d.Dim, d.Sinkhorn)
		x := p.Rand(rows, n*d.Dim, 1)
		o, mix := p.Out(rows, d.Dim), p.Out(rows, n+n*n)
		p.cpu("hc pre", p.C.HcPre(x.C, cPre, a, o.C, mix.C))
		p.gpu("hc pre", func() error { return p.G.HcPre(x.G, gPre, a, o.G, mix.G) })
		p.Check("hc_pre out "+tag, o, lim)
		p.Check("hc_pre mix "+tag, mix, 1e-4)
		// attn_norm / ffn_norm inside hc pre (HcPreNormLinears, no linears)
		y, mixn := p.Out(rows, d.Dim), p.Out(rows, n+n*n)
		p.cpu("hc pre norm", p.C.HcPreNormLinears(x.C, cPre, a, cw, d.NormEps, y.C, mixn.C, nil, nil))
		p.gpu("hc pre norm", func() error {
			return p.G.HcPreNormLinears(x.G, gPre, a, gw, d.NormEps, y.G, mixn.G, nil, nil)
		})
		p.Check("hc_pre+norm normed "+tag, y, lim)
		p.Check("hc_pre+norm mix "+tag, mixn, 1e-4)
		oh := p.Out(rows, d.Dim)
		p.cpu("hc head", p.C.HcHead(x.C, cHead, a, oh.C))
		p.gpu("hc head", func() error { return p.G.HcHead(x.G, gHead, a, oh.G) })
		p.Check("hc_head "+tag, oh, lim)
	}
}

func checkHcPost(p *Pair, d OpDims, _ *embedTable) {
	n, a := d.HcMult, p.hcArgs(d)
	for _, rows := range d.Tokens {
		x := p.Rand(rows, n*d.Dim, 1)
		mix := p.Rand(rows, n+n*n, 0.5)
		sub := p.Rand(rows, d.Dim, 1)
		o := p.Out(rows, n*d.Dim)
		p.cpu("hc post", p.C.HcPost(sub.C, x.C, mix.C, a, o.C))
		p.gpu("hc post", func() error { return p.G.HcPost(sub.G, x.G, mix.G, a, o.G) })
		p.Check(fmt.Sprintf("hc_post %dx%dx%d", rows, n, d.Dim), o, 1e-3)
	}
}

// checkLinears runs Linear with FP8-block weights at the attention and shared-expert shapes.
func checkLinears(p *Pair, d OpDims, _ *embedTable) {
	shapes := []struct {
		name    string
		out, in int
	}{
		{"wq_a", d.QLora, d.Dim},
		{"wq_b", d.Heads * d.HeadDim, d.QLora},
		{"wkv", d.HeadDim, d.Dim},
		{"wo_b", d.Dim, d.OGroups * d.OLora},
		{"shared w1/w3", d.Inter, d.Dim},
		{"shared w2", d.Dim, d.Inter},
		{"indexer wq_b", d.IndexHeads * d.IndexHeadDim, d.QLora},
	}
	for _, s := range shapes {
		cw, gw := p.prep(RandLinear(p.Rng, checkpoint.FormatFP8Block, s.out, s.in))
		for _, m := range d.BigTokens {
			x := p.Rand(m, s.in, 1)
			o := p.Out(m, s.out)
			p.cpu("linear", p.C.Linear(x.C, cw, o.C))
			p.gpu("linear", func() error { return p.G.Linear(x.G, gw, o.G) })
			p.Check(fmt.Sprintf("linear %s fp8 %dx%dx%d", s.name, m, s.out, s.in), o, 1e-2)
		}
		p.Release()
	}
	checkFusedLinears(p, d)
}

// checkFusedLinears runs the fused ops that end in linears as the model
// does: wq_a|wkv from one input (Linears), q_norm then wq_b|indexer wq_b
// (NormLinears), and the shared expert's SwiGLU then w2 (SwiGLULinear).
func checkFusedLinears(p *Pair, d OpDims) {
	fp8 := checkpoint.FormatFP8Block
	cA, gA := p.prep(RandLinear(p.Rng, fp8, d.QLora, d.Dim))
	cKV, gKV := p.prep(RandLinear(p.Rng, fp8, d.HeadDim, d.Dim))
	cB, gB := p.prep(RandLinear(p.Rng, fp8, d.Heads*d.HeadDim, d.QLora))
	cI, gI := p.prep(RandLinear(p.Rng, fp8, d.IndexHeads*d.IndexHeadDim, d.QLora))
	c2, g2 := p.prep(RandLinear(p.Rng, fp8, d.Dim, d.Inter))
	cw, gw := p.NormWeights(d.QLora)
	for _, m := range d.BigTokens {
		x := p.Rand(m, d.Dim, 1)
		qa, kv := p.Out(m, d.QLora), p.Out(m, d.HeadDim)
		p.cpu("linears", p.C.Linears(x.C, []backend.Linear{cA, cKV}, []backend.Tensor{qa.C, kv.C}))
		p.gpu("linears", func() error {
			return p.G.Linears(x.G, []backend.Linear{gA, gKV}, []backend.Tensor{qa.G, kv.G})
		})
		p.Check(fmt.Sprintf("linears wq_a|wkv fp8 %dx%d", m, d.Dim), qa, 1e-2)
		p.Check(fmt.Sprintf("linears wkv fp8 %dx%d", m, d.Dim), kv, 1e-2)

		y := p.Rand(m, d.QLora, 1)
		yn, q, qi := p.Out(m, d.QLora), p.Out(m, d.Heads*d.HeadDim), p.Out(m, d.IndexHeads*d.IndexHeadDim)
		p.cpu("norm linears", p.C.NormLinears(y.C, cw, d.NormEps, yn.C, []backend.Linear{cB, cI}, []backend.Tensor{q.C, qi.C}))
		p.gpu("norm linears", func() error {
			return p.G.NormLinears(y.G, gw, d.NormEps, yn.G, []backend.Linear{gB, gI}, []backend.Tensor{q.G, qi.G})
		})
		p.Check(fmt.Sprintf("norm_linears q_norm %dx%d", m, d.QLora), yn, 1e-3)
		p.Check(fmt.Sprintf("norm_linears wq_b fp8 %dx%d", m, d.QLora), q, 1e-2)
		p.Check(fmt.Sprintf("norm_linears indexer wq_b fp8 %dx%d", m, d.QLora), qi, 1e-2)

		g, u := p.Rand(m, d.Inter, 3), p.Rand(m, d.Inter, 3)
		h, o := p.Out(m, d.Inter), p.Out(m, d.Dim)
		p.cpu("swiglu linear", p.C.SwiGLULinear(g.C, u.C, d.SwigluLimit, h.C, c2, o.C))
		p.gpu("swiglu linear", func() error { return p.G.SwiGLULinear(g.G, u.G, d.SwigluLimit, h.G, g2, o.G) })
		p.Check(fmt.Sprintf("swiglu_linear swiglu %dx%d", m, d.Inter), h, 1e-3)
		p.Check(fmt.Sprintf("swiglu_linear w2 fp8 %dx%d", m, d.Inter), o, 1e-2)
	}
	p.Release()
}

func checkGroupedOutProj(p *Pair, d OpDims, _ *embedTable) {
	K := d.Heads * d.HeadDim / d.OGroups
	for _, f := range []checkpoint.Format{checkpoint.FormatFP8Block, checkpoint.FormatBF16} {
		cw, gw := p.prep(RandLinear(p.Rng, f, d.OGroups*d.OLora, K))
		for _, m := range d.BigTokens {
			x := p.Rand(m, d.OGroups*K, 1)
			o := p.Out(m, d.OGroups*d.OLora)
			p.cpu("grouped out proj", p.C.GroupedOutProj(x.C, cw, d.OGroups, o.C))
			p.gpu("grouped out proj", func() error { return p.G.GroupedOutProj(x.G, gw, d.OGroups, o.G) })
			p.Check(fmt.Sprintf("grouped_out_proj wo_a %v %dx%dx(%dx%d)", f, m, d.OGroups*d.OLora, d.OGroups, K), o, 1e-2)
		}
	}
}

func checkHeadNorm(p *Pair, d OpDims, _ *embedTable) {
	for _, rows := range d.BigTokens {
		w := d.Heads * d.HeadDim
		v := make([]float32, rows*w)
		for i := range v {
			s := math.Pow(10, float64((i/d.HeadDim)%6)-3) // per-head magnitudes 1e-3…1e2
			v[i] = num.RoundBF16(float32(p.Rng.NormFloat64() * s))
		}
		x := p.From(rows, w, v)
		p.cpu("head norm", p.C.HeadNorm(x.C, d.HeadDim, d.NormEps))
		p.gpu("head norm", func() error { return p.G.HeadNorm(x.G, d.HeadDim, d.NormEps) })
		p.Check(fmt.Sprintf("head_norm q %dx%dx%d", rows, d.Heads, d.HeadDim), x, 1e-6)
	}
}

// ropeBatch has one sequence at position 0 and one ending just below 2^20.
func ropeBatch(n int) *backend.Batch {
	n0 := (n + 1) / 2
	far := 1<<20 - (n - n0) - 1
	return StepBatchBlocks([]int{0, far}, []int{n0, n - n0}, 1)
}

func checkRope(p *Pair, d OpDims, _ *embedTable) {
	plain, err := rope.New(d.RopeDim, d.RopeTheta, nil)
	p.Must(err)
	yarn, err := rope.New(d.RopeDim, d.CompressTheta, d.YaRN)
	p.Must(err)
	for _, fr := range []struct {
		name string
		f    *rope.Freqs
	}{{"theta", plain}, {"yarn", yarn}} {
		for _, rows := range d.BigTokens {
			bt := ropeBatch(max(rows, 2))
			n := bt.Rows()
			for _, inv := range []bool{false, true} {
				q := p.Rand(n, d.Heads*d.HeadDim, 1)
				a := backend.RopeArgs{Freqs: fr.f, HeadDim: d.HeadDim, Inverse: inv}
				p.cpu("rope", p.C.Rope(q.C, a, bt))
				p.gpu("rope", func() error { return p.G.Rope(q.G, a, bt) })
				p.Check(fmt.Sprintf("rope %s inverse=%v %dx%dx%d pos 0,~1e6", fr.name, inv, n, d.Heads, d.HeadDim), q, 2e-3)
			}
		}
	}
}

func checkKVQuant(p *Pair, d OpDims, _ *embedTable) {
	for _, rows := range d.Tokens {
		kv := p.Rand(rows, d.HeadDim, 2)
		p.cpu("kv quant", p.C.KVQuant(kv.C, d.HeadDim-d.RopeDim, 64))
		p.gpu("kv quant", func() error { return p.G.KVQuant(kv.G, d.HeadDim-d.RopeDim, 64) })
		p.Check(fmt.Sprintf("kv_quant fp8 %dx%d nope=%d", rows, d.HeadDim, d.HeadDim-d.RopeDim), kv, 1e-6)
	}
}

func checkHadamard(p *Pair, d OpDims, _ *embedTable) {
	for _, rows := range d.Tokens {
		x := p.Rand(rows, d.IndexHeads*d.IndexHeadDim, 1)
		p.cpu("hadamard", p.C.HadamardFP4(x.C, d.IndexHeadDim))
		p.gpu("hadamard", func() error { return p.G.HadamardFP4(x.G, d.IndexHeadDim) })
		p.Check(fmt.Sprintf("hadamard_fp4 indexer q %dx%dx%d", rows, d.IndexHeads, d.IndexHeadDim), x, 1e-6)
	}
	// The indexer's q epilogue as the model runs it: rope (the indexer's
	// heads carry the main rope dims), then the transform.
	fr, err := rope.New(d.RopeDim, d.CompressTheta, d.YaRN)
	p.Must(err)
	lim := 2e-3 // rope's
	if p.C.Numerics() == backend.Faithful {
		lim = 2e-2 // a bf16 step of the rope can move an FP4 value a whole e2m1 step
	}
	for _, rows := range d.Tokens {
		bt := ropeBatch(max(rows, 2))
		n := bt.Rows()
		x := p.Rand(n, d.IndexHeads*d.IndexHeadDim, 1)
		a := backend.RopeArgs{Freqs: fr, HeadDim: d.IndexHeadDim}
		p.cpu("rope hadamard", p.C.RopeHadamardFP4(x.C, a, bt))
		p.gpu("rope hadamard", func() error { return p.G.RopeHadamardFP4(x.G, a, bt) })
		p.Check(fmt.Sprintf("rope_hadamard_fp4 indexer q %dx%dx%d pos 0,~1e6", n, d.IndexHeads, d.IndexHeadDim), x, lim)
	}
}

func checkElementwise(p *Pair, d OpDims, _ *embedTable) {
	for _, rows := range d.Tokens {
		tag := fmt.Sprintf("%dx%d", rows, d.Dim)
		x := p.Rand(rows, d.HcMult*d.Dim, 1)
		e := p.Rand(rows, d.Dim, 0.5)
		p.cpu("add streams", p.C.AddStreams(x.C, e.C))
		p.gpu("add streams", func() error { return p.G.AddStreams(x.G, e.G) })
		p.Check(fmt.Sprintf("add_streams %dx%dx%d", rows, d.HcMult, d.Dim), x, 1e-3)
		p.cpu("scale", p.C.Scale(x.C, 0.37))
		p.gpu("scale", func() error { return p.G.Scale(x.G, 0.37) })
		p.Check(fmt.Sprintf("scale %dx%dx%d", rows, d.HcMult, d.Dim), x, 1e-3)

		g, u := p.Rand(rows, d.Inter, 3), p.Rand(rows, d.Inter, 3)
		for _, lim := range []float32{0, d.SwigluLimit} {
			o := p.Out(rows, d.Inter)
			p.cpu("swiglu", p.C.SwiGLU(g.C, u.C, lim, o.C))
			p.gpu("swiglu", func() error { return p.G.SwiGLU(g.G, u.G, lim, o.G) })
			p.Check(fmt.Sprintf("swiglu limit %g %dx%d", lim, rows, d.Inter), o, 1e-3)
		}
		acc, sh := p.Rand(rows, d.Dim, 3), p.Rand(rows, d.Dim, 3)
		o := p.Out(rows, d.Dim)
		p.cpu("combine", p.C.Combine(acc.C, sh.C, o.C))
		p.gpu("combine", func() error { return p.G.Combine(acc.G, sh.G, o.G) })
		p.Check("combine "+tag, o, 1e-3)
	}
}

// embedTable is the bf16 [vocab, dim] table shared by embed and head (built once).
type embedTable struct {
	dim  int
	data []byte
}

func (t *embedTable) get(p *Pair, vocab, dim int) []byte {
	if t.data == nil || t.dim != dim || len(t.data) != 2*vocab*dim {
		// Random bf16 bits (sign, exponent 2^-7…2^-4, mantissa): ~1e9 values
		// for Pro, far faster than normal draws.
		t.dim, t.data = dim, make([]byte, 2*vocab*dim)
		for i := 0; i < vocab*dim; i += 4 {
			r := p.Rng.Uint64()
			for k := range min(4, vocab*dim-i) {
				b := uint16(r >> (16 * k))
				binary.LittleEndian.PutUint16(t.data[2*(i+k):], b&0x807f|(120+(b>>7)&3)<<7)
			}
		}
	}
	return t.data
}

func checkEmbed(p *Pair, d OpDims, tab *embedTable) {
	st := safetensors.Tensor{Name: "embed.weight", DType: safetensors.BF16, Shape: []int{d.Vocab, d.Dim}, Data: tab.get(p, d.Vocab, d.Dim)}
	ce, err := p.C.PrepareEmbedding(st, d.Vocab, d.Dim)
	p.Must(err)
	ge, err := p.G.PrepareEmbedding(st, d.Vocab, d.Dim)
	p.Must(err)
	for _, n := range d.Tokens {
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32(p.Rng.IntN(d.Vocab))
		}
		ids[0] = int32(d.Vocab - 1)
		if n > 1 {
			ids[1] = 0
		}
		o := p.Out(n, d.HcMult*d.Dim)
		p.cpu("embed", p.C.Embed(ce, ids, d.HcMult, o.C))
		p.gpu("embed", func() error { return p.G.Embed(ge, ids, d.HcMult, o.G) })
		p.Check(fmt.Sprintf("embed bf16 vocab=%d %dx%dx%d", d.Vocab, n, d.HcMult, d.Dim), o, 0)
	}
}

func checkHead(p *Pair, d OpDims, tab *embedTable) {
	st := safetensors.Tensor{Name: "head.weight", DType: safetensors.BF16, Shape: []int{d.Vocab, d.Dim}, Data: tab.get(p, d.Vocab, d.Dim)}
	cw, gw := p.prep(&checkpoint.Linear{Name: "head", Format: checkpoint.FormatBF16, Out: d.Vocab, In: d.Dim, Weight: st})
	for _, m := range d.HeadRows {
		x := p.Rand(m, d.Dim, 1)
		o := p.Out(m, d.Vocab)
		p.cpu("head", p.C.LinearF32(x.C, cw, o.C))
		p.gpu("head", func() error { return p.G.LinearF32(x.G, gw, o.G) })
		p.Check(fmt.Sprintf("head linear_f32 bf16 %dx%dx%d", m, d.Vocab, d.Dim), o, 1e-5)
	}
	// The head's rows: the last row of each of three sequences of the streams
	// (runs of rows: copies); scattered rows of several sequences (many
	// runs: one kernel).
	n := 7
	xs := p.Rand(n, d.HcMult*d.Dim, 1)
	for _, rows := range [][]int{{2, 3, 6}, {0, 2, 3, 5, 6, 1}} {
		g := p.Out(len(rows), d.HcMult*d.Dim)
		p.cpu("gather rows", p.C.GatherRows(xs.C, rows, g.C))
		p.gpu("gather rows", func() error { return p.G.GatherRows(xs.G, rows, g.G) })
		p.Check(fmt.Sprintf("gather_rows %v of %dx%d", rows, n, d.HcMult*d.Dim), g, 0)
	}
}
