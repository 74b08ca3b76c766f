// Package backend defines the op-level interface the DeepSeek-V4 forward pass is
// written against. It is deliberately not a tensor library: every method is one
// operation the model needs (spec §2–§7), so a CUDA backend can implement the
// same set with device memory and fused kernels.
//
// Activations are backend-owned Tensor handles (rows×cols, fp32 or int32
// semantics; in faithful mode values the reference stores in bf16 are kept
// bf16-representable). Weights are prepared once per backend into opaque handles.
// Per-sequence cache storage lives in a backend-owned KVStore addressed by the
// block ids and state slots that package kvcache hands out.
package backend

import (
	"math"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/rope"
	"github.com/megamoe/megamoe/safetensors"
)

// Numerics selects the rounding model of every op.
type Numerics int

const (
	// Faithful reproduces the reference rounding points (bf16 storage, FP8/FP4
	// activation simulation, per-64-slot P rounding).
	Faithful Numerics = iota
	// Exact computes the same function in fp32 without simulated rounding.
	Exact
)

func (n Numerics) String() string {
	if n == Exact {
		return "exact"
	}
	return "faithful"
}

// ParseNumerics maps "faithful" (or "") and "exact" to a Numerics value.
func ParseNumerics(s string) (Numerics, bool) {
	switch s {
	case "", "faithful":
		return Faithful, true
	case "exact":
		return Exact, true
	}
	return Faithful, false
}

// DType is the element type of a Tensor.
type DType int

const (
	F32 DType = iota // fp32 storage (bf16-representable where the reference stores bf16)
	I32              // int32 (expert ids, selected entry indices; -1 = empty)
)

// Tensor is an opaque activation buffer of Rows()×Cols() elements, row-major.
type Tensor interface {
	Rows() int
	Cols() int
	DType() DType
}

// Linear is a prepared weight matrix applied as y = W·x (W is [Out, In]).
type Linear interface {
	Out() int
	In() int
	Name() string
}

// Vec is a prepared fp32 parameter vector (norm weights, sinks, biases, hc base/scale).
type Vec interface{ Len() int }

// Mat is a prepared fp32 parameter matrix (hc_*_fn, compressor ape).
type Mat interface {
	Rows() int
	Cols() int
}

// HC is one prepared hyper-connection site (hc_{attn,ffn,head}_{fn,base,scale}).
type HC interface {
	Mix() int
	Width() int  // of the input rows (streams × d)
	Scales() int // 3 (pre sites) or 1 (head)
}

// Embedding is a prepared token-embedding table.
type Embedding interface {
	Vocab() int
	Dim() int
}

// IDTable is a prepared int table (tid2eid [vocab, top_k]).
type IDTable interface {
	Rows() int
	Cols() int
}

// Experts is the prepared set of routed experts of one MoE layer.
type Experts interface {
	Count() int
	Inter() int
	Dim() int
}

// KVStore holds the per-sequence cache storage of every layer (window rings,
// compressed entries, indexer keys, compressor pending state).
type KVStore interface{ Spec() KVSpec }

// LayerKV describes the cache of one layer (main layers, then the MTP block).
type LayerKV struct {
	Window   int // window ring entries
	HeadDim  int // width of a KV entry
	RopeDim  int // rope dims at the end of an entry
	Ratio    int // 0, 4 or 128
	IndexDim int // indexer key width (ratio 4 only), 0 otherwise
}

// KVSpec sizes a KVStore. Compressed entries (and indexer keys) of a sequence
// live in blocks of BlockTokens token positions, i.e. BlockTokens/Ratio entries
// per compressed layer per block; window rings and compressor states live in a
// fixed per-sequence state slot.
type KVSpec struct {
	BlockTokens int
	// Compact keeps entries (window rings and compressed) as
	// kvcache.EntryFormat and indexer keys as kvcache.IndexKeyFormat; the
	// compressor pending state stays fp32. Only for Faithful numerics, whose
	// values are already rounded to those formats.
	Compact   bool
	Layers    []LayerKV
	MaxBlocks int
	MaxSlots  int
	// Slack is the most rows a step may write past a sequence's committed
	// length (the speculative drafts N; 0 without drafts). Every rolling
	// state is a ring indexed by absolute position: the window ring holds
	// Window + Slack entries (position p at p mod RingLen), a compressor's
	// pending state c·Ratio + Slack rows (p at p mod CompRows). These
	// suffice: a row at position q reads q-Window+1..q (window) or
	// q-c·Ratio+1..q (pooling), each committed or written earlier in the
	// same step; a step starting at committed length S writes at most
	// positions S..S+Slack, which are all less than RingLen (resp.
	// CompRows) above any position a later row of committed length >= S+1
	// reads, so no write of a rejected position lands on a ring row
	// still to be read, and rejected rows are overwritten when the
	// sequence gets there.
	Slack int
}

