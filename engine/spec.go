package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/megamoe/megamoe/model"
	"golang.org/x/sync/errgroup"
)

// MaxSpeculativeTokens bounds num_speculative_tokens.
const MaxSpeculativeTokens = 8

// SpecConfig turns on speculative decoding (vLLM's --speculative-config):
// each decode step verifies NumTokens drafts in the same forward pass.
type SpecConfig struct {
	Method string `json:"method"` // "mtp" or "dspark"
	// NumTokens is the drafts per step: 1–8 for MTP; for DSpark at most
	// dspark_block_size, 0 meaning dspark_block_size.
	NumTokens int `json:"num_speculative_tokens"`
}

// Enabled reports whether drafts are on.
func (c SpecConfig) Enabled() bool { return c.NumTokens > 0 || c.Method == "dspark" }

// ParseSpecConfig reads vLLM's JSON, e.g. {"method":"mtp","num_speculative_tokens":2}.
// Unknown fields are errors that name them.
func ParseSpecConfig(s string) (SpecConfig, error) {
	var c SpecConfig
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return SpecConfig{}, fmt.Errorf("speculative config: %w", err)
	}
	if dec.More() {
		return SpecConfig{}, fmt.Errorf("speculative config: trailing data after the JSON object")
	}
	return c, c.Validate()
}

// WithNumTokens folds the --num-speculative-tokens flag n into c: method
// mtp when c is off, the count of a DSpark config without one, a
// contradiction is an error; 0 leaves c unchanged.
func (c *SpecConfig) WithNumTokens(n int) error {
	if n == 0 {
		return nil
	}
	if c.Method == "dspark" && c.NumTokens == 0 {
		c.NumTokens = n
	}
	if c.Enabled() && c.NumTokens != n {
		return fmt.Errorf("--num-speculative-tokens %d contradicts --speculative-config's %d", n, c.NumTokens)
	}
	if !c.Enabled() {
		*c = SpecConfig{Method: "mtp", NumTokens: n}
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("--num-speculative-tokens: %w", err)
	}
	return nil
}

// DSparkRows is model.Options.DSparkRows for c: the DSpark block rows its
// drafts need (0: the checkpoint's dspark_block_size).
func (c SpecConfig) DSparkRows() int {
	if c.Method == "dspark" {
		return c.NumTokens
	}
	return 0
}

// Drafts is model.Options.Drafts for c: the most drafts a step verifies
// (0 without drafts, -1 for DSpark's dspark_block_size).
func (c SpecConfig) Drafts() int {
	switch {
	case !c.Enabled():
		return 0
	case c.Method == "dspark" && c.NumTokens == 0:
		return -1
	}
	return c.NumTokens
}

// Validate checks the method and the draft count.
func (c SpecConfig) Validate() error {
	switch c.Method {
	case "mtp", "deepseek_mtp":
	case "dspark":
		if c.NumTokens < 0 || c.NumTokens > MaxDSparkTokens {
			return fmt.Errorf("speculative config: num_speculative_tokens %d out of [1, dspark_block_size] (at most %d; 0 or absent: dspark_block_size)", c.NumTokens, MaxDSparkTokens)
		}
		return nil
	default:
		return fmt.Errorf("speculative config: method %q unsupported, want \"mtp\" or \"dspark\"", c.Method)
	}
	if c.NumTokens < 1 || c.NumTokens > MaxSpeculativeTokens {
		return fmt.Errorf("speculative config: num_speculative_tokens %d out of [1, %d]", c.NumTokens, MaxSpeculativeTokens)
	}
	return nil
}

// SpecStats counts drafts since start (vLLM's spec_decode metrics).
type SpecStats struct {
	Steps    int64   // verifications (sequence-steps with drafts)
	Drafted  int64   // draft tokens proposed
	Accepted int64   // draft tokens accepted
	Emitted  int64   // tokens emitted by verifications (accepted + one each)
	PerPos   []int64 // accepted drafts per draft position
}

// MeanAcceptance is the mean acceptance length: tokens emitted per
// verification (1 + accepted drafts).
func (s SpecStats) MeanAcceptance() float64 {
	if s.Steps == 0 {
		return 0
	}
	return float64(s.Emitted) / float64(s.Steps)
}

// specState is one sequence's drafting state: the drafter (the MTP block,
// DSpark's windows) has processed positions [0, mtpLen), and hidden holds
// the main model's drafter inputs of positions mtpLen… that it has not seen
// yet. Those run ahead of the cache after a rejection: the accepted drafts'
// rows were computed, then rolled back to be fed again (replayed) in the
// next step.
type specState struct {
	kv     any // the cache handle the state belongs to (a preempted sequence gets a new one)
	mtpLen int
	hidden []float32
	dev    model.HiddenRef // the rows after hidden's, on the device (streamKeeper)
}

