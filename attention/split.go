package attention

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
)

// split divides a batch with speculative rows (SeqInfo.Keep) into the rows
// whose cache writes persist and the others: each stateful op (a compressor,
// the window write) runs on the first part, the state it leaves is copied
// into each sequence's spare slot, then the op runs on the second part.
type split struct {
	keep, spec         *backend.Batch
	keepRows, specRows []int
	copies             []backend.SlotCopy // per speculative sequence: spare ← slot
}

// splitBatch returns nil when no sequence of b has speculative rows.
func splitBatch(b *backend.Batch, layer int) *split {
	keep, spec, keepRows, specRows, ok := b.SplitKeep()
	if !ok {
		return nil
	}
	s := &split{keep: keep, spec: spec, keepRows: keepRows, specRows: specRows}
	for _, sq := range b.Seqs {
		if sq.Keep > 0 && sq.Keep < sq.Rows {
			s.copies = append(s.copies, backend.SlotCopy{Dst: sq.Spare, Src: sq.Slot, From: layer, To: layer + 1})
		}
	}
	return s
}

// run applies op to the persisting rows of xs (tensors with one row per
// batch row), snapshots part of the state, and applies op to the others.
func (s *split) run(be backend.Backend, st backend.KVStore, part backend.SlotPart, xs []backend.Tensor, op func(xs []backend.Tensor, b *backend.Batch) error) error {
	for i, half := range []struct {
		b    *backend.Batch
		rows []int
	}{{s.keep, s.keepRows}, {s.spec, s.specRows}} {
		sub := make([]backend.Tensor, len(xs))
		for j, x := range xs {
			sub[j] = be.Empty(len(half.rows), x.Cols(), x.DType())
			defer be.Free(sub[j])
			if err := be.GatherRows(x, half.rows, sub[j]); err != nil {
				return err
			}
		}
		if err := op(sub, half.b); err != nil {
			return err
		}
		if i == 0 { // every sequence's snapshot in one call
			for j := range s.copies {
				s.copies[j].Part = part
			}
			if err := be.CopySlot(st, s.copies...); err != nil {
				return fmt.Errorf("speculative snapshot: %w", err)
			}
		}
	}
	return nil
}
