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
	s := &split{keep: &backend.Batch{}, spec: &backend.Batch{}}
	for _, sq := range b.Seqs {
		k := sq.Rows
		if sq.Keep > 0 && sq.Keep < sq.Rows {
			k = sq.Keep
			s.copies = append(s.copies, backend.SlotCopy{Dst: sq.Spare, Src: sq.Slot, From: layer, To: layer + 1})
		}
		s.keepRows = add(s.keep, sq, 0, k, s.keepRows)
		if k < sq.Rows {
			s.specRows = add(s.spec, sq, k, sq.Rows, s.specRows)
		}
	}
	if len(s.copies) == 0 {
		return nil
	}
	return s
}

// add appends rows [lo, hi) of sq to bt and their batch row indices to rows.
func add(bt *backend.Batch, sq backend.SeqInfo, lo, hi int, rows []int) []int {
	bt.Seqs = append(bt.Seqs, backend.SeqInfo{Slot: sq.Slot, Blocks: sq.Blocks, Start: sq.Start + lo, Row0: len(bt.Pos), Rows: hi - lo})
	for r := lo; r < hi; r++ {
		bt.Pos = append(bt.Pos, int32(sq.Start+r))
		bt.Seq = append(bt.Seq, int32(len(bt.Seqs)-1))
		rows = append(rows, sq.Row0+r)
	}
	return rows
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
		if i == 0 {
			for _, c := range s.copies {
				c.Part = part
				if err := be.CopySlot(st, c); err != nil {
					return fmt.Errorf("speculative snapshot: %w", err)
				}
			}
		}
	}
	return nil
}