// proposal is one sequence's drafts of a step and their proposal
// distributions (nil for greedy requests).
type proposal struct {
	tokens []int32
	q      [][]float64
}

// specResult is a verification's outcome: the tokens it emits (already
// accepted into the sampler and the grammar), ended when the grammar
// accepted its end.
type specResult struct {
	tokens   []Sampled
	accepted int // drafts among tokens
	ended    bool
	kept     int // draft rows the cache keeps (the accepted ones)
}

// drafter proposes a step's drafts: mtpDrafter or dsparkDrafter
// (specdspark.go).
type drafter interface {
	// propose brings the drafter up to each item's processed tokens (the
	// hidden states queued in its specState) and drafts for the decoding
	// items that can take drafts.
	propose(sp *speculator, items []Item) ([]*proposal, error)
}

// mtpDrafter drafts with the MTP block.
type mtpDrafter struct{}

// speculator drafts and verifies for a Runner.
type speculator struct {
	m       Speculator
	d       drafter
	k       int
	maxLen  int
	budget  int // rows per step (drafts included)
	stats   SpecStats
	log     *slog.Logger
	logged  time.Time
	prevLog SpecStats
	drawer  rowDrawer     // nil: verifications download logits rows
	keep    streamKeeper  // nil: the drafter's input streams go through the host
	kept    *model.Hidden // the last verification's streams, which users' rows name
	users   []*specState
}

// specLogEvery is the interval of the acceptance log line.
const specLogEvery = 10 * time.Second

func newSpeculator(m Model, c SpecConfig, cfg Config) (_ *speculator, err error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	sm, ok := m.(Speculator)
	if !ok {
		return nil, fmt.Errorf("speculative decoding: %w", errNoSpec)
	}
	var d drafter = mtpDrafter{}
	k := c.NumTokens
	if c.Method == "dspark" {
		if d, k, err = newDSparkDrafter(sm, c); err != nil {
			return nil, err
		}
	} else if !sm.HasMTP() {
		return nil, fmt.Errorf("speculative config: method %q: the checkpoint has no MTP block (num_nextn_predict_layers = 0%s)", c.Method, dsparkHint(sm))
	}
	if n := sm.Drafts(); k > n {
		return nil, fmt.Errorf("speculative config: num_speculative_tokens %d: the model's cache has slack for %d drafts a step (model.Options.Drafts)", k, n)
	}
	return &speculator{m: sm, d: d, k: k, maxLen: cfg.MaxModelLen, budget: cfg.MaxBatchTokens, log: cfg.Logger,
		logged: time.Now(), stats: SpecStats{PerPos: make([]int64, k)}, prevLog: SpecStats{PerPos: make([]int64, k)},
		keep: newStreamKeeper(sm)}, nil
}

// state returns seq's drafting state, reset when its cache was replaced.
func (sp *speculator) state(seq *Sequence) *specState {
	if seq.spec == nil || seq.spec.kv != any(seq.KV) {
		// A prefix cache hit starts the MTP block at the hit: its state
		// came with the snapshot (drafts are verified either way).
		seq.spec = &specState{kv: seq.KV, mtpLen: seq.Computed}
	}
	return seq.spec
}

// drafts is how many drafts seq may take this step (0: none): the item must
// end at the last known token.
func (sp *speculator) drafts(it *Item) int {
	seq := it.Seq
	if !it.Sample || it.AllLogits {
		return 0
	}
	return max(0, min(sp.k, seq.Req.MaxTokens-seq.Generated()-1, sp.maxLen-len(seq.Tokens)-1))
}

