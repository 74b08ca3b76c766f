// Package cpu is the pure-Go reference implementation of backend.Backend.
// Every op runs multi-threaded over rows or output columns on a fixed number of
// workers; weights of small linears are dequantised to fp32 once at Prepare,
// larger ones row by row into per-worker scratch (so a real checkpoint is never
// expanded to fp32 as a whole).
package cpu

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/num"
)

// Options configure the CPU backend.
type Options struct {
	Threads int // workers; 0 = GOMAXPROCS
	// DenseBudget is the number of bytes of fp32 weights that may be dequantised
	// once at Prepare (smallest matrices first is up to the caller's order);
	// matrices beyond it are dequantised lazily per output row. 0 = 1 GiB; <0 = none.
	DenseBudget int64
	// DenseMaxElems caps one pre-dequantised matrix (0 = 16M elements).
	DenseMaxElems int64
}

// Backend is the CPU reference backend.
type Backend struct {
	threads  int
	mode     backend.Numerics
	budget   int64
	maxElems int64
	mu       sync.Mutex
}

// New returns a CPU backend.
func New(o Options) *Backend {
	t := o.Threads
	if t <= 0 {
		t = runtime.GOMAXPROCS(0)
	}
	b := &Backend{threads: t, budget: o.DenseBudget, maxElems: o.DenseMaxElems}
	if b.budget == 0 {
		b.budget = 1 << 30
	}
	if b.maxElems == 0 {
		b.maxElems = 16 << 20
	}
	return b
}

var _ backend.Backend = (*Backend)(nil)

// Name implements backend.Backend.
func (b *Backend) Name() string { return "cpu" }

// SetNumerics implements backend.Backend.
func (b *Backend) SetNumerics(n backend.Numerics) { b.mode = n }

// Numerics implements backend.Backend.
func (b *Backend) Numerics() backend.Numerics { return b.mode }

// Threads is the worker count.
func (b *Backend) Threads() int { return b.threads }

func (b *Backend) faithful() bool { return b.mode == backend.Faithful }

// rb rounds to bf16 in faithful mode.
func (b *Backend) rb(x float32) float32 {
	if b.mode == backend.Faithful {
		return num.RoundBF16(x)
	}
	return x
}

// parallel runs fn over [0, n) split into contiguous chunks on the workers.
func (b *Backend) parallel(n int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	w := min(b.threads, n)
	if w <= 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	chunk := (n + w - 1) / w
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

// parallelErr is parallel with the first error of any chunk.
func (b *Backend) parallelErr(n int, fn func(lo, hi int) error) error {
	var mu sync.Mutex
	var first error
	b.parallel(n, func(lo, hi int) {
		if err := fn(lo, hi); err != nil {
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
		}
	})
	return first
}

// Tensor is the CPU activation buffer.
type Tensor struct {
	rows, cols int
	dt         backend.DType
	F          []float32
	I          []int32
}

// Rows implements backend.Tensor.
func (t *Tensor) Rows() int { return t.rows }

// Cols implements backend.Tensor.
func (t *Tensor) Cols() int { return t.cols }

// DType implements backend.Tensor.
func (t *Tensor) DType() backend.DType { return t.dt }

// Row returns row r of an F32 tensor.
func (t *Tensor) Row(r int) []float32 { return t.F[r*t.cols : (r+1)*t.cols] }

// Alloc implements backend.Backend.
func (b *Backend) Alloc(rows, cols int, dt backend.DType) backend.Tensor {
	t := &Tensor{rows: rows, cols: cols, dt: dt}
	if dt == backend.I32 {
		t.I = make([]int32, rows*cols)
	} else {
		t.F = make([]float32, rows*cols)
	}
	return t
}

// Empty implements backend.Backend: poisoned, so that reading what no op
// wrote is seen.
func (b *Backend) Empty(rows, cols int, dt backend.DType) backend.Tensor {
	t := b.Alloc(rows, cols, dt).(*Tensor)
	for i := range t.I {
		t.I[i] = math.MinInt32
	}
	nan := float32(math.NaN())
	for i := range t.F {
		t.F[i] = nan
	}
	return t
}

// NewTensor wraps data (len rows·cols) as an F32 tensor (tests, helpers).
func NewTensor(rows, cols int, data []float32) *Tensor {
	return &Tensor{rows: rows, cols: cols, dt: backend.F32, F: data}
}

// View implements backend.Backend.
func (b *Backend) View(t backend.Tensor, rows, cols int) (backend.Tensor, error) {
	c, err := backend.As[*Tensor](backend.CheckView(t, rows, cols), "view", t)
	if err != nil {
		return nil, err
	}
	return &Tensor{rows: rows, cols: cols, dt: c.dt, F: c.F, I: c.I}, nil
}

// Slice implements backend.Backend.
func (b *Backend) Slice(t backend.Tensor, row0, rows int) (backend.Tensor, error) {
	c, err := backend.As[*Tensor](backend.CheckSlice(t, row0, rows), "slice", t)
	if err != nil {
		return nil, err
	}
	v := &Tensor{rows: rows, cols: c.cols, dt: c.dt}
	lo, hi := row0*c.cols, (row0+rows)*c.cols
	if c.F != nil {
		v.F = c.F[lo:hi:hi]
	}
	if c.I != nil {
		v.I = c.I[lo:hi:hi]
	}
	return v, nil
}

// Free implements backend.Backend (the GC owns CPU buffers).
func (b *Backend) Free(t backend.Tensor) {}

func ct(t backend.Tensor) (*Tensor, error) {
	c, ok := t.(*Tensor)
	if !ok || c == nil {
		return nil, fmt.Errorf("cpu: tensor %T is not a cpu tensor", t)
	}
	return c, nil
}

// Upload implements backend.Backend.
func (b *Backend) Upload(t backend.Tensor, data []float32) error {
	c, err := backend.As[*Tensor](backend.CheckCopy("upload", t, backend.F32, len(data)), "upload", t)
	if err != nil {
		return err
	}
	copy(c.F, data)
	return nil
}

// Download implements backend.Backend.
func (b *Backend) Download(t backend.Tensor, dst []float32) error {
	c, err := backend.As[*Tensor](backend.CheckCopy("download", t, backend.F32, len(dst)), "download", t)
	if err != nil {
		return err
	}
	copy(dst, c.F)
	return nil
}

// DownloadI32 implements backend.Backend.
func (b *Backend) DownloadI32(t backend.Tensor, dst []int32) error {
	c, err := backend.As[*Tensor](backend.CheckCopy("download", t, backend.I32, len(dst)), "download", t)
	if err != nil {
		return err
	}
	copy(dst, c.I)
	return nil
}

// Stats implements backend.Backend.
func (b *Backend) Stats(t backend.Tensor) backend.Stats {
	c, err := ct(t)
	if err != nil || c.dt != backend.F32 {
		return backend.Stats{FirstBad: -1}
	}
	return SliceStats(c.F)
}

// SliceStats summarises x (see backend.SliceStats).
func SliceStats(x []float32) backend.Stats { return backend.SliceStats(x) }
