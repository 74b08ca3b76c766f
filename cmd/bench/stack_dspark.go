package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
)

// Decode steps with DSpark drafts (--speculative-config
// '{"method":"dspark",...}'): the preset gets the published drafter
// (checkpoint.WithDSpark) over its last layers built, and each step runs
// the engine's DSpark step (engine/specdspark.go) on the model directly:
// the drafter's context catches up with the verified positions, one block
// per sequence drafts N tokens through the Markov head, one forward pass
// verifies them and the cache is rolled back to the emitted tokens.

// dspark reports whether the steps with drafts use the DSpark drafter.
func (f *stackFlags) dspark() bool { return f.spec.Method == "dspark" }

// checkDSpark checks a DSpark speculative config against the preset's
// drafter as serve checks it against a checkpoint's, and resolves an absent
// draft count to dspark_block_size.
func (f *stackFlags) checkDSpark() error {
	if f.mtp {
		return errors.New(`--mtp with method "dspark": a DSpark checkpoint's mtp.* holds the drafter, not an MTP block`)
	}
	full, err := checkpoint.PresetConfig(f.preset)
	if err != nil {
		return fmt.Errorf("--preset: %w", err)
	}
	s, err := checkpoint.PresetDSpark(f.preset)
	if err != nil {
		return fmt.Errorf("--preset: %w", err)
	}
	if f.prefill < 2 {
		// A one-token prefill step has a plain decode step's shape, whose
		// CUDA graph (recorded without the drafter's features) it would
		// replay.
		return errors.New(`--prefill 1 with method "dspark": the prefill must capture the drafter's features; want --prefill >= 2`)
	}
	if f.layers != 0 && f.layers < s.Targets {
		return fmt.Errorf("--layers %d: the DSpark drafter reads the last %d layers built, want --layers >= %d", f.layers, s.Targets, s.Targets)
	}
	c, err := checkpoint.WithDSpark(full, s)
	if err != nil {
		return fmt.Errorf("--preset %s: %w", f.preset, err)
	}
	if err := f.spec.CheckCheckpoint(c); err != nil {
		return err
	}
	if f.spec.NumTokens == 0 {
		f.spec.NumTokens = c.DSparkBlockSize
	}
	return nil
}

// dsparkLine describes the drafter built for the stack c of the whole
// model full.
func dsparkLine(c, full *checkpoint.Config, rows int) string {
	which := fmt.Sprintf("the last %d layers", len(c.DSparkTargetLayers))
	if c.Layers < full.Layers {
		which = fmt.Sprintf("the last %d layers built; the whole model's would be %d–%d", len(c.DSparkTargetLayers),
			full.Layers-len(c.DSparkTargetLayers), full.Layers-1)
	}
	return fmt.Sprintf("dspark: %d stages, dspark_block_size %d (blocks of %d rows built), markov rank %d, noise token %d, target layers %v (%s)\n",
		c.DSparkLayers(), c.DSparkBlockSize, rows, c.DSparkMarkovRank, *c.DSparkNoiseToken, c.DSparkTargetLayers, which)
}

// dsparkParts is the time of a DSpark draft pass's parts: the context
// (features into the stages' windows), the block through the stages, and
// the Markov head's positions with the host's argmax (drawn: in the block,
// on the device).
type dsparkParts struct {
	context, block, markov time.Duration
	drawn                  bool
}

// dsparkDevice reports whether DSpark steps keep the captured features on
// the device and draw the drafts there: with --draw where the model can,
// as the engine does for greedy requests.
func dsparkDevice(m *model.Model, draw bool) bool { return draw && m.CanDrawDSpark() }