// RingLen is the window ring entries of layer i: Window + Slack.
func (s KVSpec) RingLen(i int) int { return s.Layers[i].Window + s.Slack }

// CompRows is the pending-state rows of each compressor of layer i
// (0 without compression): c·Ratio + Slack.
func (s KVSpec) CompRows(i int) int {
	l := s.Layers[i]
	if l.Ratio == 0 {
		return 0
	}
	return CompressCoff(l.Ratio)*l.Ratio + s.Slack
}

// SlotCopy names a CopySlot: Part of the layers [From, To) of slot Src
// into Dst.
type SlotCopy struct {
	Dst, Src, From, To int
	Part               SlotPart
}

// SlotPart is the part of a layer's state slot a CopySlot copies.
type SlotPart int

const (
	SlotAll       SlotPart = iota // window ring and both compressors
	SlotWindow                    // the window ring
	SlotComp                      // the main compressor's pending state
	SlotIndexComp                 // the indexer compressor's pending state
)

// WholeSlot is the SlotCopy of every layer's whole state from slot src to dst.
func WholeSlot(s KVStore, src, dst int) SlotCopy {
	return SlotCopy{Src: src, Dst: dst, From: 0, To: len(s.Spec().Layers), Part: SlotAll}
}

// SeqInfo is one sequence of a batch.
type SeqInfo struct {
	Slot   int     // state slot (window rings, compressor states)
	Blocks []int32 // block table for compressed entries
	Start  int     // tokens already in the cache before this step (= position of its first row)
	Row0   int     // first row of this sequence in the batch
	Rows   int     // rows (tokens) of this sequence in the batch
}

// Batch is the host-side row layout of one forward step: rows of all sequences
// concatenated, sequence by sequence.
type Batch struct {
	Seqs []SeqInfo
	Pos  []int32 // absolute position of every row
	Seq  []int32 // index into Seqs of every row
	// Name tells RecordStep which forward a step runs ("" the main model's,
	// "mtp" the MTP block's with the logits of each sequence's last row,
	// "mtp all" with those of other rows, "verify" the main model's
	// verification of drafts, "dspark ctx" the DSpark context,
	// "dspark" its blocks and "dspark draw" its blocks drawn through the
	// Markov head): steps of different names never share a recording.
	Name string
	// Hidden marks a step that also returns its final streams (or DSpark's
	// captures): its recording has more outputs than one that does not.
	Hidden bool
	// Also holds further layouts the step's ops take (a DSpark block's
	// attention rows): a recording holds them beside the step's.
	Also []*Batch
}

// Rows is the total number of rows.
func (b *Batch) Rows() int { return len(b.Pos) }

// HcArgs are the mHC constants (spec §4).
type HcArgs struct {
	Streams  int     // hc_mult
	Sinkhorn int     // iterations
	Eps      float32 // hc_eps
	NormEps  float32 // rms_norm_eps used for the stream rsqrt
}

// RopeArgs describe a RoPE application to the last Freqs.Dim() dims of every
// head of width HeadDim.
type RopeArgs struct {
	Freqs   *rope.Freqs
	HeadDim int
	Inverse bool
}

// CompressKind selects the post-processing of an emitted compressed entry.
type CompressKind int

const (
	CompressKV    CompressKind = iota // FP8-simulate the nope dims (main compressor)
	CompressIndex                     // Hadamard + FP4-simulate all dims (indexer compressor)
)

