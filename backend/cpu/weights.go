package cpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/safetensors"
)

// linear is a prepared weight matrix.
type linear struct {
	name    string
	out, in int
	format  checkpoint.Format
	quant   bool      // FP8/FP4 weight: FP8 activation quant in faithful mode
	dense   []float32 // [out, in] if pre-dequantised
	w       []byte
	scale   []byte
	scale2  float32
	sCols   int // columns of the scale grid
}

func (l *linear) Out() int     { return l.out }
func (l *linear) In() int      { return l.in }
func (l *linear) Name() string { return l.name }

// row dequantises row r into dst (len in) exactly; returns dense row if available.
func (l *linear) row(r int, dst []float32) []float32 {
	if l.dense != nil {
		return l.dense[r*l.in : (r+1)*l.in]
	}
	in := l.in
	switch l.format {
	case checkpoint.FormatBF16:
		num.DecodeBF16(l.w[2*r*in:2*(r+1)*in], dst)
	case checkpoint.FormatF32:
		num.DecodeF32(l.w[4*r*in:4*(r+1)*in], dst)
	case checkpoint.FormatFP8Block:
		w := l.w[r*in : (r+1)*in]
		srow := l.scale[(r/128)*l.sCols:]
		for c0 := 0; c0 < in; c0 += 128 {
			s := num.E8M0ToF32(srow[c0/128])
			for c := c0; c < min(c0+128, in); c++ {
				dst[c] = num.E4M3Table[w[c]] * s
			}
		}
	case checkpoint.FormatMXFP4:
		w := l.w[r*(in/2) : (r+1)*(in/2)]
		srow := l.scale[r*l.sCols:]
		for c0 := 0; c0 < in; c0 += 32 {
			s := num.E8M0ToF32(srow[c0/32])
			for c := c0; c < min(c0+32, in); c += 2 {
				by := w[c/2]
				dst[c] = num.E2M1Table[by&0xf] * s
				dst[c+1] = num.E2M1Table[by>>4] * s
			}
		}
	case checkpoint.FormatNVFP4:
		w := l.w[r*(in/2) : (r+1)*(in/2)]
		srow := l.scale[r*l.sCols:]
		for c0 := 0; c0 < in; c0 += 16 {
			s := num.E4M3Table[srow[c0/16]] * l.scale2
			for c := c0; c < min(c0+16, in); c += 2 {
				by := w[c/2]
				dst[c] = num.E2M1Table[by&0xf] * s
				dst[c+1] = num.E2M1Table[by>>4] * s
			}
		}
	}
	return dst
}

// PrepareLinear implements backend.Backend.
func (b *Backend) PrepareLinear(cl *checkpoint.Linear) (backend.Linear, error) {
	sCols, quant, err := backend.CheckPrepareLinear(cl)
	if err != nil {
		return nil, fmt.Errorf("prepare linear: %w", err)
	}
	l := &linear{name: cl.Name, out: cl.Out, in: cl.In, format: cl.Format, quant: quant, w: cl.Weight.Data, scale: cl.Scale.Data,
		scale2: cl.Scale2, sCols: sCols}
	n := l.out * l.in
	bytes := int64(n) * 4
	b.mu.Lock()
	dense := b.budget >= bytes && int64(n) <= b.maxElems
	if dense {
		b.budget -= bytes
	}
	b.mu.Unlock()
	if dense {
		d := make([]float32, n)
		b.parallel(l.out, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				l.row(r, d[r*l.in:(r+1)*l.in])
			}
		})
		l.dense = d
	}
	return l, nil
}

type vec struct{ v []float32 }

func (v *vec) Len() int { return len(v.v) }

// PrepareVec implements backend.Backend.
func (b *Backend) PrepareVec(name string, t safetensors.Tensor, n int) (backend.Vec, error) {
	v, err := backend.Floats(name, t, n)
	if err != nil {
		return nil, err
	}
	return &vec{v}, nil
}

