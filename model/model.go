// Package model is the DeepSeek-V4 forward pass (spec §2–§7) written once
// against backend.Backend: embedding, blocks with mHC, attention and MoE, the
// final head and the MTP block. Forward takes a batch of sequences, each a
// prefill chunk of any length at any position or one decode token.
package model

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/megamoe/megamoe/attention"
	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/observe"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/moe"
	"github.com/megamoe/megamoe/parallel"
)

// Options configure a Model.
type Options struct {
	Numerics       string // "faithful" (default) | "exact"
	Threads        int    // CPU backend workers when be is nil (0 = GOMAXPROCS)
	TraceNonFinite bool   // check every sub-layer output; report *NonFiniteError
	CacheBytes     int64  // KV cache capacity (0 = 1 GiB)
	// KVStore forces the cache store: "" (StoreFor the numerics), "fp32" or
	// "compact" (faithful numerics only).
	KVStore string
	// SizeCache, if set, gives the cache capacity instead of CacheBytes once
	// the weights are on the backend (serve sizes a GPU's cache from the
	// memory they leave).
	SizeCache func(kvcache.Layout) (int64, error)
	// MaxSeqs caps the sequences holding cache at once (0: as many as it
	// holds): a GPU store sets aside every slot's fixed state up front.
	MaxSeqs int
	// Probe, if set, sees every traced sub-layer output (full component name,
	// e.g. "layer 2 attn q") before the step goes on: two backends probed
	// side by side name the first component where they diverge.
	Probe func(component string, out backend.Tensor)
	// Comm, for weights sharded by checkpoint.Shard, is this rank's end of
	// the group: attention and routed-expert outputs are all-reduced and the
	// head's vocabulary slices all-gathered (see Parallel).
	Comm parallel.Comm
	// DSparkRows is the rows of a DSpark block, the drafts per step: 1 to
	// dspark_block_size, 0 for dspark_block_size. It sizes the drafter's
	// window rings (window + rows entries).
	DSparkRows int
	// Drafts is the most drafts a speculative step verifies per sequence
	// (0 without speculative decoding): every rolling state (window rings,
	// compressor pending states) gets that many slack rows
	// (backend.KVSpec.Slack), so that rollback is rewinding the length.
	// -1: the DSpark drafter's block rows (DSparkRows resolved).
	Drafts int
}

// verifying reports whether a step is a verification of drafts: some item
// has several rows and every such item wants each row's logits (a prefill
// chunk wants its last one). Its recording is keyed on the rows of every
// sequence (backend.Batch.Name "verify").
func verifying(items []BatchItem) bool {
	multi := false
	for _, it := range items {
		if len(it.Tokens) > 1 {
			if !it.AllLogits && !it.DrawRows {
				return false
			}
			multi = true
		}
	}
	return multi
}

// DefaultCacheBytes is the cache capacity when Options.CacheBytes is 0.
const DefaultCacheBytes = 1 << 30

type block struct {
	index             int
	hcAttn, hcFFN     backend.HC
	attnNorm, ffnNorm backend.Vec
	attn              *attention.Layer
	ffn               *moe.Layer
}

type mtpBlock struct {
	block
	eProj, hProj       backend.Linear
	eNorm, hNorm, norm backend.Vec
	hcHead             backend.HC
}

// Model is a loaded DeepSeek-V4 model bound to a backend.
type Model struct {
	cfg    *checkpoint.Config
	be     backend.Backend
	opts   Options
	num    backend.Numerics // set on be at New; Forward refuses another
	hc     backend.HcArgs
	eps    float32
	embed  backend.Embedding
	head   backend.Linear
	norm   backend.Vec
	hcHead backend.HC
	blocks []*block
	mtp    *mtpBlock
	ds     *dspark // nil without a DSpark drafter
	cache  *kvcache.Manager
	store  backend.KVStore
	part   *checkpoint.Part          // nil: the whole model
	tr     *tracer                   // nil unless TraceNonFinite or Probe: be is then traced
	stage  map[[2]int]backend.Tensor // the drafters' input rows, per power-of-two row count and width (stageRows)
	mu     sync.Mutex                // one forward at a time
}

