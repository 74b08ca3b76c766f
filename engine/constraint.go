package engine

import (
	"fmt"
	"math"

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
