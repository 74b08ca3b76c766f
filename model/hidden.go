package model

import (
	"errors"
	"fmt"

	"github.com/megamoe/megamoe/backend"
)

// Drafter inputs kept on the device: a verification's final streams
// (BatchItem.KeepHidden) and an MTP pass's output streams (MTPItem.KeepNext)
// stay in a backend tensor from which the next MTP pass gathers its input
// rows (MTPItem.In), so no hidden state crosses to the host between draft
// and verify.

// Hidden is rows of final residual streams (hc·d wide) on the model's
// backend, owned by the caller until FreeHidden.
type Hidden struct {
	t backend.Tensor
}

// Rows is the number of rows h holds.
func (h *Hidden) Rows() int { return h.t.Rows() }

// HiddenRef names rows [Row0, Row0+Rows) of H.
type HiddenRef struct {
	H          *Hidden
	Row0, Rows int
}

// FreeHidden releases h (nil: nothing).
func (m *Model) FreeHidden(h *Hidden) {
	if h == nil || h.t == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.be.Free(h.t)
	h.t = nil
}

// DownloadHidden copies the rows r names to the host, flattened rows×(hc·d).
func (m *Model) DownloadHidden(r HiddenRef) ([]float32, error) {
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("model: download hidden: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v, err := m.be.Slice(r.H.t, r.Row0, r.Rows)
	if err != nil {
		return nil, fmt.Errorf("model: download hidden: %w", err)
	}
	out := make([]float32, r.Rows*v.Cols())
	if err := m.be.Download(v, out); err != nil {
		return nil, fmt.Errorf("model: download hidden: %w", err)
	}
	return out, nil
}

func (r HiddenRef) check() error {
	switch {
	case r.H == nil || r.H.t == nil:
		return errors.New("no rows (freed or never kept)")
	case r.Row0 < 0 || r.Rows < 0 || r.Row0+r.Rows > r.H.t.Rows():
		return fmt.Errorf("rows [%d, %d) of %d", r.Row0, r.Row0+r.Rows, r.H.t.Rows())
	}
	return nil
}

// keepRows copies rows of x into a new Hidden (one gather: the rows stay
// valid after the step's outputs are reused by the next recorded step).
func (m *Model) keepRows(x backend.Tensor, rows []int) (*Hidden, error) {
	y := m.be.Empty(len(rows), x.Cols(), backend.F32)
	if err := m.be.GatherRows(x, rows, y); err != nil {
		m.be.Free(y)
		return nil, fmt.Errorf("model: keep hidden rows: %w", err)
	}
	return &Hidden{t: y}, nil
}

// rowSrc is one item's input rows for stageRows: on the host (host,
// flattened rows×width) or on the device (in).
type rowSrc struct {
	host []float32
	in   HiddenRef
	rows int
}

// mtpInput returns the MTP pass's input streams [n, hc·d] (stageRows).
func (m *Model) mtpInput(items []MTPItem, n int) (backend.Tensor, error) {
	src := make([]rowSrc, len(items))
	for i, it := range items {
		src[i] = rowSrc{host: it.Hidden, in: it.In, rows: len(it.Next)}
	}
	x, err := m.stageRows(src, n, m.cfg.HcDim())
	if err != nil {
		return nil, fmt.Errorf("model mtp input: %w", err)
	}
	return x, nil
}

// stageRows returns the items' input rows [n, width] (device rows gathered,
// host rows uploaded). The rows live in a staging tensor per width and
// power-of-two row count that the model keeps: a pass recorded as a CUDA
// graph reads its input from a fixed address.
func (m *Model) stageRows(items []rowSrc, n, width int) (backend.Tensor, error) {
	be := m.be
	c := 1
	for c < n {
		c *= 2
	}
	if m.stage == nil {
		m.stage = map[[2]int]backend.Tensor{}
	}
	st := m.stage[[2]int{c, width}]
	if st == nil {
		st = be.Empty(c, width, backend.F32)
		m.stage[[2]int{c, width}] = st
	}
	x, err := be.Slice(st, 0, n)
	if err != nil {
		return nil, err
	}
	// Runs of items reading the same Hidden take one gather each; host rows
	// one upload each.
	off := 0
	for i := 0; i < len(items); {
		it := items[i]
		if it.in.H == nil {
			if it.rows == 0 {
				i++
				continue
			}
			dst, err := be.Slice(x, off, it.rows)
			if err == nil {
				err = be.Upload(dst, it.host)
			}
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			off += it.rows
			i++
			continue
		}
		src := it.in.H
		var rows []int
		j := i
		for ; j < len(items) && items[j].in.H == src; j++ {
			for r := range items[j].in.Rows {
				rows = append(rows, items[j].in.Row0+r)
			}
		}
		dst := x
		if len(rows) != n {
			if dst, err = be.Slice(x, off, len(rows)); err != nil {
				return nil, err
			}
		}
		if err := be.GatherRows(src.t, rows, dst); err != nil {
			return nil, fmt.Errorf("items %d..%d: %w", i, j-1, err)
		}
		off += len(rows)
		i = j
	}
	if off != n {
		return nil, fmt.Errorf("%d input rows staged for %d", off, n)
	}
	return x, nil
}

// Close frees what the model keeps on its backend besides the weights and
// the cache: the drafters' input staging.
func (m *Model) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for c, t := range m.stage {
		m.be.Free(t)
		delete(m.stage, c)
	}
}