// checkPart requires sharded weights and a communicator to come together and
// agree on the rank and the group size.
func checkPart(p *checkpoint.Part, c parallel.Comm) error {
	switch {
	case p == nil && c != nil && c.Size() > 1:
		return fmt.Errorf("model: a %d-rank communicator needs weights from checkpoint.Shard", c.Size())
	case p != nil && p.Size > 1 && c == nil:
		return fmt.Errorf("model: rank %d of %d weights need Options.Comm", p.Rank, p.Size)
	case p != nil && c != nil && (c.Rank() != p.Rank || c.Size() != p.Size):
		return fmt.Errorf("model: communicator rank %d of %d, weights rank %d of %d", c.Rank(), c.Size(), p.Rank, p.Size)
	}
	return nil
}

// sharded reports whether this model is one rank of several.
func (m *Model) sharded() bool { return m.part != nil && m.part.Size > 1 }

// localVocab is the number of head rows (vocabulary ids) this rank computes.
func (m *Model) localVocab() int {
	if m.part != nil {
		return m.part.VocabHi - m.part.VocabLo
	}
	return m.cfg.Vocab
}

func (m *Model) allReduce(t backend.Tensor) error { return m.opts.Comm.AllReduceSum(m.be, t) }

// New prepares w on be (a CPU backend when be is nil).
func New(w *checkpoint.Weights, be backend.Backend, opts Options) (*Model, error) {
	if w == nil || w.Config == nil {
		return nil, errors.New("model: nil weights")
	}
	num, ok := backend.ParseNumerics(opts.Numerics)
	if !ok {
		return nil, fmt.Errorf("model: numerics %q, want faithful or exact", opts.Numerics)
	}
	if be == nil {
		be = cpu.New(cpu.Options{Threads: opts.Threads})
	}
	be.SetNumerics(num)
	c := w.Config
	if err := checkPart(w.Part, opts.Comm); err != nil {
		return nil, err
	}
	store, err := storeOption(opts.KVStore, num)
	if err != nil {
		return nil, err
	}
	m := &Model{cfg: c, be: be, opts: opts, num: num, part: w.Part, eps: float32(c.NormEps),
		hc: backend.HcArgs{Streams: c.HcMult, Sinkhorn: c.HcSinkhorn, Eps: float32(c.HcEps), NormEps: float32(c.NormEps)}}
	if opts.TraceNonFinite || opts.Probe != nil {
		// The tracer decorates the backend: the traced model runs the same ops.
		m.tr = &tracer{be: be, probe: opts.Probe, stats: opts.TraceNonFinite}
		m.be = observe.WrapTracing(be, m.tr)
		be = m.be
	}
	if m.embed, err = be.PrepareEmbedding(w.Embed, c.Vocab, c.Dim); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if m.head, err = be.PrepareLinear(&w.Head); err != nil {
		return nil, fmt.Errorf("model head: %w", err)
	}
	if vl := m.localVocab(); m.head.Out() != vl || m.head.In() != c.Dim {
		return nil, fmt.Errorf("model head: %dx%d, want %dx%d", m.head.Out(), m.head.In(), vl, c.Dim)
	}
	if m.norm, err = be.PrepareVec("norm.weight", w.Norm, c.Dim); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if m.hcHead, err = be.PrepareHC("hc_head", w.HcHead, c.HcMult, c.HcDim()); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if len(w.Layers) != c.Layers {
		return nil, fmt.Errorf("model: %d layers bound, config has %d", len(w.Layers), c.Layers)
	}
	for i := range w.Layers {
		b, err := m.prepBlock(&w.Layers[i])
		if err != nil {
			return nil, fmt.Errorf("model layer %d: %w", i, err)
		}
		m.blocks = append(m.blocks, b)
	}
	if len(w.MTP) > 0 {
		if m.mtp, err = m.prepMTP(&w.MTP[0]); err != nil {
			return nil, fmt.Errorf("model mtp: %w", err)
		}
	}
	layout, err := kvcache.LayoutFromConfig(c, kvcache.DefaultBlockTokens, store)
	if err != nil {
		return nil, err
	}
	if w.DSpark != nil && !m.sharded() { // a split model does not draft
		rows, err := dsparkRows(c, opts.DSparkRows)
		if err != nil {
			return nil, err
		}
		if m.ds, err = m.prepDSpark(w.DSpark, rows); err != nil {
			return nil, fmt.Errorf("model dspark: %w", err)
		}
		for i := c.Layers; i < len(layout.Layers); i++ { // the rings hold the window plus the block
			layout.StateBytes -= int64(layout.Layers[i].Window-m.ds.window) * int64(layout.EntryBytes)
			layout.Layers[i].Window = m.ds.window
		}
	}
	drafts := opts.Drafts
	if drafts == -1 && m.ds != nil {
		drafts = m.ds.rows
	}
	if drafts < 0 {
		return nil, fmt.Errorf("model: drafts %d (-1 only with a DSpark drafter)", opts.Drafts)
	}
	layout = layout.WithSlack(drafts)
	capBytes := opts.CacheBytes
	if opts.SizeCache != nil {
		if capBytes, err = opts.SizeCache(layout); err != nil {
			return nil, fmt.Errorf("model: kv cache: %w", err)
		}
	} else if capBytes <= 0 {
		capBytes = DefaultCacheBytes
	}
	m.cache = kvcache.NewManager(layout, capBytes)
	m.cache.LimitSlots(opts.MaxSeqs)
	if opts.Comm == nil {
		// One rank only: the ranks of a split model would not follow the hits.
		m.cache.AllowPrefixCaching(fmt.Sprintf("numerics=%s store=%s", num, layout.Store))
	}
	spec := backend.KVSpec{BlockTokens: layout.BlockTokens, Compact: layout.Store == kvcache.StoreCompact, MaxBlocks: m.cache.MaxBlocks(), MaxSlots: m.cache.MaxSlots(), Slack: layout.Slack}
	for _, k := range layout.Layers {
		spec.Layers = append(spec.Layers, backend.LayerKV{Window: k.Window, HeadDim: k.HeadDim, RopeDim: k.RopeDim, Ratio: k.Ratio, IndexDim: k.IndexDim})
	}
	if m.store, err = be.NewKVStore(spec); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	return m, nil
}

