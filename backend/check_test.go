package backend

import (
	"strings"
	"testing"

	"github.com/megamoe/megamoe/rope"
)

// Handles that only have shapes, for the validators.

type ten struct {
	r, c int
	dt   DType
}

func (t *ten) Rows() int        { return t.r }
func (t *ten) Cols() int        { return t.c }
func (t *ten) DType() DType     { return t.dt }
func f(r, c int) *ten           { return &ten{r, c, F32} }
func i(r, c int) *ten           { return &ten{r, c, I32} }
func batch(rows int) *Batch     { return &Batch{Pos: make([]int32, rows), Seq: make([]int32, rows)} }
func freqs(dim int) *rope.Freqs { return &rope.Freqs{RopeDim: dim} }

type lin struct{ out, in int }

func (l *lin) Out() int     { return l.out }
func (l *lin) In() int      { return l.in }
func (l *lin) Name() string { return "wq" }

type vec int

func (v vec) Len() int { return int(v) }

type mat struct{ r, c int }

func (m *mat) Rows() int { return m.r }
func (m *mat) Cols() int { return m.c }

type hcSite struct{ mix, width, scales int }

func (h *hcSite) Mix() int    { return h.mix }
func (h *hcSite) Width() int  { return h.width }
func (h *hcSite) Scales() int { return h.scales }

type emb struct{ vocab, dim int }

func (e *emb) Vocab() int { return e.vocab }
func (e *emb) Dim() int   { return e.dim }

type table struct{ r, c int }

func (t *table) Rows() int { return t.r }
func (t *table) Cols() int { return t.c }

type exps struct{ count, inter, dim int }

func (e *exps) Count() int { return e.count }
func (e *exps) Inter() int { return e.inter }
func (e *exps) Dim() int   { return e.dim }

type store struct{ spec KVSpec }

func (s *store) Spec() KVSpec { return s.spec }

// other is a tensor of another backend.
type other struct{ ten }

