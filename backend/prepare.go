package backend

import (
	"fmt"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/safetensors"
)

// The checks (and host-side reads) of weight preparation that every
// backend shares; a backend only stores or uploads what they return.

// CheckBytes checks that the checkpoint tensor t holds n bytes.
func CheckBytes(name string, t safetensors.Tensor, n int) error {
	if len(t.Data) != n {
		return fmt.Errorf("%s: %d bytes, want %d (%s %v)", name, len(t.Data), n, t.DType, t.Shape)
	}
	return nil
}

// CheckPrepareLinear checks a checkpoint linear's shape and, for its format,
// the sizes of its weight and scale grid. It returns the grid's columns and
// whether the format is quantised (FP8/FP4, whose input faithful mode
// FP8-quantises).
func CheckPrepareLinear(cl *checkpoint.Linear) (sCols int, quant bool, err error) {
	if cl == nil {
		return 0, false, fmt.Errorf("nil weight")
	}
	if cl.Out <= 0 || cl.In <= 0 {
		return 0, false, fmt.Errorf("linear %s: shape %dx%d", cl.Name, cl.Out, cl.In)
	}
	n := cl.Out * cl.In
	switch cl.Format {
	case checkpoint.FormatBF16:
		err = CheckBytes(cl.Name, cl.Weight, 2*n)
	case checkpoint.FormatF32:
		err = CheckBytes(cl.Name, cl.Weight, 4*n)
	case checkpoint.FormatFP8Block:
		quant = true
		sCols = (cl.In + 127) / 128
		if err = CheckBytes(cl.Name, cl.Weight, n); err == nil {
			err = CheckBytes(cl.Name+".scale", cl.Scale, (cl.Out+127)/128*sCols)
		}
	case checkpoint.FormatMXFP4, checkpoint.FormatNVFP4:
		quant = true
		blk := 32
		if cl.Format == checkpoint.FormatNVFP4 {
			blk = 16
		}
		if cl.In%blk != 0 {
			return 0, false, fmt.Errorf("linear %s: in %d not a multiple of %d", cl.Name, cl.In, blk)
		}
		sCols = cl.In / blk
		if err = CheckBytes(cl.Name, cl.Weight, n/2); err == nil {
			err = CheckBytes(cl.Name+".scale", cl.Scale, cl.Out*sCols)
		}
	default:
		return 0, false, fmt.Errorf("linear %s: unsupported format %v", cl.Name, cl.Format)
	}
	return sCols, quant, err
}

// CheckPrepareExpert checks routed expert i of layer `name`: each linear as
// CheckPrepareLinear does, and w1, w3 [inter, dim], w2 [dim, inter].
func CheckPrepareExpert(name string, i int, e *checkpoint.Expert, dim, inter int) error {
	ls := []*checkpoint.Linear{&e.W1, &e.W2, &e.W3}
	for _, cl := range ls {
		if _, _, err := CheckPrepareLinear(cl); err != nil {
			return fmt.Errorf("%s expert %d: prepare linear: %w", name, i, err)
		}
	}
	if ls[0].Out != inter || ls[0].In != dim || ls[2].Out != inter || ls[2].In != dim || ls[1].Out != dim || ls[1].In != inter {
		return fmt.Errorf("%s expert %d: shapes w1 %dx%d w2 %dx%d w3 %dx%d, want inter %d dim %d",
			name, i, ls[0].Out, ls[0].In, ls[1].Out, ls[1].In, ls[2].Out, ls[2].In, inter, dim)
	}
	return nil
}

// Floats returns the n values of the checkpoint parameter t (any float
// dtype) as fp32.
func Floats(name string, t safetensors.Tensor, n int) ([]float32, error) {
	if !t.Valid() {
		return nil, fmt.Errorf("%s: missing tensor", name)
	}
	if t.Numel() != n {
		return nil, fmt.Errorf("%s: %d elements (%v), want %d", name, t.Numel(), t.Shape, n)
	}
	v, err := t.Float32s()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}

// HCParams returns an hc site's fn [mix·width], base [mix] and scale (3
// values, or 1 for the head's site).
func HCParams(name string, p checkpoint.HC, mix, width int) (fn, base, scale []float32, err error) {
	if fn, err = Floats(name+"_fn", p.Fn, mix*width); err != nil {
		return nil, nil, nil, err
	}
	if base, err = Floats(name+"_base", p.Base, mix); err != nil {
		return nil, nil, nil, err
	}
	ns := 3
	if p.Scale.Numel() == 1 {
		ns = 1
	}
	if scale, err = Floats(name+"_scale", p.Scale, ns); err != nil {
		return nil, nil, nil, err
	}
	return fn, base, scale, nil
}

// EmbeddingData returns the vocab×dim token table t: its bf16 bytes as
// they are, or (other float dtypes) its values as fp32.
func EmbeddingData(t safetensors.Tensor, vocab, dim int) (bf16 []byte, f []float32, err error) {
	if t.DType == safetensors.BF16 {
		if err := CheckBytes("embed.weight", t, 2*vocab*dim); err != nil {
			return nil, nil, err
		}
		return t.Data, nil, nil
	}
	f, err = Floats("embed.weight", t, vocab*dim)
	return nil, f, err
}

// IDs returns the rows×cols values of the checkpoint int table t.
func IDs(name string, t safetensors.Tensor, rows, cols int) ([]int64, error) {
	if t.Numel() != rows*cols {
		return nil, fmt.Errorf("%s: %d elements (%v), want %dx%d", name, t.Numel(), t.Shape, rows, cols)
	}
	v, err := t.Int64s()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}
