package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// Decode steps with MTP drafts (--speculative-config): the engine's step
// (engine/spec.go) driven on the model directly. Each step brings the MTP
// block up to the sequence's tokens, chains the drafts, verifies them in one
// forward pass of k+1 rows per sequence (the last token and the drafts),
// accepts a prefix of them and rewinds the cache to the accepted rows.

// specSeq is one sequence's drafting state.
type specSeq struct {
	kv      *kvcache.Sequence
	toks    []int32         // prompt and generated tokens
	pending []int32         // tokens not yet in the cache (the last one; the prompt before prefill)
	mtpLen  int             // positions the drafter (MTP block, DSpark windows) has processed
	hidden  model.HiddenRef // MTP: the main model's final streams of positions mtpLen…, on the device
	feats   []float32       // DSpark: the captured features of positions mtpLen…, on the host
}

// freeHidden frees the distinct tensors the sequences' queued streams are in.
func freeHidden(m *model.Model, seqs []*specSeq) {
	seen := map[*model.Hidden]bool{}
	for _, s := range seqs {
		if h := s.hidden.H; h != nil && !seen[h] {
			seen[h] = true
			m.FreeHidden(h)
		}
		s.hidden = model.HiddenRef{}
	}
}

// specStackResult is what the timed steps with drafts did.
type specStackResult struct {
	steps []time.Duration
	// The parts of each step: the draft passes (MTP: catch-up and chained
	// drafts, with their draws; DSpark: dsparkDraft), the verifying forward
	// (with its draws) and the rest (rewinds, host work).
	mtp, verify, rest []time.Duration
	ds                []dsparkParts // DSpark: the draft pass's parts
	headMs            float64       // the head alone over a verification's rows (GPU; 0: not measured)
	emitted           int           // tokens emitted by the timed steps
	drafted           int
	accepted          int
	perPos            []int
	profile           string // the per-op breakdown of the timed steps (--profile)
}

// runSpecPlan prefills --batch fresh sequences of random tokens and runs
// --decode timed steps with drafts after one untimed step (the MTP block's
// first use). Drafts are the MTP block's argmax; a draft is accepted with
// probability --accept-rate regardless of the logits, or, without it, when
// it is the target row's argmax (greedy verification).
func runSpecPlan(m *model.Model, f *stackFlags, prof *timedBackend) (*specStackResult, error) {
	rng := rand.New(rand.NewPCG(f.seed, 0x73706563))
	seqs := make([]*specSeq, f.batch)
	for i := range seqs {
		seqs[i] = &specSeq{kv: m.Cache().NewSequence()}
		defer m.FreeSequence(seqs[i].kv)
	}
	defer freeHidden(m, seqs)
	prefill, run := specPrefill, specStep
	if f.dspark() {
		prefill, run = dsparkPrefill, dsparkStep
	}
	if err := prefill(m, f, seqs, rng); err != nil {
		return nil, err
	}
	k := f.spec.NumTokens
	r := &specStackResult{perPos: make([]int, k)}
	var wall time.Duration
	for step := range f.decode + 1 {
		if step == 1 && prof != nil {
			prof.reset()
		}
		t := time.Now()
		st, err := run(m, seqs, k, f.acceptRate, f.draw, rng)
		if err != nil {
			return nil, fmt.Errorf("speculative step %d: %w", step, err)
		}
		if step == 0 {
			continue
		}
		r.steps = append(r.steps, time.Since(t))
		wall += r.steps[len(r.steps)-1]
		r.mtp = append(r.mtp, st.mtp[0])
		r.verify = append(r.verify, st.verify[0])
		r.rest = append(r.rest, r.steps[len(r.steps)-1]-st.mtp[0]-st.verify[0])
		r.ds = append(r.ds, st.ds...)
		r.emitted += st.emitted
		r.drafted += st.drafted
		r.accepted += st.accepted
		for j, a := range st.perPos {
			r.perPos[j] += a
		}
	}
	if prof != nil && f.decode > 0 {
		var b strings.Builder
		prof.print(&b, fmt.Sprintf("speculative step (batch %d, k %d)", f.batch, k), f.decode, wall)
		r.profile = b.String()
	}
	return r, nil
}

