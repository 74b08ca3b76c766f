package engine

import (
	"fmt"
	"math"
	"slices"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/grammar"
)

// Constraint restricts a request's output to a grammar (structured outputs):
// before each draw the tokens the grammar rejects are masked out, EOS is
// allowed only where the grammar can end, and the sequence finishes ("stop")
// once the grammar has accepted EOS. The mask goes with the draw where the
// model draws on its device (backend.Draw.Mask), else the host applies it.
type Constraint struct {
	Grammar *grammar.Grammar
	Table   *grammar.TokenTable // the tokenizer's table; its size must be the model's vocabulary
	// Deferred starts the grammar only after the token After has been
	// generated (the end of the thinking block); the tokens up to it are free.
	Deferred bool
	After    int32
	// Head turns on jump-forward: it tokenizes bytes the grammar forces
	// next into ids whose split no continuation changes (the tokenizer's
	// EncodeHead). Those tokens are appended without a draw and reach the
	// model as the next step's chunk; nil samples every token.
	Head func(forced []byte) []int32
}

// constraintState is one sequence's progress through its Constraint.
type constraintState struct {
	c      *Constraint
	m      *grammar.Matcher
	mask   []uint32
	active bool
}

func newConstraintState(c *Constraint, vocab int) (*constraintState, error) {
	if c.Grammar == nil || c.Table == nil {
		return nil, fmt.Errorf("constraint needs a grammar and a token table")
	}
	if c.Table.Size() != vocab {
		return nil, fmt.Errorf("constraint token table has %d tokens, the model %d", c.Table.Size(), vocab)
	}
	m, err := grammar.NewMatcher(c.Grammar, c.Table)
	if err != nil {
		return nil, fmt.Errorf("constraint: %w", err)
	}
	return &constraintState{c: c, m: m, mask: make([]uint32, c.Table.MaskWords()), active: !c.Deferred}, nil
}

// fill computes the mask of the next token; false when the constraint is not
// active yet (sample freely).
func (cs *constraintState) fill() (bool, error) {
	if cs == nil || !cs.active {
		return false, nil
	}
	if err := cs.m.FillMask(cs.mask); err != nil {
		return false, fmt.Errorf("grammar mask: %w", err)
	}
	return true, nil
}

// deviceDraw is seq's Sampler.DeviceDraw with its grammar's mask of the next
// token when the constraint is active; false where the host samples, also
// when the mask fails (the host's fill then reports the error).
func deviceDraw(seq *Sequence) (backend.Draw, bool) {
	d, ok := seq.Sampler.DeviceDraw()
	if !ok {
		return d, false
	}
	masked, err := seq.grammar.fill()
	if err != nil {
		return backend.Draw{}, false
	}
	if masked {
		d.Mask = seq.grammar.mask
	}
	return d, true
}

// accept advances over a generated token; terminated reports that the
// grammar has accepted its end.
func (cs *constraintState) accept(id int32) (terminated bool, err error) {
	if cs == nil {
		return false, nil
	}
	if !cs.active {
		cs.active = id == cs.c.After
		return false, nil
	}
	if err := cs.m.Accept(id); err != nil {
		return false, fmt.Errorf("grammar: %w", err)
	}
	return cs.m.IsTerminated(), nil
}

// forced returns the tokens jump-forward appends now, each accepted by the
// grammar: the head of its forced bytes (Constraint.Head), at most limit,
// stopping before a stop token or a token the grammar rejects. None when the
// forced bytes cannot be found (the next mask reports a broken grammar).
func (cs *constraintState) forced(limit int, stops []int32) []int32 {
	if cs == nil || !cs.active || cs.c.Head == nil || limit <= 0 || cs.m.IsTerminated() {
		return nil
	}
	b, err := cs.m.ForcedBytes()
	if err != nil || len(b) == 0 {
		return nil
	}
	var out []int32
	for _, id := range cs.c.Head(b) {
		if len(out) == limit || slices.Contains(stops, id) || cs.m.Accept(id) != nil {
			break
		}
		out = append(out, id)
	}
	return out
}

// jumpForward appends to seq the tokens its grammar forces (jump-forward),
// leaving room for a sampled token within max tokens and the context. A
// request with logprobs gets none (forced tokens have no logprobs).
func (s *Scheduler) jumpForward(seq *Sequence) []Token {
	if p := seq.Sampler.Params(); seq.grammar == nil || p.Logprobs || p.TopLogprobs > 0 {
		return nil
	}
	limit := min(seq.Req.MaxTokens-seq.Generated(), s.cfg.MaxModelLen-len(seq.Tokens)) - 1
	ids := seq.grammar.forced(limit, seq.Req.StopTokens)
	toks := make([]Token, len(ids))
	for i, id := range ids {
		seq.Tokens = append(seq.Tokens, id)
		seq.Sampler.Accept(id)
		toks[i] = Token{ID: id}
	}
	return toks
}

// applyMask sets the logits of the tokens mask disallows to −inf.
func applyMask(x []float32, mask []uint32) {
	inf := float32(math.Inf(-1))
	for w, bits := range mask {
		if bits == math.MaxUint32 {
			continue
		}
		base := w * 32
		for b := range 32 {
			if bits&(1<<b) == 0 && base+b < len(x) {
				x[base+b] = inf
			}
		}
	}
}
