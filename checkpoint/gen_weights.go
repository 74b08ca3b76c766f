package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/safetensors"
)

// SmallVocab is the vocabulary size asked of the BPE trainer for generated
// checkpoints.
const SmallVocab = 1024

// Generated checkpoint formats.
const (
	GenOfficial = "official" // FP8 linears + MXFP4 experts (the DeepSeek release)
	GenNVFP4    = "nvfp4"    // ModelOpt: main-layer experts NVFP4 (lossless cast), MTP experts MXFP4
)

// GenSpec describes a generated checkpoint.
type GenSpec struct {
	Format string // GenOfficial (default) or GenNVFP4
	Seed   uint64
	Preset string // "small" (default) or "small-tp"
	// Config, if set, replaces the preset architecture (its Vocab, BOS and EOS
	// are overwritten with the generated tokenizer's).
	Config *Config
	// MaxShardBytes bounds the data of one shard; 0 picks a third of the total
	// so that there are always several shards.
	MaxShardBytes int64
	// From, if set, is a trained model (train/train.py's output: config.json
	// and trained-*.safetensors, fp32 under the checkpoint's names) whose
	// values are written in Format instead of drawn; Tokenizer then names its
	// tokenizer.json. Preset, Config and Seed are ignored.
	From, Tokenizer string
}

// SmallTPConfig is the "small-tp" preset: SmallConfig with 4 heads in 4
// output groups of rank 128, so that it splits over 2 and 4 ranks with whole
// FP8 scale blocks (checkpoint.Shard); the "small" preset's 3 groups of 64
// do not split.
func SmallTPConfig() *Config {
	c := SmallConfig()
	c.Heads, c.OGroups, c.OLoraRank = 4, 4, 128
	return c
}

// SmallDSparkConfig is the "small-dspark" preset: SmallConfig with a DSpark
// drafter instead of the MTP block, shaped as the published DSpark configs
// (three sliding-window stages drafting blocks of 4 from the final streams
// of the last three layers, Markov rank 16, the last vocabulary id as noise
// token).
func SmallDSparkConfig() *Config {
	c := SmallConfig()
	c.MTPLayers = 0
	c.CompressRatios = append(c.CompressRatios[:c.Layers:c.Layers], 0, 0, 0)
	noise := SmallVocab - 1
	c.DSparkBlockSize, c.DSparkTargetLayers, c.DSparkMarkovRank, c.DSparkNoiseToken = 4, []int{3, 4, 5}, 16, &noise
	return c
}

// SmallConfig is the "small" preset: every feature of DeepSeek-V4 at toy size.
// Layers 0..5 are SWA, CSA, HCA, CSA, HCA, CSA (plus the SWA MTP block); layers
// 0 and 1 are hash-routed; the 16-token window and index_topk 4 make short
// prompts exercise the ring buffer and the indexer's selection. Vocab, BOS and
// EOS are placeholders until Generate sets them from the tokenizer.
func SmallConfig() *Config {
	return &Config{
		Layers: 6, Dim: 256, Heads: 6, KVHeads: 1, HeadDim: 128, RopeDim: 64,
		QLoraRank: 128, OLoraRank: 64, OGroups: 3, Window: 16,
		CompressRatios: []int{0, 4, 128, 4, 128, 4, 0},
		RopeTheta:      10000, CompressRopeTheta: 160000,
		RopeScaling: &RopeScaling{Type: "yarn", Factor: 16, OriginalLen: 65536, BetaFast: 32, BetaSlow: 1},
		IndexHeads:  4, IndexHeadDim: 64, IndexTopK: 4,
		Experts: 8, SharedExperts: 1, TopK: 2, MoEInter: 128, ScoringFunc: "sqrtsoftplus",
		NormTopKProb: true, RouteScale: 1.5, HashLayers: 2, SwigluLimit: 10,
		HcMult: 4, HcSinkhorn: 20, HcEps: 1e-6, NormEps: 1e-6, MTPLayers: 1,
		Vocab: SmallVocab, BOS: 0, EOS: 1, MaxPositions: 1 << 20, ExpertDType: "fp4",
		ModelType: "deepseek_v4",
		Quantization: &QuantizationConfig{QuantMethod: "fp8", Fmt: "e4m3", ScaleFmt: "ue8m0",
			WeightBlockSize: []int{128, 128}, ActivationMode: "dynamic"},
	}
}

