package kcheck

import (
	"fmt"

	"github.com/megamoe/megamoe/cuda"
)

// Flush is how timeIt evicts a case's data from L2 before each timed launch.
type Flush int

const (
	// FlushWrite memsets a 128 MiB buffer: L2 is left full of dirty lines,
	// which the timed kernel's first reads write back to DRAM.
	FlushWrite Flush = iota
	// FlushRead reads the buffer (one greedy SampleDraw over it as fp32
	// logits: any kernel that reads every byte and writes little would do),
	// so the lines it leaves are clean, as inside a decode step.
	FlushRead
)

// ParseFlush reads a --flush value.
func ParseFlush(s string) (Flush, error) {
	switch s {
	case "write":
		return FlushWrite, nil
	case "read":
		return FlushRead, nil
	}
	return 0, fmt.Errorf("flush %q (want write or read)", s)
}

// flushVocab shapes the read flush: flushBytes of fp32 as rows of this many logits.
const flushVocab = 8192

// readFlush holds the read flush's small SampleDraw operands.
type readFlush struct {
	ids, zeros *cuda.Buffer // zeros: temperature 0 (greedy), no top-k/p, min-p or uniform
}

func (r *readFlush) free() {
	for _, b := range []*cuda.Buffer{r.ids, r.zeros} {
		if b != nil {
			b.Free()
		}
	}
}

// flushL2 runs one flush of rep i, allocating the buffers on first use (the
// read flush then reads the buffer once more, so that the memset's dirty
// lines are gone before the first timed launch).
func (e *Env) flushL2(i int) error {
	if e.flush == nil {
		var err error
		if e.flush, err = e.Ctx.Alloc(flushBytes); err != nil {
			return err
		}
	}
	if e.Flush == FlushWrite {
		return e.S.Memset8(e.flush.Ptr, byte(i), flushBytes)
	}
	rows := flushBytes / 4 / flushVocab
	if e.rf == nil {
		rf := &readFlush{}
		err := func() (err error) {
			if rf.ids, err = e.Ctx.Alloc(4 * rows); err != nil {
				return err
			}
			if rf.zeros, err = e.Ctx.Alloc(4 * rows); err != nil {
				return err
			}
			if err := e.S.Memset8(rf.zeros.Ptr, 0, 4*rows); err != nil {
				return err
			}
			return e.S.Memset8(e.flush.Ptr, 0x3c, flushBytes) // finite logits
		}()
		if err != nil {
			rf.free()
			return fmt.Errorf("read flush: %w", err)
		}
		e.rf = rf
		if err := e.drawFlush(rows); err != nil {
			return err
		}
	}
	return e.drawFlush(rows)
}

func (e *Env) drawFlush(rows int) error {
	z := e.rf.zeros.Ptr
	if err := cuda.SampleDraw(e.S, e.rf.ids.Ptr, e.flush.Ptr, z, z, z, z, z, 0, rows, flushVocab); err != nil {
		return fmt.Errorf("read flush: %w", err)
	}
	return nil
}