// StoreFor is the cache store a model uses in numerics n: faithful values
// are already rounded to the compact formats (bit-identical logits), exact
// ones are not, so they keep fp32.
func StoreFor(n backend.Numerics) kvcache.Store {
	if n == backend.Faithful {
		return kvcache.StoreCompact
	}
	return kvcache.StoreF32
}

// storeOption resolves Options.KVStore.
func storeOption(s string, n backend.Numerics) (kvcache.Store, error) {
	switch s {
	case "":
		return StoreFor(n), nil
	case "fp32":
		return kvcache.StoreF32, nil
	case "compact":
		if n != backend.Faithful {
			return 0, fmt.Errorf("model: kv store compact needs faithful numerics, not %s", n)
		}
		return kvcache.StoreCompact, nil
	}
	return 0, fmt.Errorf("model: kv store %q, want fp32 or compact", s)
}

func (m *Model) prepBlock(l *checkpoint.Layer) (*block, error) {
	c, be := m.cfg, m.be
	b := &block{index: l.Index}
	var err error
	if b.hcAttn, err = be.PrepareHC("hc_attn", l.HcAttn, c.HcMix(), c.HcDim()); err != nil {
		return nil, err
	}
	if b.hcFFN, err = be.PrepareHC("hc_ffn", l.HcFFN, c.HcMix(), c.HcDim()); err != nil {
		return nil, err
	}
	if b.attnNorm, err = be.PrepareVec("attn_norm", l.AttnNorm, c.Dim); err != nil {
		return nil, err
	}
	if b.ffnNorm, err = be.PrepareVec("ffn_norm", l.FFNNorm, c.Dim); err != nil {
		return nil, err
	}
	if b.attn, err = attention.Prepare(be, c, l); err != nil {
		return nil, err
	}
	if b.ffn, err = moe.Prepare(be, c, l, m.part); err != nil {
		return nil, err
	}
	if m.sharded() {
		b.ffn.Reduce = m.allReduce
	}
	return b, nil
}

