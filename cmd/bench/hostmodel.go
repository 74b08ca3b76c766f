package main

import (
	"math/rand/v2"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
)

// hostModel is an engine.Model that computes nothing, for measuring what a
// served token costs besides the forward pass (bench http --host-only): each
// item's logits are a fresh copy of one random row (as a device model
// downloads a new row a step) with a spike at a token hashed from the
// sequence and position, so that greedy decoding emits varied tokens.
type hostModel struct {
	cache *kvcache.Manager
	row   []float32
}

func newHostModel(vocab int, cache *kvcache.Manager) *hostModel {
	rng := rand.New(rand.NewPCG(1, 2))
	row := make([]float32, vocab)
	for i := range row {
		row[i] = float32(rng.NormFloat64())
	}
	return &hostModel{cache: cache, row: row}
}

func (m *hostModel) Vocab() int                       { return len(m.row) }
func (m *hostModel) Cache() *kvcache.Manager          { return m.cache }
func (m *hostModel) FreeSequence(s *kvcache.Sequence) { m.cache.Free(s) }

func (m *hostModel) Forward(items []engine.ForwardItem) ([][]float32, error) {
	logits, _, err := m.ForwardDraw(items)
	return logits, err
}

// CanDraw implements engine.DrawingModel: with serve's --device-sampling the
// engine asks for ids instead of logits rows, as from a GPU model.
func (m *hostModel) CanDraw() bool { return true }

// ForwardDraw implements engine.DrawingModel: the drawn id of an item is its
// row's spike, and a drawn item without AllLogits gets no row.
func (m *hostModel) ForwardDraw(items []engine.ForwardItem) ([][]float32, []int32, error) {
	out := make([][]float32, len(items))
	var ids []int32
	for i, it := range items {
		if err := m.cache.Reserve(it.Seq, it.Seq.Len()+len(it.Tokens)); err != nil {
			return nil, nil, err
		}
		end := it.Seq.Len() + len(it.Tokens)
		if it.Draw != nil {
			if ids == nil {
				ids = make([]int32, len(items))
				for j := range ids {
					ids[j] = -1
				}
			}
			ids[i] = m.spike(it.Seq.ID, end-1)
		}
		if it.Draw == nil || it.AllLogits {
			n := 1
			if it.AllLogits {
				n = len(it.Tokens)
			}
			rows := make([]float32, 0, n*len(m.row))
			for k := range n {
				rows = append(rows, m.row...)
				rows[k*len(m.row)+int(m.spike(it.Seq.ID, end-n+k))] += 100
			}
			out[i] = rows
		}
		m.cache.Advance(it.Seq, len(it.Tokens))
	}
	return out, ids, nil
}

// spike is the token a sequence's row at pos favours.
func (m *hostModel) spike(seq int64, pos int) int32 {
	h := (uint64(seq)*0x9e3779b97f4a7c15 ^ uint64(pos)*0xbf58476d1ce4e5b9) >> 17
	return int32(h % uint64(len(m.row)))
}
