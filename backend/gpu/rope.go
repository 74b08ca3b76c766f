package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/rope"
)

// ropeTable holds a Freqs' fp32 and fp64 frequencies on the device; the
// kernels compute the angle fp32(pos)·f32 (faithful) or pos·f64 (exact) and
// take cos/sin in double precision, like rope.Freqs.CosSin32/CosSin64.
type ropeTable struct {
	dim      int
	f32, f64 *cuda.Buffer
}

func (b *Backend) ropeFreqs(f *rope.Freqs) (*ropeTable, error) {
	if f == nil || f.Dim() <= 0 || f.Dim()%2 != 0 || len(f.F32) < f.Dim()/2 || len(f.F64) < f.Dim()/2 {
		return nil, fmt.Errorf("rope: bad frequency table")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if t := b.ropes[f]; t != nil {
		return t, nil
	}
	p := f.Dim() / 2
	a, err := b.upload(cuda.Bytes(f.F32[:p]))
	if err != nil {
		return nil, fmt.Errorf("rope table: %w", err)
	}
	d64 := make([]byte, 8*p)
	for i, v := range f.F64[:p] {
		putF64(d64[8*i:], v)
	}
	c, err := b.upload(d64)
	if err != nil {
		a.Free()
		return nil, fmt.Errorf("rope table: %w", err)
	}
	t := &ropeTable{dim: f.Dim(), f32: a, f64: c}
	b.ropes[f] = t
	return t, nil
}