// propose brings the MTP block up to each sequence's processed tokens and
// chains drafts for the decoding ones. The chain writes the MTP block's
// rolling state at positions past the ones it caught up on; the next
// catch-up rewrites them (backend.KVSpec.Slack).
func (mtpDrafter) propose(sp *speculator, items []Item) (_ []*proposal, err error) {
	w := sp.m.HiddenDim()
	props := make([]*proposal, len(items))
	who, err := sp.queued(items, "mtp")
	if err != nil || len(who) == 0 {
		return props, err
	}
	mi := make([]model.MTPItem, len(who))
	for j, i := range who {
		seq := items[i].Seq
		st := seq.spec
		n := st.pending(w)
		if st.dev.H != nil && len(st.hidden) > 0 { // rows of two steps: one input
			if err := sp.toHost(st); err != nil {
				return nil, err
			}
		}
		mi[j] = model.MTPItem{Seq: seq.KV, Start: st.mtpLen, Hidden: st.hidden, In: st.dev,
			Next: seq.Tokens[st.mtpLen+1 : st.mtpLen+n+1], WantHidden: sp.keep == nil, KeepNext: sp.keep != nil, Ahead: true, Draw: sp.mtpDraw(seq)}
	}
	out, err := sp.mtp(mi)
	if err != nil {
		return nil, err
	}
	// The chain's inputs are the previous pass's kept streams: each pass's
	// are freed once the next pass has read them.
	defer func() {
		if sp.keep != nil {
			sp.keep.FreeHidden(out.kept)
		}
	}()
	// Chains: the decoding sequences that can hold their drafts, within the
	// step's row budget.
	spare := sp.spare(items)
	type chain struct {
		i, k, j int // item, drafts, row in the last pass
	}
	var chains []chain
	for j, i := range who {
		it := &items[i]
		st := it.Seq.spec
		st.mtpLen += st.pending(w)
		st.hidden, st.dev = st.hidden[:0], model.HiddenRef{}
		k := min(sp.drafts(it), spare)
		if k <= 0 || st.mtpLen != len(it.Seq.Tokens)-1 || sp.m.Cache().Reserve(it.Seq.KV, it.Seq.Computed+it.N+k) != nil {
			continue // no drafts this step (no room): plain decoding
		}
		spare -= k
		chains = append(chains, chain{i: i, k: k, j: j})
	}
	for _, ch := range chains {
		props[ch.i] = &proposal{}
		props[ch.i].addDrawn(items[ch.i].Seq.Sampler, out.logits[ch.j], out.ids, ch.j)
	}
	for d := 1; ; d++ {
		mi, who = mi[:0], who[:0]
		for c := range chains {
			ch := &chains[c]
			if ch.k <= d {
				continue
			}
			it := &items[ch.i]
			p := props[ch.i]
			h, in := out.next(ch.j)
			mi = append(mi, model.MTPItem{Seq: it.Seq.KV, Start: len(it.Seq.Tokens) - 1 + d - 1, Hidden: h, In: in,
				Next: p.tokens[d-1 : d], WantHidden: sp.keep == nil, KeepNext: sp.keep != nil, Draft: true, Draw: sp.mtpDraw(it.Seq)})
			who = append(who, c)
		}
		if len(mi) == 0 {
			return props, nil
		}
		next, err := sp.mtp(mi)
		if sp.keep != nil {
			sp.keep.FreeHidden(out.kept)
		}
		out = next
		if err != nil {
			return nil, err
		}
		for j, c := range who {
			chains[c].j = j
			props[chains[c].i].addDrawn(items[chains[c].i].Seq.Sampler, out.logits[j], out.ids, j)
		}
	}
}

// add drafts one token from the MTP logits: greedy requests its argmax,
// sampled ones a draw from the proposal distribution, which is kept.
func (p *proposal) add(s *Sampler, logits []float32) {
	if s.p.Temperature == 0 {
		p.tokens = append(p.tokens, Argmax(logits))
		return
	}
	q := s.draftDist(logits)
	p.tokens = append(p.tokens, s.drawFrom(q))
	p.q = append(p.q, q)
}

// verify walks seq's drafts over the target rows (row j scores the token
// after the j-th input): it emits accepted drafts, then one token drawn
// from the target (the bonus after all drafts, else the correction), and
// stops early after a token that ends the sequence.
func (sp *speculator) verify(seq *Sequence, rows []float32, vocab int, p *proposal) (specResult, error) {
	var out specResult
	s := seq.Sampler
	for j := 0; j <= len(p.tokens); j++ {
		row := rows[j*vocab : (j+1)*vocab]
		masked, err := seq.grammar.fill()
		if err != nil {
			return out, err
		}
		var mask []uint32
		if masked {
			mask = seq.grammar.mask
		}
		var tok Sampled
		accepted := false
		switch {
		case j == len(p.tokens):
			tok = s.SampleMasked(row, mask)
		case s.p.Temperature == 0:
			tok = s.SampleMasked(row, mask) // no randomness: the greedy token
			accepted = tok.ID == p.tokens[j]
		default:
			var id int32
			id, accepted = s.acceptDraft(p.tokens[j], s.targetDist(row, mask), p.q[j])
			tok = s.withLogprobs(row, id)
		}
		if stop, err := out.take(seq, tok, accepted, sp.maxLen); stop || err != nil {
			return out, err
		}
	}
	return out, nil
}