// specPrefill prefills seqs with random prompts of --prefill tokens in steps
// of --prefill-seqs sequences, takes each one's next token (argmax) and runs
// the MTP block over the prompt.
func specPrefill(m *model.Model, f *stackFlags, seqs []*specSeq, rng *rand.Rand) error {
	c := m.Config()
	for i0 := 0; i0 < len(seqs); i0 += f.prefillSeqs {
		group := seqs[i0:min(i0+f.prefillSeqs, len(seqs))]
		b := &model.Batch{}
		for _, s := range group {
			s.toks = randTokens(rng, f.prefill, c.Vocab)
			b.Items = append(b.Items, model.BatchItem{Seq: s.kv, Tokens: s.toks, KeepHidden: true})
		}
		out, err := m.Forward(b)
		if err != nil {
			return fmt.Errorf("speculative prefill %d..%d: %w", i0, i0+len(group)-1, err)
		}
		var mi []model.MTPItem
		for j, s := range group {
			s.toks = append(s.toks, engine.Argmax(out.Last(j)))
			s.pending = s.toks[len(s.toks)-1:]
			s.hidden = model.HiddenRef{H: out.Kept, Row0: out.KeptRow[j], Rows: f.prefill}
			if f.prefill > 1 { // the MTP block catches up with the prompt now, untimed
				n := f.prefill - 1
				mi = append(mi, model.MTPItem{Seq: s.kv, In: model.HiddenRef{H: out.Kept, Row0: out.KeptRow[j], Rows: n}, Next: s.toks[1 : n+1]})
				s.mtpLen, s.hidden.Row0, s.hidden.Rows = n, s.hidden.Row0+n, 1
			}
		}
		if len(mi) > 0 {
			if _, err := m.ForwardMTP(mi); err != nil {
				return fmt.Errorf("speculative prefill %d..%d: mtp: %w", i0, i0+len(group)-1, err)
			}
		}
	}
	return nil
}

