package model

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
)

// CanDraw reports whether Forward honours BatchItem.Draw: the backend samples
// on its device, and the logits are not split over ranks.
func (m *Model) CanDraw() bool {
	return backend.Sampler(m.be) != nil && !m.sharded()
}

// drawTokens draws the tokens of the items that ask for it from the logits
// lg (one row per item, every row of an AllLogits or DrawRows item) on the
// device, and every row's of the DrawRows items; nil when there is none or
// the model cannot draw. Rows nobody draws from take the greedy rule (one
// argmax pass each) and are not used.
func (m *Model) drawTokens(lg backend.Tensor, items []BatchItem) ([]int32, [][]int32, error) {
	ds := backend.Sampler(m.be)
	if ds == nil || m.sharded() || !anyDraw(items) {
		return nil, nil, nil
	}
	var (
		draws []backend.Draw
		last  = make([]int, len(items)) // the item's last row of lg
	)
	for i, it := range items {
		cnt := 1
		if it.AllLogits || it.DrawRows {
			cnt = len(it.Tokens)
		}
		draws = append(draws, make([]backend.Draw, cnt)...)
		last[i] = len(draws) - 1
		if it.Draw != nil {
			draws[last[i]] = *it.Draw
		}
	}
	got := make([]int32, len(draws))
	if err := ds.SampleDraw(lg, draws, got); err != nil {
		return nil, nil, fmt.Errorf("model: draw: %w", err)
	}
	ids := make([]int32, len(items))
	var rows [][]int32
	for i, it := range items {
		ids[i] = -1
		if it.Draw != nil || it.DrawRows {
			ids[i] = got[last[i]]
		}
		if it.DrawRows {
			if rows == nil {
				rows = make([][]int32, len(items))
			}
			n := len(it.Tokens)
			rows[i] = got[last[i]-n+1 : last[i]+1 : last[i]+1]
		}
	}
	return ids, rows, nil
}

func anyDraw(items []BatchItem) bool {
	for _, it := range items {
		if it.Draw != nil || it.DrawRows {
			return true
		}
	}
	return false
}

// keepsLogits reports whether item i's logits go to the host: it was not
// drawn (ids nil or -1), or it wants every row's.
func keepsLogits(it BatchItem, ids []int32, i int) bool {
	return it.AllLogits || ids == nil || ids[i] < 0
}

// allDrawn reports that no item needs its logits on the host.
func allDrawn(items []BatchItem, ids []int32) bool {
	for i, it := range items {
		if keepsLogits(it, ids, i) {
			return false
		}
	}
	return true
}