// CompressArgs configure the stateful compressor op of one layer (spec §5.4).
type CompressArgs struct {
	Layer   int
	Kind    CompressKind
	Ratio   int
	Dim     int // Dc
	APE     Mat // [ratio, c·Dc]
	Norm    Vec // [Dc]
	NormEps float32
	Rope    *rope.Freqs
}

// AttnArgs configure sparse MQA with sink for one layer (spec §5.7).
type AttnArgs struct {
	Layer   int
	Heads   int
	HeadDim int
	Window  int
	Ratio   int
	Scale   float32
	Sink    Vec
}

// IndexerArgs configure the lightning-indexer scoring and top-k (spec §5.5).
type IndexerArgs struct {
	Layer   int
	Heads   int
	HeadDim int
	TopK    int
	Ratio   int
	Trace   bool // report non-finite scores as *OpNonFinite ("indexer scores")
}

// RouterArgs configure the MoE router (spec §6.1).
type RouterArgs struct {
	TopK    int
	Scale   float32 // routed_scaling_factor
	Bias    Vec     // nil on hash layers
	Tid2Eid IDTable // non-nil on hash layers
	IDs     []int32 // token id of every row (hash layers)
}

// ExpertsArgs configure the routed experts (spec §6.2–§6.3).
type ExpertsArgs struct {
	Limit float32 // swiglu_limit (0 = no clamp)
	Trace bool    // check every expert stage for non-finite values
	// Expert parallel: the prepared experts are the global ids [Offset,
	// Offset+Count); with Partial, pairs routed outside that range belong to
	// another rank and add nothing here (otherwise they are an error).
	Offset  int
	Partial bool
}

// CheckFunc is the NaN tracer hook the model passes to the layer code: it checks
// out (and summarises the inputs) and returns a non-nil error on a non-finite
// value. A nil CheckFunc disables tracing.
type CheckFunc func(component string, out Tensor, inputs ...Tensor) error

// Check calls c if it is non-nil.
func (c CheckFunc) Check(component string, out Tensor, inputs ...Tensor) error {
	if c == nil {
		return nil
	}
	return c(component, out, inputs...)
}

// Stats summarises a tensor for the NaN tracer.
type Stats struct {
	FirstBad         int // flat index of the first non-finite element, -1 if none
	Min, Max, AbsMax float32
}

// OpNonFinite is returned by ops that trace their internal stages
// (ExpertsArgs.Trace) when a stage produced a non-finite value.
type OpNonFinite struct {
	Component string // e.g. "expert 17 w2"
	Row       int
	Stats     Stats
	In        Stats // of that stage's input
}

func (e *OpNonFinite) Error() string { return "non-finite value in " + e.Component }