// specStep runs one draft+verify step over all sequences. The final streams
// stay on the device (the MTP block reads them there); with draw, the drafts
// and the verifying rows' greedy tokens are drawn on the device where the
// model can: only ids come back.
func specStep(m *model.Model, seqs []*specSeq, k int, acceptRate float64, draw bool, rng *rand.Rand) (*specStackResult, error) {
	c := m.Config()
	vocab := c.Vocab
	var greedy *backend.Draw
	if draw {
		greedy = &backend.Draw{}
	}
	// The MTP block catches up (its last row gives draft 1), then chains.
	st := &specStackResult{perPos: make([]int, k)}
	var tMTP time.Duration
	t0 := time.Now()
	mi := make([]model.MTPItem, len(seqs))
	for i, s := range seqs {
		n := s.hidden.Rows
		mi[i] = model.MTPItem{Seq: s.kv, Start: s.mtpLen, In: s.hidden, Next: s.toks[s.mtpLen+1 : s.mtpLen+n+1], KeepNext: true, Ahead: true, Draw: greedy}
		s.mtpLen += n
	}
	out, err := m.ForwardMTP(mi)
	tMTP += time.Since(t0)
	freeHidden(m, seqs)
	if err != nil {
		return nil, fmt.Errorf("mtp: %w", err)
	}
	defer func() { m.FreeHidden(out.Kept) }()
	drafts := make([][]int32, len(seqs))
	for i, s := range seqs {
		if err := m.Cache().Reserve(s.kv, s.kv.Len()+len(s.pending)+k); err != nil {
			return nil, err
		}
		drafts[i] = []int32{token(out, i, -1, vocab)}
	}
	for d := 1; d < k; d++ {
		for i, s := range seqs {
			mi[i] = model.MTPItem{Seq: s.kv, Start: len(s.toks) - 1 + d - 1, In: model.HiddenRef{H: out.Kept, Row0: out.KeptRow[i], Rows: 1},
				Next: drafts[i][d-1 : d], KeepNext: true, Draft: true, Draw: greedy}
		}
		t0 := time.Now()
		next, err := m.ForwardMTP(mi)
		tMTP += time.Since(t0)
		m.FreeHidden(out.Kept)
		if out = next; err != nil {
			return nil, fmt.Errorf("mtp draft %d: %w", d+1, err)
		}
		for i := range seqs {
			drafts[i] = append(drafts[i], token(out, i, -1, vocab))
		}
	}
	st.mtp = []time.Duration{tMTP}
	// One forward pass verifies every sequence's drafts; the MTP block
	// reads the verified rows' final streams from the device.
	err = verifyDrafts(m, seqs, drafts, acceptRate, draw, true, rng, st, func(i, n, a int, vout *model.Output) error {
		// The MTP block has seen positions before start+n-1; rows n-1… up
		// to the last accepted draft are right.
		seqs[i].hidden = model.HiddenRef{H: vout.Kept, Row0: vout.KeptRow[i] + n - 1, Rows: a + 1}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// verifyDrafts verifies every sequence's drafts in one forward pass of its
// pending tokens and drafts, accepts a prefix of them (with probability
// acceptRate each regardless of the logits, or greedily when acceptRate <
// 0), rewinds the cache to the accepted rows and adds the counts and
// the forward's time to st. verified(i, n, a, out) is called for sequence
// i, of n pending tokens and a accepted drafts, before its tokens are
// updated: the verification's rows n-1 … n-1+a are the ones the drafter
// must see next (in out.Kept with keep, else in out.Hidden).
func verifyDrafts(m *model.Model, seqs []*specSeq, drafts [][]int32, acceptRate float64, draw, keep bool, rng *rand.Rand,
	st *specStackResult, verified func(i, n, a int, out *model.Output) error) error {
	vocab := m.Config().Vocab
	b := &model.Batch{Items: make([]model.BatchItem, len(seqs))}
	for i, s := range seqs {
		b.Items[i] = model.BatchItem{Seq: s.kv, Tokens: append(slices.Clone(s.pending), drafts[i]...), AllLogits: !draw, DrawRows: draw,
			Hidden: !keep, KeepHidden: keep}
	}
	t0 := time.Now()
	vout, err := m.Forward(b)
	st.verify = []time.Duration{time.Since(t0)}
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	shrink := make([]int, len(seqs))
	for i, s := range seqs {
		n, k := len(s.pending), len(drafts[i])
		if vout.RowIDs == nil && len(vout.Logits[i]) != (n+k)*vocab {
			return fmt.Errorf("sequence %d: %d logits for %d rows", i, len(vout.Logits[i]), n+k)
		}
		a := 0
		for ; a < k; a++ {
			ok := acceptRate >= 0 && rng.Float64() < acceptRate
			if acceptRate < 0 {
				ok = token(vout, i, n-1+a, vocab) == drafts[i][a]
			}
			if !ok {
				break
			}
			st.perPos[a]++
		}
		bonus := token(vout, i, n-1+a, vocab)
		start := s.kv.Len() - n - k
		// Rollback rewinds the length, as the engine: the rejected rows'
		// writes are never read (backend.KVSpec.Slack).
		if err := m.Rewind(s.kv, start+n+a); err != nil {
			return err
		}
		shrink[i] = start + n + a + 1
		if err := verified(i, n, a, vout); err != nil {
			return err
		}
		s.toks = append(append(s.toks, drafts[i][:a]...), bonus)
		s.pending = slices.Clone(s.toks[len(s.toks)-1:])
		st.emitted += a + 1
		st.drafted += k
		st.accepted += a
	}
	for i, s := range seqs {
		m.Cache().Shrink(s.kv, shrink[i])
	}
	return nil
}

// token is item i's greedy token of row r (-1: its only row): drawn on the
// device, or the argmax of its logits.
func token(out *model.Output, i, r, vocab int) int32 {
	switch {
	case r < 0 && out.IDs != nil && out.IDs[i] >= 0:
		return out.IDs[i]
	case r < 0:
		return engine.Argmax(out.Logits[i])
	case out.RowIDs != nil:
		return out.RowIDs[i][r]
	}
	return engine.Argmax(out.Logits[i][r*vocab : (r+1)*vocab])
}

func (r *specStackResult) print(out io.Writer, f *stackFlags, plain *stackResult) {
	if len(r.steps) == 0 {
		fmt.Fprintln(out, "speculative: 0 steps")
		return
	}
	how := "greedy verification against the target's argmax"
	if f.acceptRate >= 0 {
		how = fmt.Sprintf("forced acceptance: each draft accepted with probability %.2f regardless of the logits (--accept-rate)", f.acceptRate)
	}
	var total time.Duration
	for _, d := range r.steps {
		total += d
	}
	s := slices.Clone(r.steps)
	slices.Sort(s)
	tps := float64(r.emitted) / max(total.Seconds(), 1e-9)
	fmt.Fprintf(out, "speculative %s N=%d (%s)\n", f.spec.Method, f.spec.NumTokens, how)
	per := make([]string, len(r.perPos))
	for j, a := range r.perPos {
		per[j] = fmt.Sprintf("%.3f", float64(a)/float64(len(s)*f.batch))
	}
	fmt.Fprintf(out, "draft+verify %d steps × batch %d in %v: %.1f tok/s  step median %.2f ms  min %.2f ms  max %.2f ms  mean acceptance length %.3f  per position %v\n",
		len(s), f.batch, total.Round(time.Millisecond), tps, ms(s[len(s)/2]), ms(s[0]), ms(s[len(s)-1]),
		float64(r.emitted)/float64(len(s)*f.batch), per)
	var plainTotal time.Duration
	for _, d := range plain.steps {
		plainTotal += d
	}
	if len(plain.steps) > 0 && plainTotal > 0 {
		ptps := float64(len(plain.steps)*f.batch) / plainTotal.Seconds()
		fmt.Fprintf(out, "speculative vs plain decoding: %.1f / %.1f tok/s = %.2fx\n", tps, ptps, tps/ptps)
	}
}