// dsparkDraft drafts k tokens for every sequence with the DSpark drafter,
// as the engine's greedy paths do (engine/specdspark.go): the features
// queued in s.feats (on the host) or s.hidden (on the device) enter the
// stages' windows, one block from the sequence's last token gives k rows of
// base logits, and draft j is the argmax of row j plus the Markov bias
// after draft j-1 (after the last token for j = 0): on the device where
// dsparkDevice, else on the host. It is the bench's one call site of a
// DSpark draft pass.
func dsparkDraft(m *model.Model, seqs []*specSeq, k int, draw bool) ([][]int32, dsparkParts, error) {
	p := dsparkParts{drawn: dsparkDevice(m, draw)}
	if rows := m.DSparkRows(); rows != k {
		return nil, p, fmt.Errorf("dspark: the model drafts blocks of %d rows, not %d", rows, k)
	}
	w := m.DSparkDim()
	var ctx []model.DSparkItem
	for _, s := range seqs {
		if len(s.feats) > 0 || s.hidden.Rows > 0 {
			ctx = append(ctx, model.DSparkItem{Seq: s.kv, Start: s.mtpLen, Context: s.feats, In: s.hidden})
		}
	}
	t0 := time.Now()
	if len(ctx) > 0 {
		if _, err := m.ForwardDSpark(ctx); err != nil {
			return nil, p, fmt.Errorf("dspark context: %w", err)
		}
	}
	p.context = time.Since(t0)
	blk := make([]model.DSparkItem, len(seqs))
	for i, s := range seqs {
		s.mtpLen += len(s.feats)/w + s.hidden.Rows
		s.feats = nil
		if s.mtpLen != len(s.toks)-1 {
			return nil, p, fmt.Errorf("dspark: sequence %d: the drafter has %d positions of %d tokens", i, s.mtpLen, len(s.toks))
		}
		blk[i] = model.DSparkItem{Seq: s.kv, Start: s.mtpLen, Anchor: s.toks[s.mtpLen], Draft: true, Draw: p.drawn}
	}
	freeHidden(m, seqs)
	t0 = time.Now()
	base, err := m.ForwardDSpark(blk)
	p.block = time.Since(t0)
	if err != nil {
		return nil, p, fmt.Errorf("dspark block: %w", err)
	}
	if p.drawn {
		if len(base.RowIDs) != len(seqs) {
			return nil, p, fmt.Errorf("dspark block: %d drawn blocks for %d sequences", len(base.RowIDs), len(seqs))
		}
		for i, d := range base.RowIDs {
			if len(d) != k {
				return nil, p, fmt.Errorf("dspark block: sequence %d: %d drawn drafts, want %d", i, len(d), k)
			}
		}
		return base.RowIDs, p, nil
	}
	t0 = time.Now()
	vocab := m.Config().Vocab
	drafts := make([][]int32, len(seqs))
	prev := make([]int32, len(seqs))
	lg := make([]float32, vocab)
	for j := range k {
		for i, s := range seqs {
			prev[i] = s.toks[s.mtpLen]
			if j > 0 {
				prev[i] = drafts[i][j-1]
			}
		}
		bias, err := m.MarkovBias(prev)
		if err != nil {
			return nil, p, fmt.Errorf("dspark markov position %d: %w", j, err)
		}
		for i := range seqs {
			row := base.Logits[i][j*vocab : (j+1)*vocab]
			for v := range lg {
				lg[v] = row[v] + bias[i][v]
			}
			drafts[i] = append(drafts[i], engine.Argmax(lg))
		}
	}
	p.markov = time.Since(t0)
	return drafts, p, nil
}

// dsparkPrefill prefills seqs with random prompts of --prefill tokens in
// steps of --prefill-seqs sequences, takes each one's next token (argmax)
// and feeds the drafter the prompt's features (untimed, as the MTP block's
// catch-up in specPrefill).
func dsparkPrefill(m *model.Model, f *stackFlags, seqs []*specSeq, rng *rand.Rand) error {
	c := m.Config()
	for i0 := 0; i0 < len(seqs); i0 += f.prefillSeqs {
		group := seqs[i0:min(i0+f.prefillSeqs, len(seqs))]
		b := &model.Batch{}
		for _, s := range group {
			s.toks = randTokens(rng, f.prefill, c.Vocab)
			b.Items = append(b.Items, model.BatchItem{Seq: s.kv, Tokens: s.toks, Hidden: true})
		}
		out, err := m.Forward(b)
		if err != nil {
			return fmt.Errorf("speculative prefill %d..%d: %w", i0, i0+len(group)-1, err)
		}
		ctx := make([]model.DSparkItem, len(group))
		for j, s := range group {
			s.toks = append(s.toks, engine.Argmax(out.Last(j)))
			s.pending = s.toks[len(s.toks)-1:]
			ctx[j] = model.DSparkItem{Seq: s.kv, Context: out.Hidden[j]}
			s.mtpLen = f.prefill
		}
		if _, err := m.ForwardDSpark(ctx); err != nil {
			return fmt.Errorf("speculative prefill %d..%d: dspark context: %w", i0, i0+len(group)-1, err)
		}
	}
	return nil
}

// dsparkStep runs one draft+verify step over all sequences with the DSpark
// drafter. With draw, the verifying rows' greedy tokens are drawn on the
// device where the model can and, where dsparkDevice, the captured features
// stay there and the drafts are drawn there; otherwise the features come to
// the host (the drafter's context reads them there).
func dsparkStep(m *model.Model, seqs []*specSeq, k int, acceptRate float64, draw bool, rng *rand.Rand) (*specStackResult, error) {
	st := &specStackResult{perPos: make([]int, k)}
	t0 := time.Now()
	drafts, parts, err := dsparkDraft(m, seqs, k, draw)
	st.mtp, st.ds = []time.Duration{time.Since(t0)}, []dsparkParts{parts}
	if err != nil {
		return nil, err
	}
	for _, s := range seqs {
		if err := m.Cache().Reserve(s.kv, s.kv.Len()+len(s.pending)+k); err != nil {
			return nil, err
		}
	}
	w := m.DSparkDim()
	dev := dsparkDevice(m, draw)
	err = verifyDrafts(m, seqs, drafts, acceptRate, draw, dev, rng, st, func(i, n, a int, vout *model.Output) error {
		// The drafter has seen positions before the last pending token's;
		// rows n-1 … n-1+a are verified.
		if dev {
			seqs[i].hidden = model.HiddenRef{H: vout.Kept, Row0: vout.KeptRow[i] + n - 1, Rows: a + 1}
			return nil
		}
		if len(vout.Hidden) != len(seqs) || len(vout.Hidden[i]) != (n+len(drafts[i]))*w {
			return fmt.Errorf("sequence %d: no features of its %d verified rows", i, n+len(drafts[i]))
		}
		seqs[i].feats = slices.Clone(vout.Hidden[i][(n-1)*w : (n+a)*w])
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}