func (m *Model) prepMTP(p *checkpoint.MTP) (*mtpBlock, error) {
	b, err := m.prepBlock(&p.Layer)
	if err != nil {
		return nil, err
	}
	c, be := m.cfg, m.be
	out := &mtpBlock{block: *b}
	if out.eProj, err = be.PrepareLinear(&p.EProj); err != nil {
		return nil, err
	}
	if out.hProj, err = be.PrepareLinear(&p.HProj); err != nil {
		return nil, err
	}
	if out.eNorm, err = be.PrepareVec("mtp enorm", p.ENorm, c.Dim); err != nil {
		return nil, err
	}
	if out.hNorm, err = be.PrepareVec("mtp hnorm", p.HNorm, c.Dim); err != nil {
		return nil, err
	}
	if out.norm, err = be.PrepareVec("mtp norm", p.Norm, c.Dim); err != nil {
		return nil, err
	}
	if out.hcHead, err = be.PrepareHC("mtp hc_head", p.HcHead, c.HcMult, c.HcDim()); err != nil {
		return nil, err
	}
	return out, nil
}

// Config returns the architecture.
func (m *Model) Config() *checkpoint.Config { return m.cfg }

// Cache returns the KV cache manager.
func (m *Model) Cache() *kvcache.Manager { return m.cache }

// Backend returns the backend the model runs on.
func (m *Model) Backend() backend.Backend { return m.be }

// FreeSequence releases the cache of s.
func (m *Model) FreeSequence(s *kvcache.Sequence) { m.cache.Free(s) }

// Batch is one forward step.
type Batch struct{ Items []BatchItem }

// BatchItem continues Seq at position Seq.Len() with Tokens.
type BatchItem struct {
	Seq       *kvcache.Sequence
	Tokens    []int32
	AllLogits bool // logits of every row instead of only the last
	// Hidden also returns every row's drafter input: the final residual
	// streams (MTP) or, on a DSpark checkpoint, the target layers' streams
	// averaged over hc and concatenated (DSparkDim).
	Hidden bool
	// KeepHidden keeps every row's drafter input (as Hidden gives it) on
	// the device instead (Output.Kept, from row Output.KeptRow[i]): the MTP
	// block's inputs (MTPItem.In) or DSpark's (DSparkItem.In).
	KeepHidden bool
	// Draw asks for the next token drawn on the device from the last row
	// (Output.IDs) where the model CanDraw; the logits then stay there
	// unless AllLogits.
	Draw *backend.Draw
	// DrawRows draws a token from every row on the device where the model
	// CanDraw (Output.RowIDs): greedy for all rows but the last, which follows
	// Draw (greedy without it); the logits stay there unless AllLogits. A
	// greedy verification of drafts needs only these. Where the model cannot
	// draw, Logits holds every row instead.
	DrawRows bool
}

// Output holds per item its fp32 logits, flattened rows×vocab: one row (its
// last token) or every row when AllLogits, nil for a drawn item without
// AllLogits; when some item was drawn, IDs holds per item its drawn token
// (-1 for the others); and, when BatchItem.Hidden is set, the
// drafter inputs of every row (BatchItem.Hidden), flattened rows×HiddenDim.
type Output struct {
	Logits    [][]float32
	IDs       []int32
	RowIDs    [][]int32 // per DrawRows item drawn on the device, every row's token; per DSparkItem with Draw, its drafts
	Hidden    [][]float32
	Vocab     int
	HiddenDim int
	// Kept holds the final streams that BatchItem.KeepHidden or
	// MTPItem.KeepNext asked to keep on the device, item i's from row
	// KeptRow[i] (-1: none); the caller frees it (FreeHidden).
	Kept    *Hidden
	KeptRow []int
}

