package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/moe"
)

// DSpark drafting (docs/speculative.md): the drafter's context is
// main_x = main_norm(main_proj(f)), f the target layers' output streams
// averaged over hc and concatenated (captured by Forward with Hidden). Each
// stage keeps a window ring of rope(kv_norm(wkv(main_x))) entries in the
// sequence's state slot (layer Layers+stage). A block is the last token and
// rows-1 noise tokens at the positions after the context; its rows attend,
// non-causally, to the window's entries and to every row of the block, and
// never write the ring, so a block leaves no state behind.

type dspark struct {
	stages   []*block
	mainProj backend.Linear
	mainNorm backend.Vec
	norm     backend.Vec
	hcHead   backend.HC
	w1       backend.Embedding // markov_w1: the previous token's rank-r embedding
	w2       backend.Linear    // markov_w2: its bias over the vocabulary
	rows     int               // block rows (drafts per step)
	window   int               // ring entries per stage: the window plus rows
	noise    int32
}

// dsparkRows resolves Options.DSparkRows against the config.
func dsparkRows(c *checkpoint.Config, n int) (int, error) {
	switch {
	case n == 0:
		return c.DSparkBlockSize, nil
	case n < 0 || n > c.DSparkBlockSize:
		return 0, fmt.Errorf("model: DSpark block of %d rows out of [1, dspark_block_size %d]", n, c.DSparkBlockSize)
	}
	return n, nil
}

func (m *Model) prepDSpark(d *checkpoint.DSpark, rows int) (*dspark, error) {
	c, be := m.cfg, m.be
	out := &dspark{rows: rows, window: c.Window + rows, noise: int32(*c.DSparkNoiseToken)}
	for s := range d.Layers {
		b, err := m.prepBlock(&d.Layers[s])
		if err != nil {
			return nil, fmt.Errorf("stage %d: %w", s, err)
		}
		out.stages = append(out.stages, b)
	}
	var err error
	if out.mainProj, err = be.PrepareLinear(&d.MainProj); err != nil {
		return nil, err
	}
	if out.mainNorm, err = be.PrepareVec("dspark main_norm", d.MainNorm, c.Dim); err != nil {
		return nil, err
	}
	if out.norm, err = be.PrepareVec("dspark norm", d.Norm, c.Dim); err != nil {
		return nil, err
	}
	if out.hcHead, err = be.PrepareHC("dspark hc_head", d.HcHead, c.HcMult, c.HcDim()); err != nil {
		return nil, err
	}
	if out.w1, err = be.PrepareEmbedding(d.MarkovW1.Weight, c.Vocab, c.DSparkMarkovRank); err != nil {
		return nil, fmt.Errorf("markov_w1: %w", err)
	}
	if out.w2, err = be.PrepareLinear(&d.MarkovW2); err != nil {
		return nil, fmt.Errorf("markov_w2: %w", err)
	}
	return out, nil
}

// HasDSpark reports whether the checkpoint has a DSpark drafter.
func (m *Model) HasDSpark() bool { return m.ds != nil }

// DSparkRows is the number of drafts a DSpark block makes (0 without DSpark).
func (m *Model) DSparkRows() int {
	if m.ds == nil {
		return 0
	}
	return m.ds.rows
}

// DSparkDim is the width of a captured row (Output.Hidden with DSpark):
// dim × the number of target layers.
func (m *Model) DSparkDim() int { return m.cfg.Dim * len(m.cfg.DSparkTargetLayers) }

