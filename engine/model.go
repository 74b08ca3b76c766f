package engine

import (
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// FromModel adapts a *model.Model to the engine's Model interface.
func FromModel(m *model.Model) Model { return modelAdapter{m} }

type modelAdapter struct{ m *model.Model }

func (a modelAdapter) Forward(items []ForwardItem) ([][]float32, error) {
	b := &model.Batch{Items: make([]model.BatchItem, len(items))}
	for i, it := range items {
		b.Items[i] = model.BatchItem{Seq: it.Seq, Tokens: it.Tokens, AllLogits: it.AllLogits}
	}
	out, err := a.m.Forward(b)
	if err != nil {
		return nil, err
	}
	return out.Logits, nil
}

func (a modelAdapter) FreeSequence(s *kvcache.Sequence) { a.m.FreeSequence(s) }
func (a modelAdapter) Cache() *kvcache.Manager          { return a.m.Cache() }
func (a modelAdapter) Vocab() int                       { return a.m.Config().Vocab }