// take appends tok to the walk over seq's drafts (accepted: it was the
// draft) and reports whether the walk stops there: after a rejection, or a
// token that ends the sequence.
func (out *specResult) take(seq *Sequence, tok Sampled, accepted bool, maxLen int) (bool, error) {
	out.tokens = append(out.tokens, tok)
	seq.Sampler.Accept(tok.ID)
	var err error
	if out.ended, err = seq.grammar.accept(tok.ID); err != nil {
		return true, err
	}
	if accepted {
		out.accepted++
	}
	n := len(out.tokens)
	return !accepted || out.ended || slices.Contains(seq.Req.StopTokens, tok.ID) ||
		seq.Generated()+n >= seq.Req.MaxTokens || len(seq.Tokens)+n >= maxLen, nil
}

// run is Runner.Run with drafts: one forward pass verifies every decoding
// sequence's drafts beside the other items, then the cache of each
// verified sequence is brought back to its emitted tokens.
func (sp *speculator) run(items []Item) (_ []Result, err error) {
	props, err := sp.d.propose(sp, items)
	if err != nil {
		return nil, err
	}
	fwd := make([]ForwardItem, len(items))
	for i := range items {
		it := &items[i]
		fwd[i] = ForwardItem{Seq: it.Seq.KV, Tokens: it.Tokens(), AllLogits: it.AllLogits}
		if p := props[i]; p != nil {
			fwd[i].Tokens = append(slices.Clip(fwd[i].Tokens), p.tokens...)
			fwd[i].AllLogits = true
			if sp.drawer != nil && drawsRows(it.Seq) {
				fwd[i].AllLogits, fwd[i].DrawRows = false, true
			}
		}
	}
	vo, err := sp.forward(fwd)
	if err != nil {
		return nil, err
	}
	defer func() { // kept streams no state took
		if err != nil && vo.kept != nil && vo.kept != sp.kept {
			sp.keep.FreeHidden(vo.kept)
		}
	}()
	logits, hidden, drawn := vo.logits, vo.hidden, vo.rows
	vocab, w := sp.m.Vocab(), sp.m.HiddenDim()
	if len(logits) != len(items) || vo.kept == nil && len(hidden) != len(items) {
		return nil, fmt.Errorf("engine: model returned %d logits and %d hidden for %d items", len(logits), len(hidden), len(items))
	}
	res := make([]Result, len(items))
	spec := make([]specResult, len(items))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i := range items {
		it := &items[i]
		rows := fwd[i].AllLogits || fwd[i].DrawRows
		want := vocab
		if rows {
			want = len(fwd[i].Tokens) * vocab
		}
		byID := drawn != nil && drawn[i] != nil
		if byID && len(drawn[i]) != len(fwd[i].Tokens) {
			return nil, fmt.Errorf("engine: item %d: %d drawn tokens for %d rows", i, len(drawn[i]), len(fwd[i].Tokens))
		}
		if !byID && len(logits[i]) != want || vo.kept == nil && len(hidden[i]) != len(fwd[i].Tokens)*w {
			return nil, fmt.Errorf("engine: item %d: %d logits and %d hidden values for %d tokens", i, len(logits[i]), len(hidden), len(fwd[i].Tokens))
		}
		g.Go(func() error {
			if props[i] == nil {
				if it.Sample || it.AllLogits {
					sampleHost(it, logits[i], vocab, true, &res[i])
				}
				return nil
			}
			var err error
			if byID {
				spec[i], err = sp.verifyDrawn(it.Seq, drawn[i][it.N-1:], vocab, props[i])
			} else {
				spec[i], err = sp.verify(it.Seq, logits[i][(it.N-1)*vocab:], vocab, props[i])
			}
			if err != nil {
				res[i].Err = err
			}
			return nil
		})
	}
	_ = g.Wait() // the workers return no errors
	var users []*specState
	for i := range items {
		it := &items[i]
		st := sp.state(it.Seq)
		seen := st.mtpLen + st.pending(w) // positions whose hidden state the MTP has or had
		p := props[i]
		valid := it.N // rows whose hidden state is right
		if p != nil {
			r := &spec[i]
			valid += r.accepted
			if res[i].Err == nil {
				res[i].Sampled = r.tokens[0]
				res[i].spec = r
				sp.stats.Steps++
				sp.stats.Drafted += int64(len(p.tokens))
				sp.stats.Accepted += int64(r.accepted)
				sp.stats.Emitted += int64(len(r.tokens))
				for j := range r.accepted {
					sp.stats.PerPos[j]++
				}
			}
			// Rollback is rewinding the length: the rows of rejected drafts
			// stay in the rolling states and blocks, never read and
			// overwritten when the sequence gets there (backend.KVSpec.Slack).
			r.kept = r.accepted
			if err := sp.m.Rewind(it.Seq.KV, it.Seq.Computed+it.N+r.accepted); err != nil {
				return nil, err
			}
		}
		if seen < it.Seq.Computed { // a prefix cache hit: the drafter's positions start after it
			st.mtpLen, st.hidden, st.dev, seen = it.Seq.Computed, st.hidden[:0], model.HiddenRef{}, it.Seq.Computed
		}
		if from := max(seen-it.Seq.Computed, 0); from < valid {
			if err := sp.queue(st, &vo, i, from, valid); err != nil {
				return nil, err
			}
		}
		if vo.kept != nil && st.dev.H == vo.kept {
			users = append(users, st)
		}
	}
	if vo.kept != nil {
		if err := sp.retain(vo.kept, users); err != nil {
			return nil, err
		}
	}
	for i := range items { // blocks reserved for rejected positions go back
		if props[i] != nil {
			sp.m.Cache().Shrink(items[i].Seq.KV, items[i].Seq.Computed+items[i].N+spec[i].kept+1)
		}
	}
	sp.report()
	return res, nil
}