// Backend is the op set of the DeepSeek-V4 forward pass. Every op writes into
// caller-allocated outputs; "bf16 out" means rounded to bf16 in faithful mode.
type Backend interface {
	Name() string
	// SetNumerics selects the rounding model for all later ops.
	SetNumerics(n Numerics)
	Numerics() Numerics

	// Memory.
	Alloc(rows, cols int, dt DType) Tensor
	// Empty is Alloc for an output that the next op writes in full: its
	// contents are unspecified (the GPU skips the zeroing; the CPU fills
	// F32 with NaN and I32 with MinInt32, so an op that leaves part of it
	// unwritten shows as non-finite output or a bad index).
	Empty(rows, cols int, dt DType) Tensor
	// View reinterprets t's storage (rows·cols must match).
	View(t Tensor, rows, cols int) (Tensor, error)
	// Slice is a view of t's rows [row0, row0+rows), sharing its storage.
	Slice(t Tensor, row0, rows int) (Tensor, error)
	Free(t Tensor)
	Upload(t Tensor, data []float32) error // F32 tensors
	Download(t Tensor, dst []float32) error
	DownloadI32(t Tensor, dst []int32) error
	Stats(t Tensor) Stats

	// Weight preparation (once per model).
	PrepareLinear(l *checkpoint.Linear) (Linear, error)
	PrepareVec(name string, t safetensors.Tensor, n int) (Vec, error)
	PrepareMat(name string, t safetensors.Tensor, rows, cols int) (Mat, error)
	PrepareHC(name string, hc checkpoint.HC, mix, width int) (HC, error)
	PrepareEmbedding(t safetensors.Tensor, vocab, dim int) (Embedding, error)
	PrepareIDTable(name string, t safetensors.Tensor, rows, cols int) (IDTable, error)
	PrepareExperts(name string, experts []checkpoint.Expert, dim, inter int) (Experts, error)

	// Cache storage.
	NewKVStore(spec KVSpec) (KVStore, error)
	// ResetSlot clears a state slot for a new sequence (compressor A=0, Z=-inf).
	ResetSlot(s KVStore, slot int) error
	// CopySlot copies the state slot (window rings, compressor pending
	// state; Part selects) of layers [From, To) from slot Src to slot Dst,
	// for each copy: a snapshot that speculative steps restore. Blocks are
	// not copied. The copies of one call are independent (the backend may
	// run them at once): no slot is the destination of two, or the
	// destination of one and the source of another.
	CopySlot(s KVStore, cs ...SlotCopy) error
	// CopyBlock copies block src's compressed entries and indexer keys (every
	// layer) into block dst: the prefix cache's copy-on-write of a partial
	// block that a new sequence appends into.
	CopyBlock(s KVStore, dst, src int32) error

	// Embed writes embed[ids[r]] into every one of `streams` segments of out row r.
	Embed(e Embedding, ids []int32, streams int, out Tensor) error
	// RMSNorm normalises every consecutive segment of len(w) values of each row (bf16 out).
	RMSNorm(x Tensor, w Vec, eps float32, out Tensor) error
	// HeadNorm is the weightless per-head RMS normalisation of q (bf16 arithmetic, §5.3), in place.
	HeadNorm(x Tensor, headDim int, eps float32) error
	// HcPre collapses the streams x [N, n·d] → out [N, d] and writes post|comb into mix [N, n+n·n].
	HcPre(x Tensor, hc HC, a HcArgs, out, mix Tensor) error
	// HcPost: out[k] = post[k]·o + Σ_j comb[j][k]·x[j] (bf16 out).
	HcPost(o, x, mix Tensor, a HcArgs, out Tensor) error
	// HcHead is the final collapse (no Sinkhorn).
	HcHead(x Tensor, hc HC, a HcArgs, out Tensor) error
	// AddStreams adds e [N, d] to every d-segment of x [N, n·d] in place (bf16 out).
	AddStreams(x, e Tensor) error

	// Linear: y = W·x with the reference's per-format arithmetic (FP8/FP4 weights:
	// FP8 activation quant per 128; bf16 out).
	Linear(x Tensor, w Linear, out Tensor) error
	// LinearF32: fp32 weights (upcast) × fp32 x, fp32 out (compressor, router, head).
	LinearF32(x Tensor, w Linear, out Tensor) error
	// GroupedOutProj: out[:, g·R:(g+1)·R] = wo_a[g] · x[:, g·K:(g+1)·K] (bf16 einsum, §5.8).
	GroupedOutProj(x Tensor, w Linear, groups int, out Tensor) error
	// Scale multiplies x by s in place (bf16 out).
	Scale(x Tensor, s float32) error

	// Rope rotates (or inverse-rotates) the last rope dims of every head at the row positions.
	Rope(x Tensor, a RopeArgs, b *Batch) error
	// KVQuant FP8-simulates the first nope values of each row in blocks (in place, faithful only).
	KVQuant(x Tensor, nope, block int) error
	// HadamardFP4 rotates every head of width headDim and FP4-simulates it (blocks of 32), in place.
	HadamardFP4(x Tensor, headDim int) error

	// Compress absorbs the rows' A [N, c·Dc] and gate Z [N, c·Dc] (ape not yet added)
	// into each sequence's compressor state and stores every completed entry.
	Compress(s KVStore, A, Z Tensor, a CompressArgs, b *Batch) error
	// IndexerTopK scores the available indexer keys and writes the selected entry
	// indices (descending score, ties → lower index, -1 padded) into out [N, TopK].
	IndexerTopK(s KVStore, q, w Tensor, a IndexerArgs, b *Batch, out Tensor) error
	// SparseAttention: window keys (cache + this step's kv) and compressed entries
	// (all for ratio 128, sel for ratio 4) with sink; out [N, H·D] bf16.
	SparseAttention(s KVStore, q, kv, sel Tensor, a AttnArgs, b *Batch, out Tensor) error
	// WriteWindow stores this step's kv rows into the window rings.
	WriteWindow(s KVStore, layer int, kv Tensor, b *Batch) error

	// Router writes routing weights [N, k] (F32) and expert ids [N, k] (I32).
	Router(f Tensor, gate Linear, a RouterArgs, weights, ids Tensor) error
	// Experts accumulates Σ_k w_k·Expert_{id_k}(f) in ascending expert id into acc [N, d] (fp32).
	Experts(f Tensor, e Experts, weights, ids Tensor, a ExpertsArgs, acc Tensor) error
	// SwiGLU: out = bf16(silu(min(g, L))·clamp(u, ±L)) (shared expert).
	SwiGLU(g, u Tensor, limit float32, out Tensor) error
	// Combine: out = bf16(acc + shared).
	Combine(acc, shared, out Tensor) error
	// GatherRows copies the listed rows of x into out.
	GatherRows(x Tensor, rows []int, out Tensor) error

	// Fused ops. Each is defined as the composition of the ops above that
	// its comment names, with the same results; a backend may run it in
	// fewer launches (shared activation quantisation, one kernel for an
	// epilogue). The model calls these, never their parts, so that every
	// backend and every decorator (tracing, profiling) runs one sequence.

	// Linears: Linear(x, ws[i], outs[i]) for every i.
	Linears(x Tensor, ws []Linear, outs []Tensor) error
	// NormLinears: RMSNorm(x, w, eps, normed), then Linears(normed, ws, outs).
	NormLinears(x Tensor, w Vec, eps float32, normed Tensor, ws []Linear, outs []Tensor) error
	// HcPreNormLinears: HcPre(x, hc, a) into a scratch row set and mix, its
	// RMSNorm(norm, eps) into normed, then Linears(normed, ws, outs).
	HcPreNormLinears(x Tensor, hc HC, a HcArgs, norm Vec, eps float32, normed, mix Tensor, ws []Linear, outs []Tensor) error
	// SwiGLULinear: SwiGLU(g, u, limit, h), then Linear(h, w, out).
	SwiGLULinear(g, u Tensor, limit float32, h Tensor, w Linear, out Tensor) error
	// HeadNormRope: HeadNorm(x, a.HeadDim, eps), then Rope(x, a, b).
	HeadNormRope(x Tensor, eps float32, a RopeArgs, b *Batch) error
	// RopeHadamardFP4: Rope(x, a, b), then HadamardFP4(x, a.HeadDim).
	RopeHadamardFP4(x Tensor, a RopeArgs, b *Batch) error
	// NormRopeKVQuant: RMSNorm(x, w, eps, out), Rope(out, a, b), KVQuant(out, nope, block).
	NormRopeKVQuant(x Tensor, w Vec, eps float32, a RopeArgs, nope, block int, b *Batch, out Tensor) error
	// ExpertsCombine: Experts(f, e, weights, ids, a) into an fp32
	// accumulator, then Combine(acc, shared, out).
	ExpertsCombine(f Tensor, e Experts, weights, ids Tensor, a ExpertsArgs, shared, out Tensor) error
	// ExpertsCombinePost: ExpertsCombine(f, e, weights, ids, a, shared, out),
	// then HcPost(out, x, mix, h, x), the hc post that ends a block's MoE.
	ExpertsCombinePost(f Tensor, e Experts, weights, ids Tensor, a ExpertsArgs, shared, out, x, mix Tensor, h HcArgs) error

	// Scheduling: where ops run is the backend's decision.

	// Fork issues fn's ops, which the backend may run beside the ops issued
	// after Fork returns, until Join (the GPU: on a second stream, in steps
	// of up to a few dozen rows; the CPU: fn runs at once). bt (may be nil)
	// is the step's batch. fn's ops and the main ones between Fork and Join
	// must not write what the other reads, and no op may read fn's outputs
	// before Join, except ExpertsCombine's shared (the backend orders that
	// read itself). A Fork while another is open runs fn at once.
	Fork(rows int, bt *Batch, fn func() error) error
	// Join orders the ops that follow after those of the open Fork, if any.
	Join() error
	// RecordStep returns the outputs forward computes for the step bt with
	// token ids (the logits, and the drafter's inputs of a step with
	// drafts). The backend may run forward eagerly, record it, or not call
	// it at all and replay an earlier recording of a step with bt's layout
	// (CUDA graphs), with bt's positions, block tables and ids. So forward
	// must have no host-side effects besides issuing ops, and take every
	// per-step value from bt and ids. The outputs stay valid until the next
	// step.
	RecordStep(bt *Batch, ids []int32, forward func() ([]Tensor, error)) ([]Tensor, error)
}