// DSparkItem is one sequence's drafter step: Context holds, flattened
// rows×DSparkDim, the captured features of positions Start, Start+1, … (as
// Forward returns them in Output.Hidden), or In names them on the device
// (Output.Kept of a KeepHidden step; Context is then empty); they enter the
// stages' windows. With Draft, a block follows: Anchor (the token at the
// position after the context) and noise tokens, whose base logits (before
// the Markov head) Output.Logits returns, DSparkRows rows; with Draw as well,
// where the model CanDrawDSpark, the block's greedy drafts through the
// Markov head come back instead (Output.RowIDs, DSparkRows tokens), drawn on
// the device, and no logits. Positions must come in order without gaps.
type DSparkItem struct {
	Seq     *kvcache.Sequence
	Start   int
	Context []float32
	In      HiddenRef
	Anchor  int32
	Draft   bool
	Draw    bool
}

// CanDrawDSpark reports whether ForwardDSpark honours DSparkItem.Draw: the
// backend draws the Markov chain where the logits are.
func (m *Model) CanDrawDSpark() bool {
	return m.ds != nil && backend.Markov(m.be) != nil && !m.sharded()
}

// ForwardDSpark runs the DSpark drafter: the context rows of every item,
// then one block per drafting item.
func (m *Model) ForwardDSpark(items []DSparkItem) (*Output, error) {
	if m.ds == nil {
		return nil, errors.New("model: checkpoint has no DSpark drafter")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, w := m.cfg, m.DSparkDim()
	ctx, blk := &backend.Batch{}, &backend.Batch{}
	att := &backend.Batch{} // the block's rows all at its last position: each sees the whole block
	var src []rowSrc
	var ids []int32
	draw := false
	for i, it := range items {
		if it.Seq == nil || it.Seq.Slot() < 0 {
			return nil, fmt.Errorf("model dspark: item %d: sequence has no cache state (run Forward first)", i)
		}
		if len(it.Context)%w != 0 {
			return nil, fmt.Errorf("model dspark: item %d: %d context values, not rows of %d", i, len(it.Context), w)
		}
		n := len(it.Context) / w
		if it.In.H != nil {
			if err := it.In.check(); err != nil {
				return nil, fmt.Errorf("model dspark: item %d: input: %w", i, err)
			}
			if it.In.H.t.Cols() != w || n > 0 {
				return nil, fmt.Errorf("model dspark: item %d: device rows of width %d (want %d) and %d host rows", i, it.In.H.t.Cols(), w, n)
			}
			n = it.In.Rows
		}
		if it.Start < 0 || it.Draft && it.Start+n < 1 {
			return nil, fmt.Errorf("model dspark: item %d: a block at position %d has no context before it", i, it.Start+n)
		}
		if it.Draft && (it.Anchor < 0 || int(it.Anchor) >= c.Vocab) {
			return nil, fmt.Errorf("model dspark: item %d: anchor token %d outside vocab %d", i, it.Anchor, c.Vocab)
		}
		if n > 0 {
			ctx.Seqs = append(ctx.Seqs, backend.SeqInfo{Slot: it.Seq.Slot(), Blocks: it.Seq.Blocks(), Start: it.Start, Row0: len(ctx.Pos), Rows: n})
			for r := range n {
				ctx.Pos = append(ctx.Pos, int32(it.Start+r))
				ctx.Seq = append(ctx.Seq, int32(len(ctx.Seqs)-1))
			}
			src = append(src, rowSrc{host: it.Context, in: it.In, rows: n})
		}
		if it.Draft {
			draw = draw || it.Draw
			a, k := it.Start+n, m.ds.rows
			si := backend.SeqInfo{Slot: it.Seq.Slot(), Blocks: it.Seq.Blocks(), Start: a, Row0: len(blk.Pos), Rows: k}
			blk.Seqs, att.Seqs = append(blk.Seqs, si), append(att.Seqs, si)
			for r := range k {
				tok := m.ds.noise
				if r == 0 {
					tok = it.Anchor
				}
				ids = append(ids, tok)
				blk.Pos, att.Pos = append(blk.Pos, int32(a+r)), append(att.Pos, int32(a+k-1))
				blk.Seq, att.Seq = append(blk.Seq, int32(len(blk.Seqs)-1)), append(att.Seq, int32(len(blk.Seqs)-1))
			}
		}
	}
	be := m.be
	if len(src) > 0 {
		// A recorded context reads its rows from the staging (a fixed
		// address); it has no token ids.
		x, err := m.stageRows(src, ctx.Rows(), w)
		if err != nil {
			return nil, fmt.Errorf("model dspark context: %w", err)
		}
		ctx.Name = "dspark ctx"
		outs, err := be.RecordStep(ctx, make([]int32, ctx.Rows()), func() ([]backend.Tensor, error) { return nil, m.dsparkContext(x, ctx) })
		if err != nil {
			return nil, err
		}
		for _, t := range outs {
			be.Free(t)
		}
	}
	out := &Output{Logits: make([][]float32, len(items)), Vocab: c.Vocab}
	if len(ids) == 0 {
		return out, nil
	}
	draw = draw && m.CanDrawDSpark()
	blk.Name, blk.Also = "dspark", []*backend.Batch{att}
	want := 1
	if draw {
		blk.Name, want = "dspark draw", 2
	}
	outs, err := be.RecordStep(blk, ids, func() ([]backend.Tensor, error) { return m.dsparkBlock(ids, blk, att, draw) })
	if err != nil {
		return nil, err
	}
	if len(outs) != want {
		for _, t := range outs {
			be.Free(t)
		}
		return nil, fmt.Errorf("model dspark: block step returned %d outputs, want %d", len(outs), want)
	}
	return out, m.dsparkOutput(items, outs, len(ids), draw, out)
}

// dsparkContext writes the context rows' window entries of every stage
// from their features f [rows, DSparkDim].
func (m *Model) dsparkContext(f backend.Tensor, bt *backend.Batch) error {
	be, c := m.be, m.cfg
	n := bt.Rows()
	if m.tr != nil {
		m.tr.batch = bt
	}
	m.tr.at(c.Layers, "dspark context", nil)
	y := be.Empty(n, c.Dim, backend.F32)
	mx := be.Empty(n, c.Dim, backend.F32)
	kvr := be.Empty(n, c.HeadDim, backend.F32)
	kv := be.Empty(n, c.HeadDim, backend.F32)
	defer func() {
		for _, t := range []backend.Tensor{y, mx, kvr, kv} {
			be.Free(t)
		}
	}()
	if err := be.Linear(f, m.ds.mainProj, y); err != nil {
		return fmt.Errorf("model dspark main_proj: %w", err)
	}
	if err := be.RMSNorm(y, m.ds.mainNorm, m.eps, mx); err != nil {
		return fmt.Errorf("model dspark main_norm: %w", err)
	}
	for s, st := range m.ds.stages {
		l := st.attn
		if err := be.Linear(mx, l.WKV, kvr); err != nil {
			return fmt.Errorf("model dspark stage %d context wkv: %w", s, err)
		}
		ra := backend.RopeArgs{Freqs: l.Rope, HeadDim: l.HeadDim}
		if err := be.NormRopeKVQuant(kvr, l.KVNorm, l.Eps, ra, l.HeadDim-l.RopeDim, 64, bt, kv); err != nil {
			return fmt.Errorf("model dspark stage %d context kv: %w", s, err)
		}
		if err := be.WriteWindow(m.store, l.Index, kv, bt); err != nil {
			return fmt.Errorf("model dspark stage %d context: %w", s, err)
		}
	}
	return nil
}

// dsparkBlock runs the blocks through the stages: its outputs are their
// base logits [rows, vocab] and, with draw, the drafts [DSparkRows, blocks]
// (I32) drawn through the Markov head.
func (m *Model) dsparkBlock(ids []int32, bt, att *backend.Batch, draw bool) (outs []backend.Tensor, err error) {
	be, c := m.be, m.cfg
	n := len(ids)
	if m.tr != nil {
		m.tr.batch = bt
	}
	m.tr.at(c.Layers, "dspark block", nil)
	x := be.Empty(n, c.HcDim(), backend.F32)
	defer be.Free(x)
	if err := be.Embed(m.embed, ids, c.HcMult, x); err != nil {
		return nil, fmt.Errorf("model dspark embed: %w", err)
	}
	for s, st := range m.ds.stages {
		if err := m.dsparkStage(st, x, ids, bt, att, fmt.Sprintf("dspark stage %d ", s)); err != nil {
			return nil, err
		}
	}
	rows := make([]int, n)
	for i := range rows {
		rows[i] = i
	}
	lg, err := m.headLogits(x, rows, m.ds.hcHead, m.ds.norm, "dspark ")
	if err != nil {
		return nil, err
	}
	if !draw {
		return []backend.Tensor{lg}, nil
	}
	k := m.ds.rows
	drafts := be.Empty(k, n/k, backend.I32)
	m.tr.at(c.Layers, "dspark markov", nil)
	if err := backend.Markov(be).MarkovDraw(lg, ids, k, m.ds.w1, m.ds.w2, drafts); err != nil {
		be.Free(lg)
		be.Free(drafts)
		return nil, fmt.Errorf("model dspark markov draw: %w", err)
	}
	return []backend.Tensor{lg, drafts}, nil
}

// dsparkOutput fills out from the block's outputs (dsparkBlock) of rows
// rows: the drawn drafts of the items that asked, the logits of the other
// drafting items (downloaded only for them); it frees outs.
func (m *Model) dsparkOutput(items []DSparkItem, outs []backend.Tensor, rows int, draw bool, out *Output) error {
	be, c, k := m.be, m.cfg, m.ds.rows
	lg := outs[0]
	if draw {
		nb := rows / k
		got := make([]int32, rows)
		err := be.DownloadI32(outs[1], got)
		be.Free(outs[1])
		if err != nil {
			be.Free(lg)
			return fmt.Errorf("model dspark drafts: %w", err)
		}
		out.RowIDs = make([][]int32, len(items))
		s := 0
		for i, it := range items {
			if !it.Draft {
				continue
			}
			if it.Draw {
				out.RowIDs[i] = make([]int32, k)
				for j := range k {
					out.RowIDs[i][j] = got[j*nb+s]
				}
			}
			s++
		}
	}
	host := false
	for _, it := range items {
		host = host || it.Draft && (!draw || !it.Draw)
	}
	if !host {
		be.Free(lg)
		return nil
	}
	logits, err := m.downloadLogits(lg, rows, "dspark ")
	if err != nil {
		return err
	}
	r := 0
	for i, it := range items {
		if it.Draft {
			n := k * c.Vocab
			if !draw || !it.Draw {
				out.Logits[i] = logits[r : r+n : r+n]
			}
			r += n
		}
	}
	return nil
}

// dsparkStage is runBlock with the block attention of dsparkAttn.
func (m *Model) dsparkStage(b *block, x backend.Tensor, ids []int32, bt, att *backend.Batch, prefix string) error {
	be, c := m.be, m.cfg
	n := x.Rows()
	mix := be.Empty(n, c.HcMult+c.HcMult*c.HcMult, backend.F32)
	an := be.Empty(n, c.Dim, backend.F32)
	defer be.Free(mix)
	defer be.Free(an)
	ws := b.attn.InputLinears()
	first := make([]backend.Tensor, len(ws))
	for i, w := range ws {
		first[i] = be.Empty(n, w.Out(), backend.F32)
		defer be.Free(first[i])
	}
	if err := be.HcPreNormLinears(x, b.hcAttn, m.hc, b.attnNorm, m.eps, an, mix, ws, first); err != nil {
		return fmt.Errorf("%shc_pre+attn_norm: %w", prefix, err)
	}
	o, err := m.dsparkAttn(b, first[0], first[1], bt, att)
	if err != nil {
		return fmt.Errorf("%sattn %w", prefix, err)
	}
	defer be.Free(o)
	if err := be.HcPost(o, x, mix, m.hc, x); err != nil {
		return fmt.Errorf("%shc_post attn: %w", prefix, err)
	}
	if err := be.HcPreNormLinears(x, b.hcFFN, m.hc, b.ffnNorm, m.eps, an, mix, nil, nil); err != nil {
		return fmt.Errorf("%shc_pre+ffn_norm: %w", prefix, err)
	}
	f, err := b.ffn.ForwardPost(be, an, ids, &moe.Post{X: x, Mix: mix, Args: m.hc})
	if err != nil {
		return fmt.Errorf("%s%w", prefix, err)
	}
	be.Free(f)
	return nil
}

// dsparkAttn is the stage's attention over its window ring and the whole
// block: the sliding-window attention of a main layer (queries, kv entry,
// sink, inverse rope, grouped output) with the rows placed at the block's
// last position for the key range (att) and at their own for the rope (bt),
// and no window write.
func (m *Model) dsparkAttn(b *block, qa, kvr backend.Tensor, bt, att *backend.Batch) (backend.Tensor, error) {
	be, l := m.be, b.attn
	n, H, D := qa.Rows(), l.Heads, l.HeadDim
	var tmp []backend.Tensor
	defer func() {
		for _, t := range tmp {
			be.Free(t)
		}
	}()
	empty := func(rows, cols int) backend.Tensor {
		t := be.Empty(rows, cols, backend.F32)
		tmp = append(tmp, t)
		return t
	}
	ra := backend.RopeArgs{Freqs: l.Rope, HeadDim: D}
	kv := empty(n, D)
	if err := be.NormRopeKVQuant(kvr, l.KVNorm, l.Eps, ra, D-l.RopeDim, 64, bt, kv); err != nil {
		return nil, fmt.Errorf("kv: %w", err)
	}
	q, qr := empty(n, H*D), empty(n, l.WqA.Out())
	if err := be.NormLinears(qa, l.QNorm, l.Eps, qr, []backend.Linear{l.WqB}, []backend.Tensor{q}); err != nil {
		return nil, fmt.Errorf("q_norm+wq_b: %w", err)
	}
	if err := be.HeadNormRope(q, l.Eps, ra, bt); err != nil {
		return nil, fmt.Errorf("q: %w", err)
	}
	o := empty(n, H*D)
	err := be.SparseAttention(m.store, q, kv, nil, backend.AttnArgs{Layer: l.Index, Heads: H, HeadDim: D, Window: m.ds.window,
		Scale: float32(1 / math.Sqrt(float64(D))), Sink: l.Sink}, att, o)
	if err == nil {
		err = be.Rope(o, backend.RopeArgs{Freqs: l.Rope, HeadDim: D, Inverse: true}, bt)
	}
	if err != nil {
		return nil, fmt.Errorf("sparse attention: %w", err)
	}
	z := empty(n, l.WoA.Out())
	if err := be.GroupedOutProj(o, l.WoA, l.Groups, z); err != nil {
		return nil, fmt.Errorf("wo_a: %w", err)
	}
	out := be.Empty(n, l.WoB.Out(), backend.F32)
	if err := be.Linear(z, l.WoB, out); err != nil {
		be.Free(out)
		return nil, fmt.Errorf("wo_b: %w", err)
	}
	return out, nil
}

// MarkovBias returns, per previous token, the Markov head's bias over the
// vocabulary, markov_w2 · markov_w1[prev], which DSpark adds to a block
// row's base logits before choosing its draft.
func (m *Model) MarkovBias(prev []int32) ([][]float32, error) {
	if m.ds == nil {
		return nil, errors.New("model: checkpoint has no DSpark drafter")
	}
	if len(prev) == 0 {
		return nil, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	be, c := m.be, m.cfg
	m.tr.at(c.Layers, "dspark markov", nil)
	n := len(prev)
	e := be.Empty(n, c.DSparkMarkovRank, backend.F32)
	lg := be.Empty(n, c.Vocab, backend.F32)
	defer be.Free(e)
	defer be.Free(lg)
	if err := be.Embed(m.ds.w1, prev, 1, e); err != nil {
		return nil, fmt.Errorf("model dspark markov_w1: %w", err)
	}
	if err := be.LinearF32(e, m.ds.w2, lg); err != nil {
		return nil, fmt.Errorf("model dspark markov_w2: %w", err)
	}
	flat := make([]float32, n*c.Vocab)
	if err := be.Download(lg, flat); err != nil {
		return nil, fmt.Errorf("model dspark markov: %w", err)
	}
	out := make([][]float32, n)
	for i := range out {
		out[i] = flat[i*c.Vocab : (i+1)*c.Vocab : (i+1)*c.Vocab]
	}
	return out, nil
}

// capture writes the DSpark feature of target t (the layer just run) into
// rows [t·n, (t+1)·n) of caps: the streams x [n, hc·d] averaged over hc.
// Captures are target-major so that a step's ops fill fixed row ranges.
func (m *Model) capture(x, caps backend.Tensor, t int) error {
	be, c := m.be, m.cfg
	n := x.Rows()
	xv, err := be.View(x, n*c.HcMult, c.Dim)
	if err != nil {
		return err
	}
	acc, err := be.Slice(caps, t*n, n)
	if err != nil {
		return err
	}
	s := be.Empty(n, c.Dim, backend.F32)
	defer be.Free(s)
	rows := make([]int, n)
	for j := range c.HcMult {
		dst := s
		if j == 0 {
			dst = acc
		}
		for r := range rows {
			rows[r] = r*c.HcMult + j
		}
		err := be.GatherRows(xv, rows, dst)
		if err == nil && j > 0 {
			err = be.Combine(acc, s, acc)
		}
		if err != nil {
			return fmt.Errorf("model dspark capture: %w", err)
		}
	}
	if err := be.Scale(acc, 1/float32(c.HcMult)); err != nil {
		return fmt.Errorf("model dspark capture: %w", err)
	}
	return nil
}

// downloadCaptures returns every row's captured features, the target
// layers' rows side by side (rows×DSparkDim), from the target-major caps.
func (m *Model) downloadCaptures(caps backend.Tensor, n int) ([]float32, error) {
	d, nt := m.cfg.Dim, len(m.cfg.DSparkTargetLayers)
	w := d * nt
	flat := make([]float32, n*w)
	if err := m.be.Download(caps, flat); err != nil {
		return nil, fmt.Errorf("model dspark capture: %w", err)
	}
	all := make([]float32, n*w)
	for t := range nt {
		for r := range n {
			copy(all[r*w+t*d:r*w+(t+1)*d], flat[(t*n+r)*d:(t*n+r+1)*d])
		}
	}
	return all, nil
}

// keepCaptures gathers the target-major caps of n rows into a new Hidden of
// rows×DSparkDim (row r: the targets' features side by side) on the device.
func (m *Model) keepCaptures(caps backend.Tensor, n int) (*Hidden, error) {
	be, d, nt := m.be, m.cfg.Dim, len(m.cfg.DSparkTargetLayers)
	if caps.Rows() != n*nt {
		return nil, fmt.Errorf("model dspark capture: %d captured rows for %d rows of %d targets", caps.Rows(), n, nt)
	}
	y := be.Empty(n, d*nt, backend.F32)
	yv, err := be.View(y, n*nt, d)
	if err != nil {
		be.Free(y)
		return nil, err
	}
	perm := make([]int, n*nt)
	for r := range n {
		for t := range nt {
			perm[r*nt+t] = t*n + r
		}
	}
	if err := be.GatherRows(caps, perm, yv); err != nil {
		be.Free(y)
		return nil, fmt.Errorf("model dspark: keep captures: %w", err)
	}
	return &Hidden{t: y}, nil
}
