package backend

// SplitKeep divides a batch with speculative rows (SeqInfo.Keep) into the
// rows whose cache writes persist (keep) and the others (spec), with their
// row indices in b: the stateful ops of such a step run on keep, then the
// state is snapshot, then they run on spec. ok is false when no sequence of
// b has speculative rows. The split is a function of b's layout alone, so a
// recorded step lays out both parts beside b.
func (b *Batch) SplitKeep() (keep, spec *Batch, keepRows, specRows []int, ok bool) {
	keep, spec = &Batch{}, &Batch{}
	for _, sq := range b.Seqs {
		k := sq.Rows
		if sq.Keep > 0 && sq.Keep < sq.Rows {
			k, ok = sq.Keep, true
		}
		keepRows = addRows(keep, sq, 0, k, keepRows)
		if k < sq.Rows {
			specRows = addRows(spec, sq, k, sq.Rows, specRows)
		}
	}
	if !ok {
		return nil, nil, nil, nil, false
	}
	return keep, spec, keepRows, specRows, true
}

// addRows appends rows [lo, hi) of sq to bt and their batch row indices to rows.
func addRows(bt *Batch, sq SeqInfo, lo, hi int, rows []int) []int {
	bt.Seqs = append(bt.Seqs, SeqInfo{Slot: sq.Slot, Blocks: sq.Blocks, Start: sq.Start + lo, Row0: len(bt.Pos), Rows: hi - lo})
	for r := lo; r < hi; r++ {
		bt.Pos = append(bt.Pos, int32(sq.Start+r))
		bt.Seq = append(bt.Seq, int32(len(bt.Seqs)-1))
		rows = append(rows, sq.Row0+r)
	}
	return rows
}
