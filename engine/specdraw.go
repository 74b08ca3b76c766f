package engine

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/model"
)

// Greedy drafts and verifications on the device (Config.DeviceSampling): a
// greedy sequence's drafts and verifying rows come back as their argmax
// tokens, the rule of the host's greedy sample, instead of logits rows.

// rowDrawer is a Speculator that draws greedy drafts and every row's greedy
// token of a verification on its device (model.MTPItem.Draw,
// model.BatchItem.DrawRows).
type rowDrawer interface {
	CanDraw() bool
	// ForwardVerify is ForwardHidden that also returns, per item with
	// DrawRows, every row's greedy token (and then no logits), or nil rows
	// where the model drew none.
	ForwardVerify(items []ForwardItem) (logits, hidden [][]float32, rows [][]int32, err error)
	// ForwardMTPDraw is ForwardMTP that also returns, per item with Draw,
	// its drawn token (and then no logits; -1 for the others, nil where
	// none was drawn).
	ForwardMTPDraw(items []model.MTPItem) (logits, hidden [][]float32, ids []int32, err error)
}

// newRowDrawer returns m's rowDrawer when the engine samples on the device
// and m can, else nil.
func newRowDrawer(m Speculator, cfg Config) rowDrawer {
	if d, ok := m.(rowDrawer); ok && cfg.DeviceSampling && d.CanDraw() {
		return d
	}
	return nil
}

// drawsRows reports whether seq's verification can take device-drawn
// tokens: greedy, with nothing the host applies to the logits (penalties,
// bias, logprobs, min_tokens, a grammar).
func drawsRows(seq *Sequence) bool {
	d, ok := seq.Sampler.DeviceDraw()
	return ok && d.Temp == 0 && seq.grammar == nil
}

// mtpDraw is the draw of seq's drafts: greedy on the device, or nil (the
// host drafts from the logits; a sampled draft also needs its distribution).
func (sp *speculator) mtpDraw(seq *Sequence) *backend.Draw {
	if sp.drawer == nil || seq.Sampler.p.Temperature != 0 {
		return nil
	}
	return &backend.Draw{}
}

// mtp runs the MTP block; ids is nil unless the model drew some drafts.
// With a streamKeeper the items' KeepNext streams stay on the device.
func (sp *speculator) mtp(items []model.MTPItem) (o mtpOut, err error) {
	switch {
	case sp.keep != nil:
		return sp.keep.ForwardMTPKept(items)
	case sp.drawer != nil:
		o.logits, o.hidden, o.ids, err = sp.drawer.ForwardMTPDraw(items)
	default:
		o.logits, o.hidden, err = sp.m.ForwardMTP(items)
	}
	return o, err
}

// addDrawn adds the draft drawn on the device (ids[j]), else drafts from
// the logits (add).
func (p *proposal) addDrawn(s *Sampler, logits []float32, ids []int32, j int) {
	if ids != nil && ids[j] >= 0 {
		p.tokens = append(p.tokens, ids[j])
		return
	}
	p.add(s, logits)
}

// forward runs the verifying pass; rows is nil unless the model drew some.
// With a streamKeeper the rows' streams stay on the device.
func (sp *speculator) forward(fwd []ForwardItem) (o verifyOut, err error) {
	switch {
	case sp.keep != nil:
		return sp.keep.ForwardKept(fwd)
	case sp.drawer != nil:
		o.logits, o.hidden, o.rows, err = sp.drawer.ForwardVerify(fwd)
	default:
		o.logits, o.hidden, err = sp.m.ForwardHidden(fwd)
	}
	return o, err
}

// verifyDrawn is verify for a greedy sequence whose rows' tokens were drawn
// on the device: ids[j] is the token after the j-th input from the last
// kept row on.
func (sp *speculator) verifyDrawn(seq *Sequence, ids []int32, vocab int, p *proposal) (specResult, error) {
	var out specResult
	for j := 0; j <= len(p.tokens); j++ {
		if ids[j] < 0 || int(ids[j]) >= vocab {
			return out, fmt.Errorf("engine: sequence %d: drawn token %d outside the vocabulary", seq.ID, ids[j])
		}
		tok := Sampled{ID: ids[j]}
		accepted := j < len(p.tokens) && tok.ID == p.tokens[j]
		if stop, err := out.take(seq, tok, accepted, sp.maxLen); stop || err != nil {
			return out, err
		}
	}
	return out, nil
}

// dsparkDrawer is a Speculator that draws greedy DSpark drafts on its
// device (model.DSparkItem.Draw): only the drafts' ids come back.
type dsparkDrawer interface {
	CanDrawDSpark() bool
	// ForwardDSparkDraw is ForwardDSpark that also returns, per item with
	// Draw, its drafts drawn on the device (and then no logits), or nil
	// rows where the model drew none.
	ForwardDSparkDraw(items []model.DSparkItem) (logits [][]float32, ids [][]int32, err error)
}

// dsparkDraw returns the model's dsparkDrawer when MTP drafts would be drawn
// on the device (the engine samples there), else nil.
func (sp *speculator) dsparkDraw() dsparkDrawer {
	if d, ok := sp.m.(dsparkDrawer); ok && sp.drawer != nil && d.CanDrawDSpark() {
		return d
	}
	return nil
}
