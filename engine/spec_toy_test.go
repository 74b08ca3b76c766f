package engine

import (
	"errors"

	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// toySpec is toyModel with a drafter: its "MTP block" predicts from the
// token context it is given (the history up to the row, then the drafts it
// chained), right except where a hash of the context says to miss, so
// drafts are accepted and rejected at every position. Rewind truncates the
// history as the real cache rolls back.
type toySpec struct {
	*toyModel
	ctx    map[int64][]int32 // the tokens up to the last row the block saw
	known  map[int64][]int32 // the tokens up to the last caught-up row
	missOf uint32            // a draft misses when hash%missOf == 0 (0: never)
}

func newToySpec(m *toyModel, missOf uint32) *toySpec {
	return &toySpec{toyModel: m, ctx: map[int64][]int32{}, known: map[int64][]int32{}, missOf: missOf}
}

func (m *toySpec) HasMTP() bool   { return true }
func (m *toySpec) HiddenDim() int { return 1 }

func (m *toySpec) ForwardHidden(items []ForwardItem) ([][]float32, [][]float32, error) {
	logits, err := m.Forward(items)
	if err != nil {
		return nil, nil, err
	}
	hidden := make([][]float32, len(items))
	for i, it := range items {
		hidden[i] = make([]float32, len(it.Tokens))
	}
	return logits, hidden, nil
}

func (m *toySpec) ForwardMTP(items []model.MTPItem) ([][]float32, [][]float32, error) {
	logits := make([][]float32, len(items))
	hidden := make([][]float32, len(items))
	for i, it := range items {
		id := it.Seq.ID
		if it.Draft {
			if len(m.ctx[id]) != it.Start+1 {
				m.t.Errorf("seq %d: draft at %d after a context of %d", id, it.Start, len(m.ctx[id]))
			}
			m.ctx[id] = append(m.ctx[id], it.Next...)
		} else {
			// Catch-up rows continue the last ones; they may run ahead of
			// the cache (rolled-back rows) but not of what was seen.
			base := m.known[id]
			if len(base) < it.Start+1 {
				base = m.hist[id]
			}
			if len(base) < it.Start+1 {
				m.t.Fatalf("seq %d: mtp rows from %d after %d known tokens", id, it.Start, len(base))
			}
			m.ctx[id] = append(append([]int32(nil), base[:it.Start+1]...), it.Next...)
			m.known[id] = m.ctx[id]
		}
		row := m.logits(m.ctx[id])
		if h := hash(m.ctx[id]); m.missOf > 0 && h%m.missOf == 0 {
			best := Argmax(row)
			row[best], row[(best+1)%int32(m.vocab)] = row[(best+1)%int32(m.vocab)], row[best]
		}
		logits[i], hidden[i] = row, []float32{0}
	}
	return logits, hidden, nil
}

func (m *toySpec) Drafts() int { return MaxSpeculativeTokens }

func (m *toySpec) Rewind(s *kvcache.Sequence, n int) error {
	m.hist[s.ID] = m.hist[s.ID][:n]
	return m.cache.Rewind(s, n)
}

func hash(prefix []int32) uint32 {
	var h uint32 = 2166136261
	for _, t := range prefix {
		h = (h ^ uint32(t)) * 16777619
	}
	return h >> 7
}

func (m *toySpec) DSparkRows() int { return 0 }

func (m *toySpec) ForwardDSpark([]model.DSparkItem) ([][]float32, error) {
	return nil, errors.New("toy: no DSpark drafter")
}

func (m *toySpec) MarkovBias([]int32) ([][]float32, error) {
	return nil, errors.New("toy: no DSpark drafter")
}