// Wrapper is implemented by backend decorators (tracing, profiling): Unwrap
// returns the decorated backend.
type Wrapper interface{ Unwrap() Backend }

// Sampler returns be's device sampler, looking through decorators, or nil.
func Sampler(be Backend) DeviceSampler {
	for {
		if ds, ok := be.(DeviceSampler); ok {
			return ds
		}
		w, ok := be.(Wrapper)
		if !ok {
			return nil
		}
		be = w.Unwrap()
	}
}

// Draw is one row's sampling for DeviceSampler, with the rules of
// cuda/cpuref.SampleDraw (the host sampler's choose in fixed-point masses).
type Draw struct {
	Temp float32 // <= 0: greedy (argmax, NaN as -inf, ties to the lower id)
	TopK int32   // <= 0 or >= vocab: off
	TopP float32 // <= 0 or >= 1: off
	MinP float32 // <= 0: off
	U    float32 // uniform in [0, 1) from the sequence's RNG
	// Mask, if not nil, restricts the draw to the tokens whose bit is set
	// (bit i%32 of word i/32, at least (vocab+31)/32 words): the others count
	// as -inf logits before every rule above (structured outputs).
	Mask []uint32
}

// DeviceSampler is implemented by backends that draw tokens where the
// logits are, so that a step returns token ids instead of logits rows.
type DeviceSampler interface {
	// SampleDraw writes ids[i] = a token drawn from row i of logits
	// [len(d), vocab] (F32) under d[i].
	SampleDraw(logits Tensor, d []Draw, ids []int32) error
}

