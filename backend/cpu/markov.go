package cpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
)

var _ backend.MarkovDrawer = (*Backend)(nil)

// MarkovDraw implements backend.MarkovDrawer with the backend's own Embed
// and LinearF32, so the bias equals what those ops give the host path.
func (b *Backend) MarkovDraw(base backend.Tensor, tokens []int32, k int, w1 backend.Embedding, w2 backend.Linear, ids backend.Tensor) error {
	if err := backend.CheckMarkovDraw(base, tokens, k, w1, w2, ids); err != nil {
		return err
	}
	bt, err := ct(base)
	if err != nil {
		return fmt.Errorf("markov draw: %w", err)
	}
	it, err := ct(ids)
	if err != nil {
		return fmt.Errorf("markov draw: %w", err)
	}
	n, vocab := len(tokens)/k, w2.Out()
	e := b.Empty(n, w1.Dim(), backend.F32)
	lg := b.Empty(n, vocab, backend.F32).(*Tensor)
	prev := make([]int32, n)
	for s := range n {
		prev[s] = tokens[s*k]
	}
	row := make([]float32, vocab)
	for j := range k {
		if err := b.Embed(w1, prev, 1, e); err != nil {
			return fmt.Errorf("markov draw: %w", err)
		}
		if err := b.LinearF32(e, w2, lg); err != nil {
			return fmt.Errorf("markov draw: %w", err)
		}
		for s := range n {
			x, bias := bt.Row(s*k+j), lg.Row(s)
			for v := range row {
				row[v] = x[v] + bias[v]
			}
			prev[s] = greedy(row)
		}
		copy(it.I[j*n:(j+1)*n], prev)
	}
	return nil
}

// greedy is the greedy rule of backend.Draw: the argmax with NaN as -inf,
// ties to the lower id, 0 for a row of -inf.
func greedy(x []float32) int32 {
	best, bv := 0, float32(0)
	found := false
	for i, v := range x {
		if v != v {
			continue
		}
		if !found || v > bv {
			best, bv, found = i, v, true
		}
	}
	return int32(best)
}
