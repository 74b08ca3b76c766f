package gpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

var _ backend.DeviceSampler = (*Backend)(nil)

// SampleDraw implements backend.DeviceSampler: the parameters go up in one
// copy, the sample kernel runs one block per row, and only the ids come back
// (4 bytes a row instead of a 517 KB logits row for DeepSeek-V4).
func (b *Backend) SampleDraw(logits backend.Tensor, d []backend.Draw, ids []int32) error {
	n := len(d)
	lt, err := f32(logits, n, -1, "sample draw logits")
	if err != nil {
		return err
	}
	if len(ids) != n {
		return fmt.Errorf("sample draw: %d ids for %d rows", len(ids), n)
	}
	if n == 0 {
		return nil
	}
	// [temp f32 | top_k i32 | top_p f32 | min_p f32 | u f32] × n, then ids.
	host := make([]byte, 5*4*n)
	for i, p := range d {
		le := binary.LittleEndian
		le.PutUint32(host[4*i:], math.Float32bits(p.Temp))
		le.PutUint32(host[4*(n+i):], uint32(p.TopK))
		le.PutUint32(host[4*(2*n+i):], math.Float32bits(p.TopP))
		le.PutUint32(host[4*(3*n+i):], math.Float32bits(p.MinP))
		le.PutUint32(host[4*(4*n+i):], math.Float32bits(cuda.Uniform32(float64(p.U))))
	}
	if b.rec != nil {
		return fmt.Errorf("sample draw: %w", errHostInRecording)
	}
	buf, err := b.scratch(6 * 4 * n)
	if err != nil {
		return fmt.Errorf("sample draw: %w", err)
	}
	defer buf.Free()
	p := buf.Ptr
	if err := b.s.CopyHtoD(p, host); err != nil {
		return fmt.Errorf("sample draw: %w", err)
	}
	out := p.Add(5 * 4 * n)
	err = cuda.SampleDraw(b.s, out, lt.ptr, p, p.Add(4*n), p.Add(8*n), p.Add(12*n), p.Add(16*n), n, lt.cols)
	if err != nil {
		return err
	}
	if err := b.s.CopyDtoH(cuda.Bytes(ids), out); err != nil {
		return fmt.Errorf("sample draw: %w", err)
	}
	return b.s.Synchronize()
}
