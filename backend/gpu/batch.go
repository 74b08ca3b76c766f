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
//	blocks [Σ nblk]           all block tables, concatenated (a recorded
//	                          step: capBlk slots per sequence)
//
// Eager steps re-upload it only when the host layout changes (the model calls
// many ops per step with the same Batch).
type devBatch struct {
	host []int32
	buf  *cuda.Buffer

	NSeq, Rows int
	MaxRows    int // largest Rows of a sequence
	MaxEnd     int // largest Start+Rows of a sequence (a recorded step: its capacity)
	Seqs       cuda.DevicePtr
	Pos        cuda.DevicePtr
	Seq        cuda.DevicePtr
	Blocks     cuda.DevicePtr
}

// layoutBatch validates bt and appends its devBatch words to dst. With
// capBlk > 0 every block table gets capBlk slots (the fixed layout of a
// recorded step), else they are concatenated.
func layoutBatch(bt *backend.Batch, capBlk int, dst []int32) ([]int32, devBatch, error) {
	if bt == nil {
		return nil, devBatch{}, fmt.Errorf("batch: nil")
	}
	n := bt.Rows()
	if len(bt.Seq) != n {
		return nil, devBatch{}, fmt.Errorf("batch: %d positions, %d sequence indices", n, len(bt.Seq))
	}
	d := devBatch{NSeq: len(bt.Seqs), Rows: n}
	off := 0
	for i, s := range bt.Seqs {
		if s.Rows < 0 || s.Row0 < 0 || s.Row0+s.Rows > n || s.Start < 0 || s.Slot < 0 {
			return nil, d, fmt.Errorf("batch: sequence %d: rows [%d,+%d) of %d, start %d, slot %d", i, s.Row0, s.Rows, n, s.Start, s.Slot)
		}
		if capBlk > 0 && len(s.Blocks) > capBlk {
			return nil, d, fmt.Errorf("batch: sequence %d: %d blocks, the recorded layout holds %d", i, len(s.Blocks), capBlk)
		}
		dst = append(dst, int32(s.Slot), int32(s.Start), int32(s.Row0), int32(s.Rows), int32(off), int32(len(s.Blocks)))
		if capBlk > 0 {
			off += capBlk
		} else {
			off += len(s.Blocks)
		}
		d.MaxRows = max(d.MaxRows, s.Rows)
		d.MaxEnd = max(d.MaxEnd, s.Start+s.Rows)
	}
	dst = append(dst, bt.Pos...)
	for r, si := range bt.Seq {
		if si < 0 || int(si) >= len(bt.Seqs) {
			return nil, d, fmt.Errorf("batch: row %d in sequence %d of %d", r, si, len(bt.Seqs))
		}
	}
	dst = append(dst, bt.Seq...)
	for _, s := range bt.Seqs {
		dst = append(dst, s.Blocks...)
		if capBlk > 0 {
			for range capBlk - len(s.Blocks) {
				dst = append(dst, -1)
			}
		}
	}
	return dst, d, nil
}

// place points d's regions into the buffer at p.
func (d *devBatch) place(p cuda.DevicePtr) {
	d.Seqs = p
	d.Pos = p.Add(4 * SeqFields * d.NSeq)
	d.Seq = d.Pos.Add(4 * d.Rows)
	d.Blocks = d.Seq.Add(4 * d.Rows)
}

// batchLayouts is how many device layouts deviceBatch keeps: a step may
// alternate, layer by layer, between its batch and further layouts of its
// ops (Batch.Also: a DSpark block's attention rows).
const batchLayouts = 4

// deviceBatch returns bt's device layout (uploading it unless one of the
// last batchLayouts layouts is the same); while a step is recorded, the
// recording's fixed layout.
func (b *Backend) deviceBatch(bt *backend.Batch) (*devBatch, error) {
	b.pdlFor(bt)
	if c := b.rec; c != nil {
		return c.layout(bt, b.capBlocks(c.db.MaxEnd))
	}
	host, d, err := layoutBatch(bt, 0, make([]int32, 0, 256))
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, c := range b.batches {
		if slices.Equal(c.host, host) { // most recent first
			copy(b.batches[1:i+1], b.batches[:i])
			b.batches[0] = c
			return c, nil
		}
	}
	if n := len(b.batches); n == batchLayouts {
		b.batches[n-1].buf.Free() // reused in stream order (cuda.Pool)
		b.batches = b.batches[:n-1]
	}
	buf, err := b.upload(cuda.Bytes(host))
	if err != nil {
		return nil, fmt.Errorf("batch upload: %w", err)
	}
	d.host, d.buf = host, buf
	d.place(buf.Ptr)
	b.batches = slices.Insert(b.batches, 0, &d)
	return &d, nil
}

// layout is the recorded device layout of bt: the step's batch or one of
// the parts its stateful ops run on (matched by content: the model builds
// the parts anew in every layer).
func (c *recording) layout(bt *backend.Batch, capBlk int) (*devBatch, error) {
	if bt == c.bt {
		return &c.db, nil
	}
	if len(c.subs) > 0 {
		words, _, err := layoutBatch(bt, capBlk, nil)
		if err != nil {
			return nil, err
		}
		for i := range c.subs {
			if slices.Equal(words, c.subs[i].words) {
				return &c.subs[i].db, nil
			}
		}
	}
	return nil, fmt.Errorf("batch: an op of a recorded step got another batch")
}