// NewVec wraps values as a prepared vector (tests).
func NewVec(v []float32) backend.Vec { return &vec{v} }

type mat struct {
	rows, cols int
	v          []float32
}

func (m *mat) Rows() int { return m.rows }
func (m *mat) Cols() int { return m.cols }

// PrepareMat implements backend.Backend.
func (b *Backend) PrepareMat(name string, t safetensors.Tensor, rows, cols int) (backend.Mat, error) {
	v, err := backend.Floats(name, t, rows*cols)
	if err != nil {
		return nil, err
	}
	return &mat{rows, cols, v}, nil
}

// NewMat wraps values as a prepared matrix (tests).
func NewMat(rows, cols int, v []float32) backend.Mat { return &mat{rows, cols, v} }

type hc struct {
	mix, width int
	fn         []float32 // [mix, width]
	base       []float32
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
	return &hc{mix, width, fn, base, scale}, nil
}

// NewHC wraps hc parameters (tests).
func NewHC(mix, width int, fn, base, scale []float32) backend.HC {
	return &hc{mix, width, fn, base, scale}
}

type embedding struct {
	vocab, dim int
	data       []byte // bf16 [vocab, dim]
	f          []float32
}

func (e *embedding) Vocab() int { return e.vocab }
func (e *embedding) Dim() int   { return e.dim }

func (e *embedding) row(id int, dst []float32) {
	if e.f != nil {
		copy(dst, e.f[id*e.dim:(id+1)*e.dim])
		return
	}
	num.DecodeBF16(e.data[2*id*e.dim:2*(id+1)*e.dim], dst)
}

// PrepareEmbedding implements backend.Backend.
func (b *Backend) PrepareEmbedding(t safetensors.Tensor, vocab, dim int) (backend.Embedding, error) {
	data, f, err := backend.EmbeddingData(t, vocab, dim)
	if err != nil {
		return nil, err
	}
	return &embedding{vocab: vocab, dim: dim, data: data, f: f}, nil
}

type idTable struct {
	rows, cols int
	v          []int32
}

func (t *idTable) Rows() int { return t.rows }
func (t *idTable) Cols() int { return t.cols }

// PrepareIDTable implements backend.Backend.
func (b *Backend) PrepareIDTable(name string, t safetensors.Tensor, rows, cols int) (backend.IDTable, error) {
	v, err := backend.IDs(name, t, rows, cols)
	if err != nil {
		return nil, err
	}
	out := make([]int32, len(v))
	for i, x := range v {
		if x < math.MinInt32 || x > math.MaxInt32 {
			return nil, fmt.Errorf("%s: value %d out of int32 range", name, x)
		}
		out[i] = int32(x)
	}
	return &idTable{rows, cols, out}, nil
}

type experts struct {
	dim, inter int
	w1, w2, w3 []*linear
}

func (e *experts) Count() int { return len(e.w1) }
func (e *experts) Inter() int { return e.inter }
func (e *experts) Dim() int   { return e.dim }

// PrepareExperts implements backend.Backend.
func (b *Backend) PrepareExperts(name string, ex []checkpoint.Expert, dim, inter int) (backend.Experts, error) {
	e := &experts{dim: dim, inter: inter}
	for i := range ex {
		if err := backend.CheckPrepareExpert(name, i, &ex[i], dim, inter); err != nil {
			return nil, err
		}
		var ls [3]*linear
		for k, cl := range []*checkpoint.Linear{&ex[i].W1, &ex[i].W2, &ex[i].W3} {
			l, err := b.PrepareLinear(cl)
			if err != nil {
				return nil, fmt.Errorf("%s expert %d: %w", name, i, err)
			}
			ls[k] = l.(*linear)
		}
		e.w1, e.w2, e.w3 = append(e.w1, ls[0]), append(e.w2, ls[1]), append(e.w3, ls[2])
	}
	return e, nil
}

var _ = binary.LittleEndian
