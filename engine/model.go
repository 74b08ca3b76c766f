package engine

import (
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// Stepper is what FromModel adapts: a *model.Model, or a *model.Parallel
// (one model split over ranks).
type Stepper interface {
	Forward(*model.Batch) (*model.Output, error)
	FreeSequence(*kvcache.Sequence)
	Cache() *kvcache.Manager
	Config() *checkpoint.Config
}

// FromModel adapts a model to the engine's Model interface.
func FromModel(m Stepper) Model { return modelAdapter{m} }

type modelAdapter struct{ m Stepper }

func (a modelAdapter) Forward(items []ForwardItem) ([][]float32, error) {
	logits, _, err := a.ForwardDraw(items)
	return logits, err
}

// CanDraw implements DrawingModel.
func (a modelAdapter) CanDraw() bool {
	d, ok := a.m.(interface{ CanDraw() bool })
	return ok && d.CanDraw()
}

// ForwardDraw implements DrawingModel.
func (a modelAdapter) ForwardDraw(items []ForwardItem) ([][]float32, []int32, error) {
	b := &model.Batch{Items: make([]model.BatchItem, len(items))}
	for i, it := range items {
		b.Items[i] = model.BatchItem{Seq: it.Seq, Tokens: it.Tokens, AllLogits: it.AllLogits, Draw: it.Draw}
	}
	out, err := a.m.Forward(b)
	if err != nil {
		return nil, nil, err
	}
	return out.Logits, out.IDs, nil
}

func (a modelAdapter) FreeSequence(s *kvcache.Sequence) { a.m.FreeSequence(s) }
func (a modelAdapter) Cache() *kvcache.Manager          { return a.m.Cache() }
func (a modelAdapter) Vocab() int                       { return a.m.Config().Vocab }