// report logs the acceptance since the last line every specLogEvery.
func (sp *speculator) report() {
	if sp.log == nil || time.Since(sp.logged) < specLogEvery {
		return
	}
	s, p := sp.stats, sp.prevLog
	steps, drafted, accepted := s.Steps-p.Steps, s.Drafted-p.Drafted, s.Accepted-p.Accepted
	if steps == 0 {
		return
	}
	rates := make([]string, len(s.PerPos))
	for j := range s.PerPos {
		rates[j] = strconv.FormatFloat(float64(s.PerPos[j]-p.PerPos[j])/float64(steps), 'f', 2, 64)
	}
	sp.log.Info("speculative decoding", "verifications", steps, "drafted", drafted, "accepted", accepted,
		"acceptance_rate", float64(accepted)/float64(max(drafted, 1)),
		"mean_acceptance_length", float64(s.Emitted-p.Emitted)/float64(steps),
		"per_position", strings.Join(rates, ","))
	sp.logged, sp.prevLog = time.Now(), s
	sp.prevLog.PerPos = slices.Clone(s.PerPos)
}

// postSpec records a verification's tokens (Postprocess's share for a
// sequence with drafts): they were accepted by the sampler and the grammar
// during verification; the cache holds the item's tokens and the kept drafts.
func (s *Scheduler) postSpec(seq *Sequence, r *specResult, ev Event) {
	seq.Computed += r.kept
	for _, tok := range r.tokens {
		seq.Tokens = append(seq.Tokens, tok.ID)
		ev.Tokens = append(ev.Tokens, Token{ID: tok.ID, Logprob: tok.Logprob, Top: tok.Top})
	}
	last := r.tokens[len(r.tokens)-1].ID
	switch {
	case r.ended || slices.Contains(seq.Req.StopTokens, last):
		ev.Finish = FinishStop
	case seq.Generated() >= seq.Req.MaxTokens || len(seq.Tokens) >= s.cfg.MaxModelLen:
		ev.Finish = FinishLength
	default:
		ev.Tokens = append(ev.Tokens, s.jumpForward(seq)...) // grammar-forced tokens
	}
	if ev.Finish != FinishNone {
		s.retire(seq)
	}
	seq.stream.push(ev)
}

// queued lists the items whose drafter has verified rows to catch up on
// (their final streams queued in the drafting state), checking that the
// drafter stays behind the sequence's tokens.
func (sp *speculator) queued(items []Item, what string) ([]int, error) {
	w := sp.m.HiddenDim()
	var who []int
	for i := range items {
		it := &items[i]
		st := sp.state(it.Seq)
		n := st.pending(w)
		if n == 0 {
			continue
		}
		if st.mtpLen+n >= len(it.Seq.Tokens) {
			return nil, fmt.Errorf("engine: sequence %d: %s at %d+%d of %d tokens", it.Seq.ID, what, st.mtpLen, n, len(it.Seq.Tokens))
		}
		who = append(who, i)
	}
	return who, nil
}

// spare is the step's row budget left after the items' own rows.
func (sp *speculator) spare(items []Item) int {
	n := sp.budget
	for i := range items {
		n -= items[i].N
	}
	return n
}