// MarkovDrawer is implemented by backends that draw DSpark's greedy drafts
// where the logits are: each draft's Markov bias depends on the previous
// draft, so the chain stays on the device and only the ids come back.
type MarkovDrawer interface {
	// MarkovDraw writes ids [k, n] (I32; n = len(tokens)/k blocks): for
	// j = 0…k−1 and block s, ids[j][s] = the greedy token (Draw's rule) of
	// base row s·k+j [n·k, vocab] plus bias(p), p being the block's anchor
	// tokens[s·k] for j = 0, else ids[j−1][s]; bias(p) is LinearF32 of
	// Embed(w1, p) (one stream) by w2, over the n blocks at once, and the
	// sum is in fp32. tokens are the blocks' token ids (the step's).
	MarkovDraw(base Tensor, tokens []int32, k int, w1 Embedding, w2 Linear, ids Tensor) error
}

// Markov returns be's MarkovDrawer, looking through decorators, or nil.
func Markov(be Backend) MarkovDrawer {
	for {
		if md, ok := be.(MarkovDrawer); ok {
			return md
		}
		w, ok := be.(Wrapper)
		if !ok {
			return nil
		}
		be = w.Unwrap()
	}
}

// SliceStats summarises x (non-finite values excluded from min/max).
func SliceStats(x []float32) Stats {
	s := Stats{FirstBad: -1, Min: float32(math.Inf(1)), Max: float32(math.Inf(-1))}
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			if s.FirstBad < 0 {
				s.FirstBad = i
			}
			continue
		}
		s.Min = min(s.Min, v)
		s.Max = max(s.Max, v)
		s.AbsMax = max(s.AbsMax, float32(math.Abs(float64(v))))
	}
	if len(x) == 0 || s.Min > s.Max {
		s.Min, s.Max = 0, 0
	}
	return s
}
