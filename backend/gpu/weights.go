package gpu

import (
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/safetensors"
)

// linear is a weight matrix kept on the device in its checkpoint format
// (FP8/FP4 codes and scales are never expanded).
type linear struct {
	name    string
	out, in int
	format  checkpoint.Format
	quant   bool // FP8/FP4 weight: FP8 activation quant in faithful mode
	w       *cuda.Buffer
	scale   *cuda.Buffer // nil for BF16/F32
	scale2  float32      // NVFP4 global scale
	sCols   int          // columns of the scale grid
}

func (l *linear) Out() int     { return l.out }
func (l *linear) In() int      { return l.in }
func (l *linear) Name() string { return l.name }

// PrepareLinear implements backend.Backend.
func (b *Backend) PrepareLinear(cl *checkpoint.Linear) (backend.Linear, error) {
	sCols, quant, err := backend.CheckPrepareLinear(cl)
	if err != nil {
		return nil, fmt.Errorf("prepare linear: %w", err)
	}
	l := &linear{name: cl.Name, out: cl.Out, in: cl.In, format: cl.Format, quant: quant, scale2: cl.Scale2, sCols: sCols}
	if l.w, err = b.upload(cl.Weight.Data); err != nil {
		return nil, fmt.Errorf("prepare linear %s: %w", cl.Name, err)
	}
	if quant {
		if l.scale, err = b.upload(cl.Scale.Data); err != nil {
			l.w.Free()
			return nil, fmt.Errorf("prepare linear %s scale: %w", cl.Name, err)
		}
	}
	return l, nil
}

// vec is an fp32 parameter vector on the device; host keeps a copy for the
// few ops that need scalars on the host.
type vec struct {
	host []float32
	buf  *cuda.Buffer
}

func (v *vec) Len() int { return len(v.host) }

func (b *Backend) newVec(name string, v []float32) (*vec, error) {
	buf, err := b.upload(cuda.Bytes(v))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &vec{host: v, buf: buf}, nil
}

// PrepareVec implements backend.Backend.
func (b *Backend) PrepareVec(name string, t safetensors.Tensor, n int) (backend.Vec, error) {
	v, err := backend.Floats(name, t, n)
	if err != nil {
		return nil, err
	}
	return b.newVec(name, v)
}

// NewVec uploads values as a prepared vector (tests).
func (b *Backend) NewVec(v []float32) (backend.Vec, error) { return b.newVec("vec", v) }

type mat struct {
	rows, cols int
	buf        *cuda.Buffer
}

func (m *mat) Rows() int { return m.rows }
func (m *mat) Cols() int { return m.cols }

// PrepareMat implements backend.Backend.
func (b *Backend) PrepareMat(name string, t safetensors.Tensor, rows, cols int) (backend.Mat, error) {
	v, err := backend.Floats(name, t, rows*cols)
	if err != nil {
		return nil, err
	}
	return b.NewMat(rows, cols, v)
}

// NewMat uploads values as a prepared matrix (tests).
func (b *Backend) NewMat(rows, cols int, v []float32) (backend.Mat, error) {
	if len(v) != rows*cols {
		return nil, fmt.Errorf("mat: %d values for %dx%d", len(v), rows, cols)
	}
	buf, err := b.upload(cuda.Bytes(v))
	if err != nil {
		return nil, err
	}
	return &mat{rows, cols, buf}, nil
}

// hc is one hyper-connection site: fn [mix, width] and base [mix] on the
// device, the 1 or 3 scales as kernel arguments.
type hc struct {
	mix, width int
	fn, base   *cuda.Buffer
	scale      []float32
}

func (h *hc) Mix() int    { return h.mix }
func (h *hc) Width() int  { return h.width }
func (h *hc) Scales() int { return len(h.scale) }

// PrepareHC implements backend.Backend.
func (b *Backend) PrepareHC(name string, p checkpoint.HC, mix, width int) (backend.HC, error) {
	fn, base, scale, err := backend.HCParams(name, p, mix, width)
	if err != nil {
		return nil, err
	}
	return b.NewHC(mix, width, fn, base, scale)
}

// NewHC uploads hc parameters (tests).
func (b *Backend) NewHC(mix, width int, fn, base, scale []float32) (backend.HC, error) {
	if len(fn) != mix*width || len(base) != mix || (len(scale) != 1 && len(scale) != 3) {
		return nil, fmt.Errorf("hc: %d fn, %d base, %d scale values for mix %d width %d", len(fn), len(base), len(scale), mix, width)
	}
	f, err := b.upload(cuda.Bytes(fn))
	if err != nil {
		return nil, err
	}
	bs, err := b.upload(cuda.Bytes(base))
	if err != nil {
		f.Free()
		return nil, err
	}
	return &hc{mix: mix, width: width, fn: f, base: bs, scale: scale}, nil
}

// embedding is the token table on the device, bf16 (bf16=true) or fp32.
type embedding struct {
	vocab, dim int
	bf16       bool
	buf        *cuda.Buffer
}

func (e *embedding) Vocab() int { return e.vocab }
func (e *embedding) Dim() int   { return e.dim }

// PrepareEmbedding implements backend.Backend.
func (b *Backend) PrepareEmbedding(t safetensors.Tensor, vocab, dim int) (backend.Embedding, error) {
	data, f, err := backend.EmbeddingData(t, vocab, dim)
	if err != nil {
		return nil, err
	}
	e := &embedding{vocab: vocab, dim: dim, bf16: data != nil}
	if f != nil {
		data = cuda.Bytes(f)
	}
	buf, err := b.upload(data)
	if err != nil {
		return nil, fmt.Errorf("embed.weight: %w", err)
	}
	e.buf = buf
	return e, nil
}

// idTable is an int32 table on the device with a host copy (validation).
type idTable struct {
	rows, cols int
	host       []int32
	maxV       int32
	buf        *cuda.Buffer
}

func (t *idTable) Rows() int { return t.rows }
func (t *idTable) Cols() int { return t.cols }

// PrepareIDTable implements backend.Backend.
func (b *Backend) PrepareIDTable(name string, t safetensors.Tensor, rows, cols int) (backend.IDTable, error) {
	v, err := backend.IDs(name, t, rows, cols)
	if err != nil {
		return nil, err
	}
	return b.NewIDTable(name, rows, cols, v)
}

// NewIDTable uploads an id table (tests).
func (b *Backend) NewIDTable(name string, rows, cols int, v []int64) (backend.IDTable, error) {
	if len(v) != rows*cols {
		return nil, fmt.Errorf("%s: %d values for %dx%d", name, len(v), rows, cols)
	}
	out := make([]int32, len(v))
	maxV := int32(-1)
	for i, x := range v {
		if x < 0 || x > math.MaxInt32 {
			return nil, fmt.Errorf("%s: value %d at %d out of range", name, x, i)
		}
		out[i] = int32(x)
		maxV = max(maxV, out[i])
	}
	buf, err := b.upload(cuda.Bytes(out))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &idTable{rows: rows, cols: cols, host: out, maxV: maxV, buf: buf}, nil
}
