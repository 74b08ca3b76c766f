package engine

import (
	"errors"
	"fmt"

	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// Speculator is a Model that drafts with its MTP block or its DSpark
// drafter (speculative decoding): forward passes that also return every
// row's drafter input, the drafters, and the rewind of a sequence's cache
// after a verification.
type Speculator interface {
	Model
	// HasMTP reports whether the checkpoint has an MTP block.
	HasMTP() bool
	// ForwardHidden is Forward that also returns, per item, the drafter
	// input of every row (model.BatchItem.Hidden), flattened rows×HiddenDim.
	ForwardHidden(items []ForwardItem) (logits, hidden [][]float32, err error)
	// ForwardMTP runs the MTP block (model.Model.ForwardMTP): per item the
	// last row's logits and, with WantHidden, its output streams.
	ForwardMTP(items []model.MTPItem) (logits, hidden [][]float32, err error)
	HiddenDim() int
	// DSparkRows is the rows of the DSpark drafter's blocks (0: no DSpark).
	DSparkRows() int
	// ForwardDSpark runs the DSpark drafter (model.Model.ForwardDSpark):
	// per drafting item its block's base logits, DSparkRows rows.
	ForwardDSpark(items []model.DSparkItem) ([][]float32, error)
	// MarkovBias is the DSpark Markov head's bias after each token.
	MarkovBias(prev []int32) ([][]float32, error)
	// Drafts is the most drafts per step the model's cache has slack for
	// (model.Options.Drafts).
	Drafts() int
	// Rewind sets s back to n processed tokens (model.Model.Rewind).
	Rewind(s *kvcache.Sequence, n int) error
}

// speculative is the part of *model.Model behind Speculator.
type speculative interface {
	HasMTP() bool
	ForwardMTP(items []model.MTPItem) (*model.Output, error)
	DSparkRows() int
	ForwardDSpark(items []model.DSparkItem) (*model.Output, error)
	CanDrawDSpark() bool
	MarkovBias(prev []int32) ([][]float32, error)
	Drafts() int
	Rewind(s *kvcache.Sequence, n int) error
}

var errNoSpec = errors.New("this model cannot draft (tensor-parallel models do not speculate yet)")

func (a modelAdapter) spec() (speculative, error) {
	if sp, ok := a.m.(speculative); ok {
		return sp, nil
	}
	return nil, errNoSpec
}

// HasMTP implements Speculator.
func (a modelAdapter) HasMTP() bool {
	sp, err := a.spec()
	return err == nil && sp.HasMTP()
}

// HiddenDim implements Speculator.
func (a modelAdapter) HiddenDim() int {
	if c := a.m.Config(); c.HasDSpark() {
		return c.Dim * len(c.DSparkTargetLayers)
	}
	return a.m.Config().HcDim()
}

// DSparkRows implements Speculator.
func (a modelAdapter) DSparkRows() int {
	sp, err := a.spec()
	if err != nil {
		return 0
	}
	return sp.DSparkRows()
}

// ForwardDSpark implements Speculator.
func (a modelAdapter) ForwardDSpark(items []model.DSparkItem) ([][]float32, error) {
	logits, _, err := a.ForwardDSparkDraw(items)
	return logits, err
}

// ForwardDSparkDraw implements dsparkDrawer.
func (a modelAdapter) ForwardDSparkDraw(items []model.DSparkItem) ([][]float32, [][]int32, error) {
	sp, err := a.spec()
	if err != nil {
		return nil, nil, err
	}
	out, err := sp.ForwardDSpark(items)
	if err != nil {
		return nil, nil, err
	}
	if len(out.Logits) != len(items) || out.RowIDs != nil && len(out.RowIDs) != len(items) {
		return nil, nil, fmt.Errorf("engine: dspark returned %d logits and %d drawn rows for %d items", len(out.Logits), len(out.RowIDs), len(items))
	}
	return out.Logits, out.RowIDs, nil
}

// CanDrawDSpark implements dsparkDrawer.
func (a modelAdapter) CanDrawDSpark() bool {
	sp, err := a.spec()
	return err == nil && sp.CanDrawDSpark()
}

// MarkovBias implements Speculator.
func (a modelAdapter) MarkovBias(prev []int32) ([][]float32, error) {
	sp, err := a.spec()
	if err != nil {
		return nil, err
	}
	return sp.MarkovBias(prev)
}

// ForwardHidden implements Speculator.
func (a modelAdapter) ForwardHidden(items []ForwardItem) ([][]float32, [][]float32, error) {
	logits, hidden, _, err := a.ForwardVerify(items)
	return logits, hidden, err
}

// ForwardVerify implements rowDrawer.
func (a modelAdapter) ForwardVerify(items []ForwardItem) ([][]float32, [][]float32, [][]int32, error) {
	b := &model.Batch{Items: make([]model.BatchItem, len(items))}
	for i, it := range items {
		b.Items[i] = model.BatchItem{Seq: it.Seq, Tokens: it.Tokens, AllLogits: it.AllLogits, Hidden: true, DrawRows: it.DrawRows}
	}
	out, err := a.m.Forward(b)
	if err != nil {
		return nil, nil, nil, err
	}
	return out.Logits, out.Hidden, out.RowIDs, nil
}

// ForwardMTP implements Speculator.
func (a modelAdapter) ForwardMTP(items []model.MTPItem) ([][]float32, [][]float32, error) {
	logits, hidden, _, err := a.ForwardMTPDraw(items)
	return logits, hidden, err
}

// ForwardMTPDraw implements rowDrawer.
func (a modelAdapter) ForwardMTPDraw(items []model.MTPItem) ([][]float32, [][]float32, []int32, error) {
	sp, err := a.spec()
	if err != nil {
		return nil, nil, nil, err
	}
	out, err := sp.ForwardMTP(items)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(out.Logits) != len(items) || out.IDs != nil && len(out.IDs) != len(items) {
		return nil, nil, nil, fmt.Errorf("engine: mtp returned %d rows and %d ids for %d items", len(out.Logits), len(out.IDs), len(items))
	}
	return out.Logits, out.Hidden, out.IDs, nil
}

// Drafts implements Speculator.
func (a modelAdapter) Drafts() int {
	sp, err := a.spec()
	if err != nil {
		return 0
	}
	return sp.Drafts()
}

// Rewind implements Speculator.
func (a modelAdapter) Rewind(s *kvcache.Sequence, n int) error {
	sp, err := a.spec()
	if err != nil {
		return err
	}
	return sp.Rewind(s, n)
}
