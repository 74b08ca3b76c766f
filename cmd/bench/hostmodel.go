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
	out := make([][]float32, len(items))
	for i, it := range items {
		if err := m.cache.Reserve(it.Seq, it.Seq.Len()+len(it.Tokens)); err != nil {
			return nil, err
		}
		n := 1
		if it.AllLogits {
			n = len(it.Tokens)
		}
		rows := make([]float32, 0, n*len(m.row))
		for k := range n {
			rows = append(rows, m.row...)
			pos := uint64(it.Seq.Len() + len(it.Tokens) - n + k)
			h := (uint64(it.Seq.ID)*0x9e3779b97f4a7c15 ^ pos*0xbf58476d1ce4e5b9) >> 17
			rows[k*len(m.row)+int(h%uint64(len(m.row)))] += 100
		}
		m.cache.Advance(it.Seq, len(it.Tokens))
		out[i] = rows
	}
	return out, nil
}
