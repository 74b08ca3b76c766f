package gpu

import (
	"fmt"
	"slices"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// SeqFields is the number of int32 fields of one sequence in a devBatch:
// slot, start, row0, rows, block-table offset, block count.
const SeqFields = 6

// devBatch is a Batch's row layout on the device, one int32 buffer:
//
//	seqs   [nseq][SeqFields]  (slot, start, row0, rows, blkOff, nblk)
//	pos    [rows]             absolute position of every row
//	seq    [rows]             sequence index of every row
//	blocks [Σ nblk]           all block tables, concatenated
//
// It is re-uploaded only when the host layout changes (the model calls many
// ops per step with the same Batch).
type devBatch struct {
	host []int32
	buf  *cuda.Buffer

	NSeq, Rows int
	MaxRows    int // largest Rows of a sequence
	MaxEnd     int // largest Start+Rows of a sequence
	Seqs       cuda.DevicePtr
	Pos        cuda.DevicePtr
	Seq        cuda.DevicePtr
	Blocks     cuda.DevicePtr
}

// deviceBatch returns bt's device layout (uploading it if it changed).
func (b *Backend) deviceBatch(bt *backend.Batch) (*devBatch, error) {
	if bt == nil {
		return nil, fmt.Errorf("batch: nil")
	}
	n := bt.Rows()
	if len(bt.Seq) != n {
		return nil, fmt.Errorf("batch: %d positions, %d sequence indices", n, len(bt.Seq))
	}
	host := make([]int32, 0, SeqFields*len(bt.Seqs)+2*n)
	off := 0
	d := devBatch{NSeq: len(bt.Seqs), Rows: n}
	for i, s := range bt.Seqs {
		if s.Rows < 0 || s.Row0 < 0 || s.Row0+s.Rows > n || s.Start < 0 || s.Slot < 0 {
			return nil, fmt.Errorf("batch: sequence %d: rows [%d,+%d) of %d, start %d, slot %d", i, s.Row0, s.Rows, n, s.Start, s.Slot)
		}
		host = append(host, int32(s.Slot), int32(s.Start), int32(s.Row0), int32(s.Rows), int32(off), int32(len(s.Blocks)))
		off += len(s.Blocks)
		d.MaxRows = max(d.MaxRows, s.Rows)
		d.MaxEnd = max(d.MaxEnd, s.Start+s.Rows)
	}
	host = append(host, bt.Pos...)
	for r, si := range bt.Seq {
		if si < 0 || int(si) >= len(bt.Seqs) {
			return nil, fmt.Errorf("batch: row %d in sequence %d of %d", r, si, len(bt.Seqs))
		}
	}
	host = append(host, bt.Seq...)
	for _, s := range bt.Seqs {
		host = append(host, s.Blocks...)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.batch.buf != nil && slices.Equal(b.batch.host, host) {
		return &b.batch, nil
	}
	if b.batch.buf != nil {
		b.batch.buf.Free()
		b.batch.buf = nil
	}
	buf, err := b.upload(i32Bytes(host))
	if err != nil {
		return nil, fmt.Errorf("batch upload: %w", err)
	}
	d.host, d.buf = host, buf
	p := buf.Ptr
	d.Seqs = p
	d.Pos = p.Add(4 * SeqFields * d.NSeq)
	d.Seq = d.Pos.Add(4 * n)
	d.Blocks = d.Seq.Add(4 * n)
	b.batch = d
	return &b.batch, nil
}