func TestCheck(t *testing.T) {
	// Layer 0: window only; 1: ratio 4 with indexer keys of 32; 2: ratio 128.
	kv := &store{KVSpec{BlockTokens: 128, MaxSlots: 2, MaxBlocks: 4, Layers: []LayerKV{
		{Window: 8, HeadDim: 64}, {Window: 8, HeadDim: 64, Ratio: 4, IndexDim: 32}, {Window: 8, HeadDim: 64, Ratio: 128}}}}
	hcPre := &hcSite{mix: 24, width: 4 * 16, scales: 3} // 4 streams of 16
	hcHead := &hcSite{mix: 4, width: 4 * 16, scales: 1}
	hcA := HcArgs{Streams: 4}
	bt := batch(3)
	comp := func(r, dim int) CompressArgs {
		return CompressArgs{Layer: 1, Ratio: r, Dim: dim, APE: &mat{4, 128}, Norm: vec(64), Rope: freqs(16)}
	}
	attn := AttnArgs{Layer: 1, Heads: 2, HeadDim: 64, Window: 8, Ratio: 4, Sink: vec(2)}
	idx := IndexerArgs{Layer: 1, Heads: 2, HeadDim: 32, TopK: 5, Ratio: 4}
	bias := RouterArgs{TopK: 2, Bias: vec(8)}
	hash := RouterArgs{TopK: 2, Tid2Eid: &table{100, 2}, IDs: []int32{0, 99, 5}}
	var nilTen *ten

	for _, c := range []struct {
		name string
		err  error
		want string // "" for no error, else a part of the message
	}{
		{"view", CheckView(f(4, 6), 3, 8), ""},
		{"view size", CheckView(f(4, 6), 5, 5), "view 4x6 as 5x5"},
		{"view negative", CheckView(f(0, 6), -1, 0), "view 0x6 as -1x0"},
		{"view typed nil", CheckView(nilTen, 1, 1), "no tensor"},
		{"upload", CheckCopy("upload", f(2, 3), F32, 6), ""},
		{"upload count", CheckCopy("upload", f(2, 3), F32, 5), "upload: 5 values for 2x3"},
		{"download dtype", CheckCopy("download", f(2, 3), I32, 6), "download: want I32 tensor"},

		{"kv spec", CheckKVSpec(kv.spec), ""},
		{"kv spec ratio", CheckKVSpec(KVSpec{BlockTokens: 6, Layers: []LayerKV{{Window: 1, HeadDim: 1, Ratio: 4}}}), "ratio 4 does not divide block tokens 6"},
		{"kv spec window", CheckKVSpec(KVSpec{Layers: []LayerKV{{HeadDim: 1}}}), "layer 0 window 0"},
		{"kv spec slots", CheckKVSpec(KVSpec{MaxSlots: -1}), "-1 slots"},
		{"reset slot", CheckResetSlot(kv, 1), ""},
		{"reset slot range", CheckResetSlot(kv, 2), "slot 2 of 2"},
		{"copy slot", CheckCopySlot(kv, WholeSlot(kv, 1, 0)), ""},
		{"copy slot range", CheckCopySlot(kv, WholeSlot(kv, 2, 0)), "copy slot: slots 0 <- 2 of 2"},
		{"copy slot negative", CheckCopySlot(kv, WholeSlot(kv, 0, -1)), "slots -1 <- 0 of 2"},
		{"copy block", CheckCopyBlock(kv, 3, 0), ""},
		{"copy block range", CheckCopyBlock(kv, 4, 0), "copy block: blocks 4 <- 0 of 4"},
		{"copy block negative", CheckCopyBlock(kv, 0, -1), "blocks 0 <- -1"},
		{"copy block nil", CheckCopyBlock(nil, 0, 0), "copy block: no kv store"},

		{"embed", CheckEmbed(&emb{10, 8}, []int32{0, 9}, 4, f(2, 32)), ""},
		{"embed id", CheckEmbed(&emb{10, 8}, []int32{0, 10}, 4, f(2, 32)), "token id 10 outside vocab 10"},
		{"embed out", CheckEmbed(&emb{10, 8}, []int32{0}, 4, f(1, 8)), "embed output: tensor is 1x8, want 1x32"},
		{"embed nil", CheckEmbed(nil, nil, 1, f(0, 0)), "embed: table"},

		{"rmsnorm", CheckRMSNorm(f(3, 64), vec(16), f(3, 64)), ""},
		{"rmsnorm width", CheckRMSNorm(f(3, 60), vec(16), f(3, 60)), "width 60 not a multiple of weight 16"},
		{"rmsnorm out", CheckRMSNorm(f(3, 64), vec(16), f(2, 64)), "rmsnorm output: tensor is 2x64, want 3x64"},
		{"rmsnorm dtype", CheckRMSNorm(i(3, 64), vec(16), f(3, 64)), "rmsnorm input: want F32"},
		{"rmsnorm nil", CheckRMSNorm(f(3, 64), nil, f(3, 64)), "rmsnorm: weight"},
		{"head norm", CheckHeadNorm(f(2, 128), 64), ""},
		{"head norm width", CheckHeadNorm(f(2, 100), 64), "head norm: width 100 not a multiple of 64"},

		{"hc pre", CheckHcPre(f(3, 64), hcPre, hcA, f(3, 16), f(3, 20)), ""},
		{"hc pre input", CheckHcPre(f(3, 32), hcPre, hcA, f(3, 16), f(3, 20)), "hc pre input: tensor is 3x32, want -1x64"},
		{"hc pre streams", CheckHcPre(f(3, 64), hcPre, HcArgs{Streams: 3}, f(3, 16), f(3, 20)), "width 64 vs 3 streams"},
		{"hc pre mix", CheckHcPre(f(3, 64), hcHead, hcA, f(3, 16), f(3, 20)), "hc pre: mix 4 / 1 scales for 4 streams"},
		{"hc pre out", CheckHcPre(f(3, 64), hcPre, hcA, f(3, 64), f(3, 20)), "hc pre output"},
		{"hc pre mix out", CheckHcPre(f(3, 64), hcPre, hcA, f(3, 16), f(3, 24)), "hc pre mix: tensor is 3x24, want 3x20"},
		{"hc pre nil", CheckHcPre(f(3, 64), nil, hcA, f(3, 16), f(3, 20)), "hc pre: params"},
		{"hc post", CheckHcPost(f(3, 16), f(3, 64), f(3, 20), hcA, f(3, 64)), ""},
		{"hc post streams", CheckHcPost(f(3, 16), f(3, 64), f(3, 20), HcArgs{}, f(3, 64)), "hc post: width 64 vs 0 streams"},
		{"hc post o", CheckHcPost(f(3, 64), f(3, 64), f(3, 20), hcA, f(3, 64)), "hc post sub-layer output"},
		{"hc head", CheckHcHead(f(3, 64), hcHead, hcA, f(3, 16)), ""},
		{"hc head mix", CheckHcHead(f(3, 64), hcPre, hcA, f(3, 16)), "hc head: mix 24 / 3 scales"},
		{"add streams", CheckAddStreams(f(3, 64), f(3, 16)), ""},
		{"add streams width", CheckAddStreams(f(3, 64), f(3, 24)), "add streams: width 64 vs 24"},
		{"add streams rows", CheckAddStreams(f(2, 64), f(3, 16)), "add streams: tensor is 2x64, want 3x-1"},

		{"linear", CheckLinear(f(4, 64), &lin{32, 64}, f(4, 32)), ""},
		{"linear input", CheckLinear(f(4, 63), &lin{32, 64}, f(4, 32)), "linear wq input: tensor is 4x63, want -1x64"},
		{"linear output", CheckLinear(f(4, 64), &lin{32, 64}, f(3, 32)), "linear wq output"},
		{"linear nil", CheckLinear(f(4, 64), nil, f(4, 32)), "linear: weight"},
		{"linear-f32", CheckLinearF32(f(4, 64), &lin{32, 64}, f(4, 31)), "linear-f32 wq output"},
		{"grouped", CheckGroupedOutProj(f(2, 4*16), &lin{4 * 8, 16}, 4, f(2, 32)), ""},
		{"grouped groups", CheckGroupedOutProj(f(2, 3*16), &lin{32, 16}, 3, f(2, 32)), "32 rows not divisible into 3 groups"},
		{"grouped input", CheckGroupedOutProj(f(2, 16), &lin{32, 16}, 4, f(2, 32)), "grouped out proj input"},
		{"scale", CheckScale(f(1, 1)), ""},
		{"scale dtype", CheckScale(i(1, 1)), "scale: want F32 tensor"},
		{"scale typed nil", CheckScale(nilTen), "scale: no tensor"},

		{"rope", CheckRope(f(3, 128), RopeArgs{Freqs: freqs(16), HeadDim: 64}, bt), ""},
		{"rope head dim", CheckRope(f(3, 100), RopeArgs{Freqs: freqs(16), HeadDim: 64}, bt), "rope: width 100, head dim 64"},
		{"rope dims", CheckRope(f(3, 128), RopeArgs{Freqs: freqs(128), HeadDim: 64}, bt), "rope: width 128"},
		{"rope freqs", CheckRope(f(3, 128), RopeArgs{HeadDim: 64}, bt), "rope: width 128"},
		{"rope rows", CheckRope(f(2, 128), RopeArgs{Freqs: freqs(16), HeadDim: 64}, bt), "rope: tensor is 2x128, want 3x-1"},
		{"rope batch", CheckRope(f(2, 128), RopeArgs{Freqs: freqs(16), HeadDim: 64}, nil), "rope: no batch"},
		{"kv quant", CheckKVQuant(f(3, 64), 48, 16), ""},
		{"kv quant nope", CheckKVQuant(f(3, 64), 65, 16), "kv quant: nope 65 of 64, block 16"},
		{"kv quant negative", CheckKVQuant(f(3, 64), -1, 16), "nope -1"},
		{"kv quant block", CheckKVQuant(f(3, 64), 48, 0), "block 0"},
		{"hadamard", CheckHadamardFP4(f(3, 128), 64), ""},
		{"hadamard pow2", CheckHadamardFP4(f(3, 96), 48), "hadamard: width 96, head dim 48"},

		{"compress", CheckCompress(kv, f(3, 128), f(3, 128), comp(4, 64), bt), ""},
		{"compress index", CheckCompress(kv, f(3, 64), f(3, 64), CompressArgs{Layer: 1, Kind: CompressIndex, Ratio: 4, Dim: 32,
			APE: &mat{4, 64}, Norm: vec(32), Rope: freqs(16)}, bt), ""},
		{"compress ratio", CheckCompress(kv, f(3, 128), f(3, 128), comp(128, 64), bt), "compress layer 1: ratio 128 dim 64 do not match the store"},
		{"compress dim", CheckCompress(kv, f(3, 128), f(3, 128), comp(4, 32), bt), "ratio 4 dim 32 do not match"},
		{"compress window layer", CheckCompress(kv, f(3, 64), f(3, 64), CompressArgs{Ratio: 0, Dim: 64}, bt), "compress layer 0: ratio 0"},
		{"compress layer", CheckCompress(kv, f(3, 128), f(3, 128), CompressArgs{Layer: 3}, bt), "kv store: layer 3 of 3"},
		{"compress gate", CheckCompress(kv, f(3, 128), f(3, 64), comp(4, 64), bt), "compress gate: tensor is 3x64, want 3x128"},
		{"compress ape", CheckCompress(kv, f(3, 128), f(3, 128), CompressArgs{Layer: 1, Ratio: 4, Dim: 64, APE: &mat{4, 64}, Norm: vec(64), Rope: freqs(16)}, bt), "compress layer 1: ape"},
		{"compress norm", CheckCompress(kv, f(3, 128), f(3, 128), CompressArgs{Layer: 1, Ratio: 4, Dim: 64, APE: &mat{4, 128}, Norm: vec(32), Rope: freqs(16)}, bt), "compress layer 1: norm"},
		{"compress rope", CheckCompress(kv, f(3, 128), f(3, 128), CompressArgs{Layer: 1, Ratio: 4, Dim: 64, APE: &mat{4, 128}, Norm: vec(64)}, bt), "compress layer 1: no rope"},
		{"compress store", CheckCompress(nil, f(3, 128), f(3, 128), comp(4, 64), bt), "compress: no kv store"},

		{"indexer", CheckIndexerTopK(kv, f(3, 64), f(3, 2), idx, bt, i(3, 5)), ""},
		{"indexer store", CheckIndexerTopK(kv, f(3, 64), f(3, 2), IndexerArgs{Layer: 2, Heads: 2, HeadDim: 32, TopK: 5, Ratio: 128}, bt, i(3, 5)), "indexer layer 2: ratio 128 dim 32 do not match the store"},
		{"indexer q", CheckIndexerTopK(kv, f(3, 32), f(3, 2), idx, bt, i(3, 5)), "indexer q"},
		{"indexer out", CheckIndexerTopK(kv, f(3, 64), f(3, 2), idx, bt, f(3, 5)), "indexer top-k: want I32 tensor"},
		{"attention", CheckSparseAttention(kv, f(3, 128), f(3, 64), i(3, 7), attn, bt, f(3, 128)), ""},
		{"attention window", CheckSparseAttention(kv, f(3, 128), f(3, 64), nil, AttnArgs{Heads: 2, HeadDim: 64, Window: 8, Sink: vec(2)}, bt, f(3, 128)), ""},
		{"attention store", CheckSparseAttention(kv, f(3, 128), f(3, 64), nil, AttnArgs{Heads: 2, HeadDim: 64, Window: 4, Sink: vec(2)}, bt, f(3, 128)), "attention layer 0: head dim 64 window 4 ratio 0 do not match the store"},
		{"attention sel", CheckSparseAttention(kv, f(3, 128), f(3, 64), f(3, 7), attn, bt, f(3, 128)), "attention selection: want I32"},
		{"attention kv", CheckSparseAttention(kv, f(3, 128), f(3, 32), i(3, 7), attn, bt, f(3, 128)), "attention kv"},
		{"attention sink", CheckSparseAttention(kv, f(3, 128), f(3, 64), i(3, 7), AttnArgs{Layer: 1, Heads: 2, HeadDim: 64, Window: 8, Ratio: 4, Sink: vec(3)}, bt, f(3, 128)), "attention layer 1: sink"},
		{"write window", CheckWriteWindow(kv, 2, f(3, 64), bt), ""},
		{"write window width", CheckWriteWindow(kv, 2, f(3, 32), bt), "write window: tensor is 3x32, want 3x64"},
		{"write window layer", CheckWriteWindow(kv, -1, f(3, 64), bt), "kv store: layer -1 of 3"},

		{"router bias", CheckRouter(f(3, 64), &lin{8, 64}, bias, f(3, 2), i(3, 2)), ""},
		{"router hash", CheckRouter(f(3, 64), &lin{8, 64}, hash, f(3, 2), i(3, 2)), ""},
		{"router top-k", CheckRouter(f(3, 64), &lin{8, 64}, RouterArgs{TopK: 9, Bias: vec(8)}, f(3, 9), i(3, 9)), "router: top-9 of 8 experts"},
		{"router neither", CheckRouter(f(3, 64), &lin{8, 64}, RouterArgs{TopK: 2}, f(3, 2), i(3, 2)), "neither bias nor tid2eid"},
		{"router bias len", CheckRouter(f(3, 64), &lin{8, 64}, RouterArgs{TopK: 2, Bias: vec(7)}, f(3, 2), i(3, 2)), "router: bias"},
		{"router ids dtype", CheckRouter(f(3, 64), &lin{8, 64}, bias, f(3, 2), f(3, 2)), "router ids: want I32"},
		{"router table", CheckRouter(f(3, 64), &lin{8, 64}, RouterArgs{TopK: 2, Tid2Eid: &table{100, 3}, IDs: []int32{0, 1, 2}}, f(3, 2), i(3, 2)), "router: tid2eid"},
		{"router token ids", CheckRouter(f(3, 64), &lin{8, 64}, RouterArgs{TopK: 2, Tid2Eid: &table{100, 2}, IDs: []int32{0}}, f(3, 2), i(3, 2)), "router: 1 token ids for 3 rows"},
		{"router token id", CheckRouter(f(3, 64), &lin{8, 64}, RouterArgs{TopK: 2, Tid2Eid: &table{100, 2}, IDs: []int32{0, 100, 1}}, f(3, 2), i(3, 2)), "token id 100 outside tid2eid (100 rows)"},
		{"experts", CheckExperts(f(3, 64), &exps{8, 32, 64}, f(3, 2), i(3, 2), ExpertsArgs{}, f(3, 64)), ""},
		{"experts weights", CheckExperts(f(3, 64), &exps{8, 32, 64}, f(3, 3), i(3, 2), ExpertsArgs{}, f(3, 64)), "experts weights: tensor is 3x3, want 3x2"},
		{"experts acc", CheckExperts(f(3, 64), &exps{8, 32, 64}, f(3, 2), i(3, 2), ExpertsArgs{}, f(3, 32)), "experts accumulator"},
		{"experts input", CheckExperts(f(3, 32), &exps{8, 32, 64}, f(3, 2), i(3, 2), ExpertsArgs{}, f(3, 64)), "experts input"},
		{"experts nil", CheckExperts(f(3, 64), nil, f(3, 2), i(3, 2), ExpertsArgs{}, f(3, 64)), "experts:"},
		{"swiglu", CheckSwiGLU(f(3, 32), f(3, 32), f(3, 32)), ""},
		{"swiglu up", CheckSwiGLU(f(3, 32), f(3, 16), f(3, 32)), "swiglu up: tensor is 3x16, want 3x32"},
		{"combine", CheckCombine(f(3, 32), f(3, 32), f(3, 32)), ""},
		{"combine out", CheckCombine(f(3, 32), f(3, 32), f(2, 32)), "combine output: tensor is 2x32, want 3x32"},
		{"gather", CheckGatherRows(f(3, 8), []int{2, 0}, f(2, 8)), ""},
		{"gather row", CheckGatherRows(f(3, 8), []int{3}, f(1, 8)), "gather: row 3 of 3"},
		{"gather out", CheckGatherRows(f(3, 8), []int{0}, f(2, 8)), "gather output"},
	} {
		t.Run(c.name, func(t *testing.T) {
			switch {
			case c.want == "" && c.err != nil:
				t.Errorf("error %v, want none", c.err)
			case c.want != "" && (c.err == nil || !strings.Contains(c.err.Error(), c.want)):
				t.Errorf("error %v, want one with %q", c.err, c.want)
			}
		})
	}
}