// Tokenizer special-token strings (spec §10.1).
const (
	BOSToken = "<｜begin▁of▁sentence｜>"
	EOSToken = "<｜end▁of▁sentence｜>"
)

// tokenizerIDs returns the id count of a tokenizer.json (max id + 1 over the
// model vocab and the added tokens) and the ids of the given token strings.
func tokenizerIDs(tokJSON []byte, tokens ...string) (int, []int, error) {
	var tj struct {
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(tokJSON, &tj); err != nil {
		return 0, nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	byContent := map[string]int{}
	n := 0
	for s, id := range tj.Model.Vocab {
		byContent[s] = id
		n = max(n, id+1)
	}
	for _, a := range tj.Added {
		byContent[a.Content] = a.ID
		n = max(n, a.ID+1)
	}
	ids := make([]int, len(tokens))
	for i, s := range tokens {
		id, ok := byContent[s]
		if !ok {
			return 0, nil, fmt.Errorf("tokenizer.json has no token %q", s)
		}
		ids[i] = id
	}
	return n, ids, nil
}

// writeModel writes the checkpoint of architecture c (already carrying the
// tokenizer's vocab/BOS/EOS) in format with weights drawn from seed.
func writeModel(dir string, c *Config, format string, seed uint64, maxShard int64, tokJSON []byte, src tensorMap) error {
	entries, _, err := genEntries(c, format, seed, src, false)
	if err != nil {
		return err
	}
	return writeFiles(dir, c, format, entries, maxShard, tokJSON)
}

// genEntries draws every tensor of architecture c in table order and returns
// them with the format of each linear. With pool, linears of one shape and
// format share a few random matrices and the other tensors draw from streams
// of their own (genVisitor).
func genEntries(c *Config, format string, seed uint64, src tensorMap, pool bool) ([]genEntry, FormatFunc, error) {
	formats, err := genFormats(format)
	if err != nil {
		return nil, nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	g := &genVisitor{c: c, formats: formats, seed: seed, rng: newRNG(seed), src: src}
	if pool {
		g.pool = map[poolKey]*pooled{}
	}
	walk(c, g)
	if g.err != nil {
		return nil, nil, g.err
	}
	if err := g.finishNVFP4(); err != nil {
		return nil, nil, err
	}
	return g.entries, formats, nil
}

// GenWeights builds in memory the weights Generate writes for architecture c
// (taken as is: Vocab, BOS and EOS are not replaced by a tokenizer's) in
// format (GenOfficial or GenNVFP4) from seed: every tensor drawn on its own,
// so the same bytes as the files. For small models; RandomWeights is the same
// generator with pooled linears, for full-size stacks.
func GenWeights(c *Config, format string, seed uint64) (*Weights, error) {
	w, err := drawWeights(c, format, seed, false)
	if err != nil {
		return nil, fmt.Errorf("generate weights: %w", err)
	}
	return w, nil
}

// drawWeights binds the tensors genEntries draws.
func drawWeights(c *Config, format string, seed uint64, pool bool) (*Weights, error) {
	entries, formats, err := genEntries(c, format, seed, nil, pool)
	if err != nil {
		return nil, err
	}
	ts := make(tensorMap, len(entries))
	for _, e := range entries {
		ts[e.name] = safetensors.Tensor{Name: e.name, DType: e.dtype, Shape: e.shape, Data: e.data}
	}
	fs := map[string]Format{}
	for _, l := range Linears(c) {
		fs[l.Name] = formats(l)
	}
	return walk(c, &bindVisitor{st: ts, formats: fs}), nil
}

// tensorMap is a set of in-memory tensors by name.
type tensorMap map[string]safetensors.Tensor

func (m tensorMap) Get(name string) (safetensors.Tensor, bool) {
	t, ok := m[name]
	return t, ok
}

// writeFiles writes the tensors (in order) and the JSON side files.
func writeFiles(dir string, c *Config, format string, entries []genEntry, maxShard int64, tokJSON []byte) error {
	w := safetensors.NewWriter()
	var total int64
	for _, e := range entries {
		if err := w.Add(e.name, e.dtype, e.shape, e.data); err != nil {
			return err
		}
		total += int64(len(e.data))
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stale, _ := filepath.Glob(filepath.Join(dir, "model-*-of-*.safetensors"))
	for _, p := range stale {
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	if format != GenNVFP4 {
		if err := os.Remove(filepath.Join(dir, QuantConfigFile)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	shard := maxShard
	if shard <= 0 {
		shard = total/4 + 1 // several shards, like the real checkpoints
	}
	if err := safetensors.WriteSharded(dir, w, shard, map[string]string{"format": "pt"}); err != nil {
		return err
	}

	files := map[string][]byte{
		"config.json":            configJSON(c, format == GenNVFP4),
		"generation_config.json": generationConfigJSON(c),
		"tokenizer.json":         tokJSON,
		"tokenizer_config.json":  tokenizerConfigJSON(),
	}
	if format == GenNVFP4 {
		files[QuantConfigFile] = quantConfigJSON(c)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := os.WriteFile(filepath.Join(dir, name), files[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}

func genFormats(format string) (FormatFunc, error) {
	switch format {
	case "", GenOfficial:
		return OfficialFormats, nil
	case GenNVFP4:
		return NVFP4Formats, nil
	}
	return nil, fmt.Errorf("unknown format %q (want %s or %s)", format, GenOfficial, GenNVFP4)
}

// newRNG is the weight generator's random source for seed.
func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x6d6567616d6f65)) }

type genEntry struct {
	name  string
	dtype safetensors.DType
	shape []int
	data  []byte
}

// genVisitor draws seeded values for every tensor in table order (or takes
// them from src, a trained model's fp32 tensors). Without a pool every value
// comes from one sequential stream (the generated checkpoints' bytes), and the
// values never depend on the format, only their encoding does. With a pool,
// linears of one shape and format share a few random matrices in their format
// (pooled, random.go) and the other tensors draw in parallel from a stream per
// name, so that full-size models take a few GB of host memory and seconds on
// many cores.
type genVisitor struct {
	c       *Config
	formats FormatFunc
	seed    uint64
	rng     *rand.Rand
	pool    map[poolKey]*pooled // nil: every linear drawn on its own
	src     tensorMap
	err     error // the first missing or malformed src tensor
	entries []genEntry
	// nvfp4 are the routed-expert linears awaiting the lossless NVFP4 cast
	// (w1 and w3 share weight_scale_2, so it is done after the walk).
	nvfp4 []nvPending
}

type nvPending struct {
	l     LinearSpec
	scale []byte // MXFP4 E8M0 scales
	at    int    // index of the weight_scale entry; _2 and input_scale follow
}

func (g *genVisitor) add(name string, dt safetensors.DType, shape []int, data []byte) {
	g.entries = append(g.entries, genEntry{name, dt, slices.Clone(shape), data})
}

func bf16Bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	num.EncodeBF16(v, b)
	return b
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	num.EncodeF32(v, b)
	return b
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// drawer is the random source of tensorValues: the small-checkpoint generator
// draws sequentially from one stream (rngDrawer), RandomWeights in parallel
// chunks (parDrawer).
type drawer interface {
	// normal returns n values mean + N(0,1)·std.
	normal(n int, mean, std float64) []float32
	// uniform returns n values lo + U[0,1).
	uniform(n int, lo float64) []float32
	// perms returns rows×k ids: per row the first k of a random permutation
	// of [0, n).
	perms(rows, n, k int) []int64
}

// rngDrawer draws everything in order from one stream.
type rngDrawer struct{ rng *rand.Rand }

func (d rngDrawer) normal(n int, mean, std float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(mean + d.rng.NormFloat64()*std)
	}
	return v
}

func (d rngDrawer) uniform(n int, lo float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(lo + d.rng.Float64())
	}
	return v
}

func (d rngDrawer) perms(rows, n, k int) []int64 {
	out := make([]int64, rows*k)
	for r := range rows {
		perm := d.rng.Perm(n)
		for j := range k {
			out[r*k+j] = int64(perm[j])
		}
	}
	return out
}

// tensorValues draws non-linear tensor name and returns its stored dtype and
// bytes. The scales keep activations O(1) through all layers: norms ≈ 1,
// hyper-connection mixes near identity with mild input dependence, small
// sinks, position biases and router biases.
func tensorValues(c *Config, d drawer, name string, dt safetensors.DType, shape []int) (safetensors.DType, []byte) {
	n := numel(shape)
	var v []float32
	switch {
	case name == "embed.weight":
		v = d.normal(n, 0, 1)
	case dt == safetensors.BF16: // every 1-D bf16 tensor is a norm weight
		v = d.normal(n, 1, 0.1)
	case strings.HasSuffix(name, "_fn"):
		v = d.normal(n, 0, 0.5/math.Sqrt(float64(c.HcDim())))
	case strings.HasSuffix(name, "_base"):
		hc := c.HcMult
		v = d.normal(n, 0, 0.1)
		for j := range hc {
			v[j] += -1.1 // pre ≈ sigmoid(-1.1) ≈ 0.25: the collapse averages the streams
		}
		if n > hc { // attn/ffn site: post ≈ 2·sigmoid(0) = 1, comb near identity
			for j := range hc {
				v[2*hc+j*hc+j] += 2
			}
		}
	case strings.HasSuffix(name, "_scale"):
		v = d.uniform(n, 0.5)
	case strings.HasSuffix(name, "attn_sink"):
		v = d.normal(n, 0, 0.5)
	case strings.HasSuffix(name, ".ape"):
		v = d.normal(n, 0, 0.1)
	case strings.HasSuffix(name, "gate.bias"):
		v = d.normal(n, 0, 0.05)
	case strings.HasSuffix(name, "gate.tid2eid"):
		ids := d.perms(shape[0], c.Experts, shape[1])
		b := make([]byte, 8*len(ids))
		for i, id := range ids {
			binary.LittleEndian.PutUint64(b[8*i:], uint64(id))
		}
		return dt, b
	default:
		v = d.normal(n, 0, 0.1)
	}
	if dt == safetensors.BF16 {
		return dt, bf16Bytes(v)
	}
	return safetensors.F32, f32Bytes(v)
}

// tensor draws a non-linear tensor (tensorValues) from the visitor's
// sequential source, or with a pool from the name's own stream.
func (g *genVisitor) tensor(name string, dt safetensors.DType, shape ...int) safetensors.Tensor {
	if g.src != nil {
		g.add(name, dt, shape, g.srcBytes(name, dt, shape))
		return safetensors.Tensor{}
	}
	var d drawer = rngDrawer{g.rng}
	if g.pool != nil {
		d = parDrawer{subSeed(g.seed, name)}
	}
	sdt, data := tensorValues(g.c, d, name, dt, shape)
	g.add(name, sdt, shape, data)
	return safetensors.Tensor{}
}

// srcValues returns src tensor name as float32s of the given shape.
func (g *genVisitor) srcValues(name string, shape []int) []float32 {
	t, ok := g.src.Get(name)
	if !ok || !slices.Equal(t.Shape, shape) {
		g.fail(fmt.Errorf("trained model: tensor %s %v missing or not of shape %v", name, t.Shape, shape))
		return make([]float32, numel(shape))
	}
	v, err := t.Float32s()
	if err != nil {
		g.fail(fmt.Errorf("trained model: %s: %w", name, err))
		return make([]float32, numel(shape))
	}
	return v
}

// srcBytes encodes src tensor name in dtype dt (BF16 values are rounded).
func (g *genVisitor) srcBytes(name string, dt safetensors.DType, shape []int) []byte {
	if dt == safetensors.I64 {
		t, ok := g.src.Get(name)
		if !ok || t.DType != safetensors.I64 || !slices.Equal(t.Shape, shape) {
			g.fail(fmt.Errorf("trained model: int64 tensor %s %v missing or not of shape %v", name, t.Shape, shape))
			return make([]byte, 8*numel(shape))
		}
		return t.Data
	}
	v := g.srcValues(name, shape)
	if dt == safetensors.BF16 {
		return bf16Bytes(v)
	}
	return f32Bytes(v)
}

func (g *genVisitor) fail(err error) {
	if g.err == nil {
		g.err = err
	}
}

// linear draws W ~ N(0, 1/in) (or takes src's) and stores it in the linear's
// format, or with a pool takes a pooled matrix.
func (g *genVisitor) linear(l LinearSpec) Linear {
	f := g.formats(l)
	specs := LinearTensors(l, f)
	if g.pool != nil {
		m := g.pooled(l, f)
		data := [][]byte{m.w, m.scale}
		if f == FormatNVFP4 {
			data = append(data, f32Bytes([]float32{m.scale2}), f32Bytes([]float32{nvInputScale}))
		}
		for i, s := range specs {
			g.add(s.Name, s.DType, s.Shape, data[i])
		}
		return Linear{}
	}
	var v []float32
	if g.src != nil {
		v = g.srcValues(l.Name+".weight", []int{l.Out, l.In})
	} else {
		v = rngDrawer{g.rng}.normal(l.Out*l.In, 0, 1/math.Sqrt(float64(l.In)))
	}
	switch f {
	case FormatBF16:
		g.add(specs[0].Name, specs[0].DType, specs[0].Shape, bf16Bytes(v))
	case FormatF32:
		g.add(specs[0].Name, specs[0].DType, specs[0].Shape, f32Bytes(v))
	case FormatFP8Block:
		codes, scale := num.QuantFP8Block(v, l.Out, l.In)
		g.add(specs[0].Name, specs[0].DType, specs[0].Shape, codes)
		g.add(specs[1].Name, specs[1].DType, specs[1].Shape, scale)
	case FormatMXFP4, FormatNVFP4:
		packed, scale := num.QuantMXFP4(v, l.Out, l.In)
		g.add(specs[0].Name, specs[0].DType, specs[0].Shape, packed)
		if f == FormatMXFP4 {
			g.add(specs[1].Name, specs[1].DType, specs[1].Shape, scale)
			break
		}
		g.nvfp4 = append(g.nvfp4, nvPending{l: l, scale: scale, at: len(g.entries)})
		for _, s := range specs[1:] {
			g.add(s.Name, s.DType, s.Shape, nil)
		}
	}
	return Linear{}
}

// nvInputScale is the (uncalibrated, fixed) activation scale written for
// NVFP4 experts: an activation amax of 8 over the FP4·E4M3 range.
const nvInputScale = float32(8.0 / (6 * 448))

// finishNVFP4 performs the ModelOpt lossless MXFP4 → NVFP4 cast: the nibbles
// are kept, weight_scale_2 = 2^(kmax−8) with kmax the largest MXFP4 exponent
// of the projection (of w1 and w3 together, which share it), and every 32-block
// scale 2^k becomes two e4m3 16-block scales 2^(k−kmax+8).
func (g *genVisitor) finishNVFP4() error {
	kmax := map[string]int{}
	group := func(name string) string { // w1 and w3 of one expert share a group
		if strings.HasSuffix(name, ".w3") {
			return strings.TrimSuffix(name, ".w3") + ".w1"
		}
		return name
	}
	for _, p := range g.nvfp4 {
		k := num.MXFP4MaxExp(p.scale)
		if prev, ok := kmax[group(p.l.Name)]; !ok || k > prev {
			kmax[group(p.l.Name)] = k
		}
	}
	for _, p := range g.nvfp4 {
		ge := kmax[group(p.l.Name)] - 8
		ws, err := num.MXFP4ScalesToNVFP4(p.scale, p.l.Out, p.l.In, ge)
		if err != nil {
			return fmt.Errorf("%s: %w", p.l.Name, err)
		}
		g.entries[p.at].data = ws
		g.entries[p.at+1].data = f32Bytes([]float32{num.Pow2F32(ge)})
		g.entries[p.at+2].data = f32Bytes([]float32{nvInputScale})
	}
	return nil
}

// kv is one key of an ordered JSON object.
type kv struct {
	k string
	v any
}

// orderedJSON renders keys in the given order, two-space indented, like the
// Hugging Face files (nested maps come out with sorted keys, which is also
// their order in the real files).
func orderedJSON(kvs []kv) []byte {
	var b bytes.Buffer
	b.WriteString("{\n")
	for i, e := range kvs {
		val := marshal(e.v, e.k != "compress_ratios") // compress_ratios: one line, as in the real file
		if !json.Valid(val) {
			val = []byte("null")
		}
		fmt.Fprintf(&b, "  %q: %s", e.k, val)
		if i < len(kvs)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("}\n")
	return b.Bytes()
}

// marshal encodes v without HTML escaping (the special tokens contain '<').
func marshal(v any, indent bool) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("  ", "  ")
	}
	if err := enc.Encode(v); err != nil {
		return nil // only plain values are passed in
	}
	out := bytes.TrimRight(b.Bytes(), "\n")
	if !indent {
		out = bytes.ReplaceAll(out, []byte(","), []byte(", "))
	}
	return out
}

func configJSON(c *Config, nvfp4 bool) []byte {
	rs := map[string]any{}
	if r := c.RopeScaling; r != nil {
		rs = map[string]any{"beta_fast": r.BetaFast, "beta_slow": r.BetaSlow, "factor": r.Factor,
			"original_max_position_embeddings": r.OriginalLen, "type": r.Type}
	}
	qc := map[string]any{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
		"scale_fmt": "ue8m0", "weight_block_size": []int{128, 128}}
	kvs := []kv{
		{"architectures", []string{"DeepseekV4ForCausalLM"}},
		{"attention_bias", false},
		{"attention_dropout", 0.0},
		{"bos_token_id", c.BOS},
		{"eos_token_id", c.EOS},
		{"expert_dtype", "fp4"},
		{"hc_eps", c.HcEps},
		{"hc_mult", c.HcMult},
		{"hc_sinkhorn_iters", c.HcSinkhorn},
		{"head_dim", c.HeadDim},
		{"hidden_act", "silu"},
		{"hidden_size", c.Dim},
		{"index_head_dim", c.IndexHeadDim},
		{"index_n_heads", c.IndexHeads},
		{"index_topk", c.IndexTopK},
		{"initializer_range", 0.02},
		{"max_position_embeddings", c.MaxPositions},
		{"model_type", "deepseek_v4"},
		{"moe_intermediate_size", c.MoEInter},
		{"n_routed_experts", c.Experts},
		{"n_shared_experts", c.SharedExperts},
		{"norm_topk_prob", c.NormTopKProb},
		{"num_attention_heads", c.Heads},
		{"num_experts_per_tok", c.TopK},
		{"num_hidden_layers", c.Layers},
		{"num_hash_layers", c.HashLayers},
		{"num_key_value_heads", c.KVHeads},
		{"num_nextn_predict_layers", c.MTPLayers},
		{"o_groups", c.OGroups},
		{"o_lora_rank", c.OLoraRank},
		{"q_lora_rank", c.QLoraRank},
		{"qk_rope_head_dim", c.RopeDim},
		{"quantization_config", qc},
		{"rms_norm_eps", c.NormEps},
		{"rope_scaling", rs},
		{"rope_theta", c.RopeTheta},
		{"routed_scaling_factor", c.RouteScale},
		{"scoring_func", "sqrtsoftplus"},
		{"sliding_window", c.Window},
		{"swiglu_limit", c.SwigluLimit},
		{"tie_word_embeddings", false},
		{"topk_method", "noaux_tc"},
		{"torch_dtype", "bfloat16"},
		{"transformers_version", "4.57.1"},
		{"use_cache", true},
		{"vocab_size", c.Vocab},
		{"compress_rope_theta", c.CompressRopeTheta},
		{"compress_ratios", c.CompressRatios},
	}
	if c.HasDSpark() {
		// As the published DSpark configs: num_nextn_predict_layers stays 1.
		kvs[slices.IndexFunc(kvs, func(e kv) bool { return e.k == "num_nextn_predict_layers" })].v = 1
		kvs = append(kvs, kv{"dspark_block_size", c.DSparkBlockSize}, kv{"dspark_noise_token_id", *c.DSparkNoiseToken},
			kv{"dspark_target_layer_ids", c.DSparkTargetLayers}, kv{"dspark_markov_rank", c.DSparkMarkovRank})
	}
	if nvfp4 {
		grp := map[string]any{"num_bits": 4, "type": "float", "group_size": 16, "dynamic": false}
		kvs = append(kvs,
			kv{"moe_quant_algo", "NVFP4"},
			kv{"quant_algo", "MIXED_PRECISION"},
			kv{"group_size", 16},
			kv{"kv_cache_quant_algo", nil},
			kv{"producer", modelOptProducer},
			kv{"quantized_layers", nvQuantizedLayers(c)},
			kv{"ignore", nvExclude},
			kv{"config_groups", map[string]any{"group_0": map[string]any{
				"targets": []string{"Linear"}, "weights": grp, "input_activations": grp}}},
		)
	}
	return orderedJSON(kvs)
}

var (
	modelOptProducer = map[string]string{"name": "modelopt", "version": "dsv4-nvfp4-experts"}
	nvExclude        = []string{"*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"}
)

func nvQuantizedLayers(c *Config) map[string]any {
	m := map[string]any{}
	for i := range c.Layers {
		m[fmt.Sprintf("layers.%d.ffn.experts", i)] = map[string]any{"quant_algo": "NVFP4", "group_size": 16}
	}
	return m
}

func quantConfigJSON(c *Config) []byte {
	return orderedJSON([]kv{
		{"producer", modelOptProducer},
		{"quantization", map[string]any{"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": nil,
			"group_size": 16, "quantized_layers": nvQuantizedLayers(c), "exclude_modules": nvExclude}},
	})
}

func generationConfigJSON(c *Config) []byte {
	return orderedJSON([]kv{
		{"_from_model_config", true}, {"bos_token_id", c.BOS}, {"eos_token_id", c.EOS},
		{"do_sample", true}, {"temperature", 1.0}, {"top_p", 1.0}, {"transformers_version", "4.46.3"},
	})
}

func tokenizerConfigJSON() []byte {
	tok := func(s string) map[string]any {
		return map[string]any{"__type": "AddedToken", "content": s, "lstrip": false,
			"normalized": true, "rstrip": false, "single_word": false}
	}
	return orderedJSON([]kv{
		{"add_bos_token", false},
		{"add_eos_token", false},
		{"bos_token", tok(BOSToken)},
		{"clean_up_tokenization_spaces", false},
		{"eos_token", tok(EOSToken)},
		{"legacy", true},
		{"model_max_length", 1048576},
		{"pad_token", tok(EOSToken)},
		{"sp_model_kwargs", map[string]any{}},
		{"unk_token", nil},
		{"tokenizer_class", "PreTrainedTokenizerFast"},
	})
}