// Rows returns the logits rows of item i as [vocab] views.
func (o *Output) Rows(i int) [][]float32 {
	l := o.Logits[i]
	out := make([][]float32, len(l)/o.Vocab)
	for r := range out {
		out[r] = l[r*o.Vocab : (r+1)*o.Vocab : (r+1)*o.Vocab]
	}
	return out
}

// Last returns the logits of the last row of item i.
func (o *Output) Last(i int) []float32 { l := o.Logits[i]; return l[len(l)-o.Vocab:] }

// runBlock applies one Block (spec §2) to the streams x in place; prefix
// names it ("layer 3 ", "mtp ") in errors and traces.
func (m *Model) runBlock(b *block, x backend.Tensor, ids []int32, bt *backend.Batch, prefix string) (backend.Tensor, error) {
	be, c := m.be, m.cfg
	n := x.Rows()
	layer := b.index
	mix := be.Empty(n, c.HcMult+c.HcMult*c.HcMult, backend.F32)
	an := be.Empty(n, c.Dim, backend.F32)
	defer be.Free(mix)
	defer be.Free(an)

	m.tr.at(layer, prefix+"attn", nil)
	// hc pre, attn_norm and the attention's first linears (wq_a, wkv).
	ws := b.attn.InputLinears()
	first := make([]backend.Tensor, len(ws))
	for i, w := range ws {
		first[i] = be.Empty(n, w.Out(), backend.F32)
		defer be.Free(first[i])
	}
	if err := be.HcPreNormLinears(x, b.hcAttn, m.hc, b.attnNorm, m.eps, an, mix, ws, first); err != nil {
		return nil, fmt.Errorf("%shc_pre+attn_norm: %w", prefix, err)
	}
	o, err := b.attn.Forward(be, m.store, an, first, bt)
	if err != nil {
		return nil, fmt.Errorf("%s%w", prefix, err)
	}
	defer be.Free(o)
	if m.sharded() {
		// This rank's heads gave a partial wo_b product (model.py's RowParallel).
		if err := m.allReduce(o); err != nil {
			return nil, fmt.Errorf("%sattn all-reduce: %w", prefix, err)
		}
	}
	if err := be.HcPost(o, x, mix, m.hc, x); err != nil {
		return nil, fmt.Errorf("%shc_post attn: %w", prefix, err)
	}

	m.tr.at(layer, prefix+"moe", nil)
	// The ffn site's norm feeds the router and the forked shared expert.
	if err := be.HcPreNormLinears(x, b.hcFFN, m.hc, b.ffnNorm, m.eps, an, mix, nil, nil); err != nil {
		return nil, fmt.Errorf("%shc_pre+ffn_norm: %w", prefix, err)
	}
	// The MoE ends with the ffn site's hc post (x updated in place).
	f, err := b.ffn.ForwardPost(be, an, ids, &moe.Post{X: x, Mix: mix, Args: m.hc})
	if err != nil {
		return nil, fmt.Errorf("%s%w", prefix, err)
	}
	be.Free(f)
	return x, nil
}

