package gpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

var _ backend.DeviceSampler = (*Backend)(nil)

// SampleDraw implements backend.DeviceSampler: the parameters (and the rows'
// masks, when a row has one) go up in one copy from pinned memory, the sample
// kernel runs one block per row, and only the ids come back (4 bytes a row
// instead of a 517 KB logits row for DeepSeek-V4), the one wait of the call.
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
	words, masked := cuda.SampleMaskWords(lt.cols), false
	for i, p := range d {
		if p.Mask != nil && len(p.Mask) < words {
			return fmt.Errorf("sample draw: row %d: mask of %d words, the vocabulary of %d needs %d", i, len(p.Mask), lt.cols, words)
		}
		masked = masked || p.Mask != nil
	}
	if b.rec != nil {
		return fmt.Errorf("sample draw: %w", errHostInRecording)
	}
	// [temp f32 | top_k i32 | top_p f32 | min_p f32 | u f32] × n, the ids,
	// then the masks [n, words] (rows without one allow every token).
	size := 24 * n
	if masked {
		size += 4 * words * n
	}
	stage, err := b.drawStage(size)
	if err != nil {
		return fmt.Errorf("sample draw: %w", err)
	}
	host := stage[:20*n]
	le := binary.LittleEndian
	for i, p := range d {
		le.PutUint32(host[4*i:], math.Float32bits(p.Temp))
		le.PutUint32(host[4*(n+i):], uint32(p.TopK))
		le.PutUint32(host[4*(2*n+i):], math.Float32bits(p.TopP))
		le.PutUint32(host[4*(3*n+i):], math.Float32bits(p.MinP))
		le.PutUint32(host[4*(4*n+i):], math.Float32bits(cuda.Uniform32(float64(p.U))))
	}
	if masked {
		packMasks(stage[24*n:], d, words)
	}
	buf, err := b.scratch(size)
	if err != nil {
		return fmt.Errorf("sample draw: %w", err)
	}
	defer buf.Free()
	dev := buf.Ptr
	// From the upload on, an error return first waits for the stream, so that
	// no copy still uses the pinned staging or the scratch.
	fail := func(err error) error {
		_ = b.sync()
		return fmt.Errorf("sample draw: %w", err)
	}
	if err := b.s.CopyHtoD(dev, stage); err != nil { // the ids' bytes go up unused
		return fail(err)
	}
	var mask cuda.DevicePtr
	if masked {
		mask = dev.Add(24 * n)
	}
	out := dev.Add(20 * n)
	err = cuda.SampleDraw(b.s, out, lt.ptr, dev, dev.Add(4*n), dev.Add(8*n), dev.Add(12*n), dev.Add(16*n), mask, n, lt.cols)
	if err != nil {
		return fail(err)
	}
	got := stage[20*n : 24*n]
	if err := b.s.CopyDtoH(got, out); err != nil {
		return fail(err)
	}
	if err := b.sync(); err != nil {
		return fmt.Errorf("sample draw: %w", err)
	}
	for i := range ids {
		ids[i] = int32(le.Uint32(got[4*i:]))
	}
	return nil
}

// packMasks writes the rows' masks (words each, little-endian) into dst; a
// row without one allows every token.
func packMasks(dst []byte, d []backend.Draw, words int) {
	le := binary.LittleEndian
	for i, p := range d {
		row := dst[4*words*i : 4*words*(i+1)]
		for w := range words {
			v := uint32(math.MaxUint32)
			if p.Mask != nil {
				v = p.Mask[w]
			}
			le.PutUint32(row[4*w:], v)
		}
	}
}

// drawStage returns n bytes of the backend's pinned staging, grown as needed.
// SampleDraw waits for its copies before it returns, so one buffer serves
// every call.
func (b *Backend) drawStage(n int) ([]byte, error) {
	if b.drawBuf == nil || len(b.drawBuf.Bytes()) < n {
		if b.drawBuf != nil {
			if err := b.drawBuf.Close(); err != nil {
				return nil, err
			}
			b.drawBuf = nil
		}
		hb, err := b.ctx.AllocHost(max(n, 4096))
		if err != nil {
			return nil, err
		}
		b.drawBuf = hb
	}
	return b.drawBuf.Bytes()[:n], nil
}
