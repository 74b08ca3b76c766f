package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

var _ backend.MarkovDrawer = (*Backend)(nil)

// MarkovDraw implements backend.MarkovDrawer: per draft position one embed
// gather of the previous tokens (read on the device), the backend's
// LinearF32 (the op the host path's bias comes from) and one add+argmax
// kernel writing the next tokens; no host round trip, so a recorded step
// may hold it. The anchors are read from the step's token ids.
func (b *Backend) MarkovDraw(base backend.Tensor, tokens []int32, k int, w1 backend.Embedding, w2 backend.Linear, ids backend.Tensor) error {
	if err := backend.CheckMarkovDraw(base, tokens, k, w1, w2, ids); err != nil {
		return err
	}
	em, ok := w1.(*embedding)
	if !ok {
		return fmt.Errorf("markov draw: embedding %T is not a gpu embedding", w1)
	}
	n, vocab := len(tokens)/k, w2.Out()
	bt, err := f32(base, n*k, vocab, "markov draw base")
	if err != nil {
		return err
	}
	it, err := typed(ids, k, n, backend.I32, "markov draw ids")
	if err != nil {
		return err
	}
	tok := b.recordedIDs(tokens)
	if tok == 0 {
		dev, err := b.upload(cuda.Bytes(tokens))
		if err != nil {
			return fmt.Errorf("markov draw: %w", err)
		}
		defer dev.Free()
		tok = dev.Ptr
	}
	anchors, err := b.scratch(4 * n)
	if err != nil {
		return fmt.Errorf("markov draw: %w", err)
	}
	defer anchors.Free()
	e := b.Empty(n, em.dim, backend.F32)
	lg := b.Empty(n, vocab, backend.F32)
	defer b.Free(e)
	defer b.Free(lg)
	et, lt := e.(*Tensor), lg.(*Tensor)
	if err := cuda.StrideI32(b.s, anchors.Ptr, tok, k, n); err != nil {
		return fmt.Errorf("markov draw: %w", err)
	}
	prev := anchors.Ptr
	for j := range k {
		if err := cuda.EmbedF32(b.s, et.ptr, em.buf.Ptr, em.bf16, prev, n, em.dim, 1); err != nil {
			return fmt.Errorf("markov draw: markov_w1: %w", err)
		}
		if err := b.LinearF32(e, w2, lg); err != nil {
			return fmt.Errorf("markov draw: markov_w2: %w", err)
		}
		row := it.ptr.Add(4 * j * n)
		if err := cuda.AddArgmax(b.s, row, bt.ptr.Add(4*j*vocab), k*vocab, lt.ptr, n, vocab); err != nil {
			return fmt.Errorf("markov draw: %w", err)
		}
		prev = row
	}
	return nil
}