// prepare validates items, reserves cache and builds the row layout.
func (m *Model) prepare(items []BatchItem, mtp bool) (*backend.Batch, []int32, error) {
	if len(items) == 0 {
		return nil, nil, errors.New("model: empty batch")
	}
	// The cache store was chosen for the numerics at New (StoreFor).
	if n := m.be.Numerics(); n != m.num {
		return nil, nil, fmt.Errorf("model: backend numerics changed to %s after the model was created with %s", n, m.num)
	}
	seen := map[*kvcache.Sequence]bool{}
	bt := &backend.Batch{}
	var ids []int32
	for i, it := range items {
		if it.Seq == nil {
			return nil, nil, fmt.Errorf("model: item %d has no sequence", i)
		}
		if seen[it.Seq] {
			return nil, nil, fmt.Errorf("model: sequence %d appears twice in the batch", it.Seq.ID)
		}
		seen[it.Seq] = true
		if len(it.Tokens) == 0 {
			return nil, nil, fmt.Errorf("model: item %d has no tokens", i)
		}
		for _, t := range it.Tokens {
			if t < 0 || int(t) >= m.cfg.Vocab {
				return nil, nil, fmt.Errorf("model: item %d: token id %d outside vocab %d", i, t, m.cfg.Vocab)
			}
		}
	}
	if err := m.runCopies(); err != nil {
		return nil, nil, fmt.Errorf("model: %w", err)
	}
	for i, it := range items {
		start := it.Seq.Len()
		if !mtp {
			if err := m.cache.Reserve(it.Seq, start+len(it.Tokens)); err != nil {
				return nil, nil, fmt.Errorf("model: item %d: %w", i, err)
			}
		}
		if m.cache.TakeFresh(it.Seq) {
			if err := m.be.ResetSlot(m.store, it.Seq.Slot()); err != nil {
				return nil, nil, fmt.Errorf("model: %w", err)
			}
		}
		bt.Seqs = append(bt.Seqs, backend.SeqInfo{Slot: it.Seq.Slot(), Blocks: it.Seq.Blocks(), Start: start, Row0: len(ids), Rows: len(it.Tokens)})
		for k, t := range it.Tokens {
			ids = append(ids, t)
			bt.Pos = append(bt.Pos, int32(start+k))
			bt.Seq = append(bt.Seq, int32(i))
		}
	}
	return bt, ids, nil
}