func TestHandles(t *testing.T) {
	x, y := f(2, 3), f(2, 3)
	var nilTen *ten
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"tensors", func() error { _, err := Tensors[*ten](nil, "op", x, y); return err }(), ""},
		{"tensors check", func() error { _, err := Tensors[*ten](CheckScale(i(1, 1)), "op", x); return err }(), "scale: want F32"},
		{"tensors other backend", func() error { _, err := Tensors[*ten](nil, "op", x, &other{}); return err }(), "op: tensor *backend.other is not a *backend.ten"},
		{"tensors typed nil", func() error { _, err := Tensors[*ten](nil, "op", nilTen); return err }(), "op: tensor *backend.ten is not"},
		{"as", func() error { _, err := As[*ten](nil, "op", x); return err }(), ""},
		{"as other backend", func() error { _, err := As[*ten](nil, "op", &other{}); return err }(), "op: tensor *backend.other"},
		{"as check", func() error { _, err := As[*ten](CheckScale(nil), "op", &other{}); return err }(), "scale: no tensor"},
		{"args", func() error { _, _, err := Args[*lin, *ten](nil, "op", &lin{1, 1}, x); return err }(), ""},
		{"args weight", func() error { _, _, err := Args[*lin, *ten](nil, "op", vec(1), x); return err }(), "op: weight backend.vec is not a *backend.lin"},
		{"args check first", func() error { _, _, err := Args[*lin, *ten](CheckScale(nil), "op", vec(1), x); return err }(), "scale: no tensor"},
	} {
		t.Run(c.name, func(t *testing.T) {
			switch {
			case c.want == "" && c.err != nil:
				t.Errorf("error %v, want none", c.err)
			case c.want != "" && (c.err == nil || !strings.Contains(c.err.Error(), c.want)):
				t.Errorf("error %v, want one with %q", c.err, c.want)
			}
		})
	}
	got, err := Tensors[*ten](nil, "op", x, y)
	if err != nil || len(got) != 2 || got[0] != x || got[1] != y {
		t.Errorf("Tensors = %v, %v; want [x y]", got, err)
	}
}