// Forward runs one step over all items, advances each sequence and returns
// the requested logits. It never panics on bad input.
func (m *Model) Forward(b *Batch) (*Output, error) {
	if b == nil {
		return nil, errors.New("model: nil batch")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	bt, ids, err := m.prepare(b.Items, false)
	if err != nil {
		return nil, err
	}
	if verifying(b.Items) {
		bt.Name = "verify"
	}
	hidden := wantHidden(b.Items)
	bt.Hidden = hidden
	if m.tr != nil {
		m.tr.batch = bt
	}
	be, c := m.be, m.cfg
	n := len(ids)
	var rows []int
	for i, it := range b.Items {
		sq := bt.Seqs[i]
		if it.AllLogits || it.DrawRows {
			for r := range sq.Rows {
				rows = append(rows, sq.Row0+r)
			}
		} else {
			rows = append(rows, sq.Row0+sq.Rows-1)
		}
	}
	// forward's outputs: the logits, then with hidden the final streams or,
	// with DSpark, the target layers' features (captures).
	forward := func() (outs []backend.Tensor, err error) {
		x := be.Empty(n, c.HcDim(), backend.F32)
		var caps backend.Tensor
		defer func() {
			if err != nil {
				be.Free(x)
				if caps != nil {
					be.Free(caps)
				}
			}
		}()
		if m.ds != nil && hidden {
			caps = be.Empty(len(c.DSparkTargetLayers)*n, c.Dim, backend.F32)
		}
		m.tr.at(-1, "", nil)
		if err := be.Embed(m.embed, ids, c.HcMult, x); err != nil {
			return nil, fmt.Errorf("model embed: %w", err)
		}
		for _, blk := range m.blocks {
			if x, err = m.runBlock(blk, x, ids, bt, fmt.Sprintf("layer %d ", blk.index)); err != nil {
				return nil, err
			}
			if t := slices.Index(c.DSparkTargetLayers, blk.index); caps != nil && t >= 0 {
				if err := m.capture(x, caps, t); err != nil {
					return nil, err
				}
			}
		}
		lg, err := m.headLogits(x, rows, m.hcHead, m.norm, "")
		if err != nil {
			return nil, err
		}
		switch {
		case caps != nil:
			be.Free(x)
			return []backend.Tensor{lg, caps}, nil
		case hidden:
			return []backend.Tensor{lg, x}, nil
		}
		be.Free(x)
		return []backend.Tensor{lg}, nil
	}
	var outs []backend.Tensor
	if !m.sharded() {
		outs, err = be.RecordStep(bt, ids, forward)
	} else {
		outs, err = forward()
	}
	if err != nil {
		return nil, err
	}
	lg := outs[0]
	if len(outs) == 0 || hidden && len(outs) != 2 {
		for _, t := range outs {
			be.Free(t)
		}
		return nil, fmt.Errorf("model: step returned %d outputs", len(outs))
	}
	for _, it := range b.Items {
		m.cache.Advance(it.Seq, len(it.Tokens))
	}
	out := &Output{Logits: make([][]float32, len(b.Items)), Vocab: c.Vocab, HiddenDim: c.HcDim()}
	if out.IDs, out.RowIDs, err = m.drawTokens(lg, b.Items); err != nil {
		for _, t := range outs {
			be.Free(t)
		}
		return nil, err
	}
	if !allDrawn(b.Items, out.IDs) {
		logits, err := m.downloadLogits(lg, len(rows), "")
		if err != nil {
			return nil, err
		}
		k := 0
		for i, it := range b.Items {
			cnt := 1
			if it.AllLogits || it.DrawRows {
				cnt = len(it.Tokens)
			}
			if keepsLogits(it, out.IDs, i) {
				out.Logits[i] = logits[k*c.Vocab : (k+cnt)*c.Vocab : (k+cnt)*c.Vocab]
			}
			k += cnt
		}
	} else {
		be.Free(lg)
	}
	if m.ds != nil {
		out.HiddenDim = m.DSparkDim()
	}
	if keepsHidden(b.Items) {
		if err := m.keepStep(outs[1], bt, b.Items, out); err != nil {
			be.Free(outs[1])
			return nil, err
		}
	}
	if hidden && !hostHidden(b.Items) {
		be.Free(outs[1])
	}
	if hidden && hostHidden(b.Items) {
		w := out.HiddenDim
		var all []float32
		if m.ds != nil {
			all, err = m.downloadCaptures(outs[1], n)
		} else {
			all = make([]float32, n*w)
			err = be.Download(outs[1], all)
		}
		be.Free(outs[1])
		if err != nil {
			return nil, err
		}
		out.Hidden = make([][]float32, len(b.Items))
		for i, it := range b.Items {
			if it.Hidden {
				sq := bt.Seqs[i]
				out.Hidden[i] = all[sq.Row0*w : (sq.Row0+sq.Rows)*w : (sq.Row0+sq.Rows)*w]
			}
		}
	}
	return out, nil
}

// wantHidden reports whether an item asks for the final streams.
func wantHidden(items []BatchItem) bool {
	return hostHidden(items) || keepsHidden(items)
}

// hostHidden reports whether an item asks for the final streams on the host.
func hostHidden(items []BatchItem) bool {
	for _, it := range items {
		if it.Hidden {
			return true
		}
	}
	return false
}

// keepsHidden reports whether an item keeps its final streams on the device.
func keepsHidden(items []BatchItem) bool {
	for _, it := range items {
		if it.KeepHidden {
			return true
		}
	}
	return false
}

// keepStep keeps the step's drafter inputs x (the final streams, or with
// DSpark the captures) on the device (Output.Kept).
func (m *Model) keepStep(x backend.Tensor, bt *backend.Batch, items []BatchItem, out *Output) error {
	var h *Hidden
	var err error
	if m.ds != nil {
		h, err = m.keepCaptures(x, bt.Rows())
	} else {
		rows := make([]int, x.Rows())
		for r := range rows {
			rows[r] = r
		}
		h, err = m.keepRows(x, rows)
	}
	if err != nil {
		return err
	}
	out.Kept, out.KeptRow = h, make([]int, len(items))
	for i, it := range items {
		out.KeptRow[i] = -1
		if it.KeepHidden {
			out.KeptRow[i] = bt.Seqs[i].Row0
		}
	}
	return nil
}

// logits computes fp32 logits of the listed rows of the streams x (spec §2 step 4).
func (m *Model) logits(x backend.Tensor, rows []int, hc backend.HC, norm backend.Vec, prefix string) ([]float32, error) {
	lg, err := m.headLogits(x, rows, hc, norm, prefix)
	if err != nil {
		return nil, err
	}
	return m.downloadLogits(lg, len(rows), prefix)
}

// HeadLogits computes the main head's logits [len(rows), local vocab] of rows
// of the final streams x [N, hc·d] on the device: the head of a step alone,
// for benchmarks. The caller frees the result.
func (m *Model) HeadLogits(x backend.Tensor, rows []int) (backend.Tensor, error) {
	if x == nil || x.Cols() != m.cfg.HcDim() || len(rows) == 0 {
		return nil, fmt.Errorf("model: head logits: want streams of width %d and rows", m.cfg.HcDim())
	}
	for _, r := range rows {
		if r < 0 || r >= x.Rows() {
			return nil, fmt.Errorf("model: head logits: row %d outside [0, %d)", r, x.Rows())
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.headLogits(x, rows, m.hcHead, m.norm, "")
}

// headLogits computes this rank's logits [len(rows), local vocab] on the device.
func (m *Model) headLogits(x backend.Tensor, rows []int, hc backend.HC, norm backend.Vec, prefix string) (backend.Tensor, error) {
	be, c := m.be, m.cfg
	k := len(rows)
	m.tr.at(-1, strings.TrimSpace(prefix), rows) // the gathered rows are not batch rows
	xs := be.Empty(k, c.HcDim(), backend.F32)
	y := be.Empty(k, c.Dim, backend.F32)
	yn := be.Empty(k, c.Dim, backend.F32)
	defer func() {
		for _, t := range []backend.Tensor{xs, y, yn} {
			be.Free(t)
		}
	}()
	if err := be.GatherRows(x, rows, xs); err != nil {
		return nil, err
	}
	if err := be.HcHead(xs, hc, m.hc, y); err != nil {
		return nil, fmt.Errorf("%shc_head: %w", prefix, err)
	}
	if err := be.RMSNorm(y, norm, m.eps, yn); err != nil {
		return nil, fmt.Errorf("%snorm: %w", prefix, err)
	}
	lg := be.Empty(k, m.localVocab(), backend.F32)
	if err := be.LinearF32(yn, m.head, lg); err != nil {
		be.Free(lg)
		return nil, fmt.Errorf("%shead: %w", prefix, err)
	}
	return lg, nil
}

// downloadLogits brings k rows of logits to the host (all ranks' vocabulary
// slices when sharded) and frees lg.
func (m *Model) downloadLogits(lg backend.Tensor, k int, prefix string) ([]float32, error) {
	be, c := m.be, m.cfg
	defer be.Free(lg)
	flat := make([]float32, k*c.Vocab)
	if !m.sharded() {
		if err := be.Download(lg, flat); err != nil {
			return nil, err
		}
		return flat, nil
	}
	// Vocabulary slices, rank-major after the all-gather: interleave them
	// into rows on the host, where the logits go anyway.
	n, vl := m.part.Size, m.localVocab()
	all := be.Empty(n*k, vl, backend.F32)
	defer be.Free(all)
	if err := m.opts.Comm.AllGatherRows(be, lg, all); err != nil {
		return nil, fmt.Errorf("%shead all-gather: %w", prefix, err)
	}
	g := make([]float32, n*k*vl)
	if err := be.Download(all, g); err != nil {
		return nil, err
	}
	for r := range n {
		for i := range k {
			copy(flat[i*c.Vocab+r*vl:i*c.Vocab+(r+1)*vl], g[(r*k+i)*vl:(r*k+i+1)*vl])
		}
	}
	return flat, nil
}

// runCopies issues the prefix cache's queued snapshots, restores and block
// copies, before any slot is reset or written.
func (m *Model) runCopies() error {
	for _, c := range m.cache.TakeCopies() {
		var err error
		switch {
		case c.Src == c.Dst: // the source was evicted and handed back as the destination
		case c.Block:
			err = m.be.CopyBlock(m.store, int32(c.Dst), int32(c.Src))
		default:
			err = m.be.CopySlot(m.store, backend.WholeSlot(m.store, c.Src, c.Dst))
		}
		if err != nil {
			return err
		}
	}
	return nil
}
