package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
)

var weightFormat = map[checkpoint.Format]cuda.WeightFormat{
	checkpoint.FormatF32: cuda.WeightF32, checkpoint.FormatBF16: cuda.WeightBF16,
	checkpoint.FormatFP8Block: cuda.WeightFP8Block, checkpoint.FormatMXFP4: cuda.WeightMXFP4,
	checkpoint.FormatNVFP4: cuda.WeightNVFP4,
}

// linArgs checks the arguments of a linear op (what: "linear" or
// "linear-f32") and returns their gpu handles.
func (b *Backend) linArgs(x backend.Tensor, w backend.Linear, out backend.Tensor, what string) (*Tensor, *linear, *Tensor, error) {
	check := backend.CheckLinear
	if what == "linear-f32" {
		check = backend.CheckLinearF32
	}
	l, t, err := backend.Args[*linear, *Tensor](check(x, w, out), what, w, x, out)
	if err != nil {
		return nil, nil, nil, err
	}
	return t[0], l, t[1], nil
}

// shape is l applied to m rows of stride ldx in `groups` groups, and its
// scale grid (0 without one).
func (l *linear) shape(m, groups, ldx int) (cuda.LinearShape, cuda.DevicePtr) {
	var ws cuda.DevicePtr
	if l.scale != nil {
		ws = l.scale.Ptr
	}
	return cuda.LinearShape{M: m, N: l.out, K: l.in, R: l.out / groups, LdX: ldx, Format: weightFormat[l.format],
		Scale2: l.scale2, SCols: l.sCols}, ws
}

// simt runs the fp32 SIMT linear on x (rows of stride ldx) in `groups` groups.
func (b *Backend) simt(y, x cuda.DevicePtr, l *linear, m, groups, ldx int, rnd bool) error {
	sh, ws := l.shape(m, groups, ldx)
	if err := cuda.LinearF32Kernel(b.s, y, x, l.w.Ptr, ws, sh, rnd); err != nil {
		return fmt.Errorf("linear %s: %w", l.name, err)
	}
	return nil
}

// Linear implements backend.Backend. Faithful FP8 weights run on tensor cores
// (FP8 activation quant per 128, block-scaled mma, bf16 out); other quantised
// formats quantise x to simulated FP8 and use the SIMT kernel; exact mode and
// bf16/fp32 weights use the SIMT kernel on x as is.
func (b *Backend) Linear(x backend.Tensor, w backend.Linear, out backend.Tensor) error {
	xt, l, ot, err := b.linArgs(x, w, out, "linear")
	if err != nil {
		return err
	}
	m := xt.rows
	if m == 0 {
		return nil
	}
	if !l.quant && l.format == checkpoint.FormatBF16 && m > bf16MinRows {
		// bf16 weights (the indexer's weights_proj): the fp32 linear on tensor
		// cores (every product exact), then faithful mode's bf16 rounding.
		if err := b.linearF32(ot.ptr, xt.ptr, l, m); err != nil {
			return err
		}
		if b.faithful() {
			return cuda.ScaleF32(b.s, ot.ptr, 1, int64(m*l.out), true)
		}
		return nil
	}
	if !l.quant || !b.faithful() {
		return b.simt(ot.ptr, xt.ptr, l, m, 1, l.in, b.faithful())
	}
	if l.tensorCoreFP8() {
		return b.linearFP8(xt, l, ot)
	}
	sim, err := b.scratch(4 * m * l.in)
	if err != nil {
		return err
	}
	defer sim.Free()
	if err := cuda.QuantFP8F32(b.s, 0, 0, sim.Ptr, xt.ptr, m, l.in, l.in, 128); err != nil {
		return err
	}
	return b.simt(ot.ptr, sim.Ptr, l, m, 1, l.in, true)
}

// tensorCoreFP8 reports whether faithful Linear runs l on the FP8 tensor-core path.
func (l *linear) tensorCoreFP8() bool {
	return l.quant && l.format == checkpoint.FormatFP8Block && l.in%128 == 0 && l.out%8 == 0
}

// linearFP8 quantises x to e4m3 codes and runs the tensor-core FP8 GEMM.
func (b *Backend) linearFP8(xt *Tensor, l *linear, ot *Tensor) error {
	return b.linearsFP8(xt, []*linear{l}, []*Tensor{ot})
}

// linearsFP8 quantises x once (or takes the copy it carries) and runs the
// FP8 GEMM of every ls[i] into ots[i] (the GEMMs run one after another on
// the stream, so they share the bf16 staging and split-K scratch); two
// decode-shaped neighbours of one CTA size run as one launch.
func (b *Backend) linearsFP8(xt *Tensor, ls []*linear, ots []*Tensor) error {
	m, k := xt.rows, xt.cols
	yBytes, split := 0, 0
	for _, l := range ls {
		yBytes = max(yBytes, (2*m*l.out+255)&^255)
		split = max(split, cuda.LinearFP8ScratchBytes(b.s, m, l.out, k))
	}
	qBytes := 0
	if xt.q8 == nil {
		qBytes = fp8Bytes(m, k)
	}
	tmp, err := b.scratch(qBytes + yBytes + split + 512)
	if err != nil {
		return err
	}
	defer tmp.Free()
	var q, qs cuda.DevicePtr
	if xt.q8 != nil {
		q, qs = fp8Layout(xt.q8.Ptr, m, k)
	} else {
		q, qs = fp8Layout(tmp.Ptr, m, k)
		if err := cuda.QuantFP8F32(b.s, q, qs, 0, xt.ptr, m, k, k, 128); err != nil {
			return err
		}
	}
	y := tmp.Ptr.Add(qBytes)
	var part cuda.DevicePtr
	if split > 0 {
		part = y.Add(yBytes)
	}
	for i := 0; i < len(ls); i++ {
		if i+1 < len(ls) {
			l0, l1 := ls[i], ls[i+1]
			ok, err := cuda.LinearFP8PairF32(b.s, q, qs, m, k, cuda.DecLinear{YF: ots[i].ptr, W: l0.w.Ptr, WS: l0.scale.Ptr, N: l0.out},
				cuda.DecLinear{YF: ots[i+1].ptr, W: l1.w.Ptr, WS: l1.scale.Ptr, N: l1.out})
			if err != nil {
				return fmt.Errorf("linears %s|%s: %w", l0.name, l1.name, err)
			}
			if ok {
				i++
				continue
			}
		}
		l := ls[i]
		if err := cuda.LinearFP8F32(b.s, ots[i].ptr, y, q, qs, l.w.Ptr, l.scale.Ptr, m, l.out, k, part); err != nil {
			return fmt.Errorf("linear %s: %w", l.name, err)
		}
	}
	return nil
}

// fp8Bytes is the size of m x k FP8 activations with their scales per 128
// (k % 128 == 0), laid out by fp8Layout.
func fp8Bytes(m, k int) int { return m*k + (m*(k/128)+255)&^255 }

// fp8Layout places the e4m3 codes [m, k] and e8m0 scales [m, k/128] at base.
func fp8Layout(base cuda.DevicePtr, m, k int) (q, qs cuda.DevicePtr) { return base, base.Add(m * k) }

// Linears implements backend.Backend: in faithful mode the FP8
// tensor-core linears of x share one quantisation; the others run as Linear.
func (b *Backend) Linears(x backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	if err := backend.CheckLinears(x, ws, outs); err != nil {
		return err
	}
	var (
		xt  *Tensor
		fls []*linear
		fos []*Tensor
	)
	for i, w := range ws {
		t, l, ot, err := b.linArgs(x, w, outs[i], "linear")
		if err != nil {
			return err
		}
		if !b.faithful() || !l.tensorCoreFP8() {
			if err := b.Linear(x, w, outs[i]); err != nil {
				return err
			}
			continue
		}
		xt = t
		fls, fos = append(fls, l), append(fos, ot)
	}
	if len(fls) == 0 || xt.rows == 0 {
		return nil
	}
	return b.linearsFP8(xt, fls, fos)
}

// LinearF32 implements backend.Backend.
func (b *Backend) LinearF32(x backend.Tensor, w backend.Linear, out backend.Tensor) error {
	xt, l, ot, err := b.linArgs(x, w, out, "linear-f32")
	if err != nil {
		return err
	}
	return b.linearF32(ot.ptr, xt.ptr, l, xt.rows)
}

// linearF32 is the fp32 linear y[m, :] = x[m, :] · Wᵀ (no rounding): up to
// gemvRowsMax rows the SIMT GEMV (bf16 weights at 2-4 rows on gemvr: each
// weight read once for all rows, and each row's outputs bit for bit those of
// the 1-row kernel, so a verification row's logits equal plain decoding's at
// batch 1); from 5 rows, bf16 weights on tensor cores, x split exactly into
// three bf16 parts (every product exact); otherwise the SIMT kernels.
func (b *Backend) linearF32(y, x cuda.DevicePtr, l *linear, m int) error {
	sh, _ := l.shape(m, 1, l.in)
	if m > gemvRowsMax && sh.Format == cuda.WeightBF16 && cuda.BF16x3DecFits(sh, x, l.w.Ptr) {
		part, err := b.decPartials(sh)
		if err != nil {
			return err
		}
		defer part.Free()
		if err := cuda.LinearF32BF16x3Dec(b.s, y, x, l.w.Ptr, part.Ptr, sh); err != nil {
			return fmt.Errorf("linear-f32 %s: %w", l.name, err)
		}
		return nil
	}
	if m > bf16MinRows {
		if sh.Format == cuda.WeightBF16 && cuda.BF16GroupedFits(sh, x, l.w.Ptr) {
			if err := cuda.LinearF32BF16x3(b.s, y, x, l.w.Ptr, sh); err != nil {
				return fmt.Errorf("linear-f32 %s: %w", l.name, err)
			}
			return nil
		}
	}
	return b.simt(y, x, l, m, 1, l.in, false)
}

// GroupedOutProj implements backend.Backend.
func (b *Backend) GroupedOutProj(x backend.Tensor, w backend.Linear, groups int, out backend.Tensor) error {
	l, t, err := backend.Args[*linear, *Tensor](backend.CheckGroupedOutProj(x, w, groups, out), "grouped out proj", w, x, out)
	if err != nil {
		return err
	}
	xt, ot := t[0], t[1]
	if b.faithful() {
		// Faithful inputs are bf16 values: the tensor-core kernels form the same
		// products (docs/numerics.md); decode-sized steps stream the weights.
		sh, ws := l.shape(xt.rows, groups, groups*l.in)
		if cuda.BF16DecFits(sh, xt.ptr, l.w.Ptr) {
			part, err := b.decPartials(sh)
			if err != nil {
				return err
			}
			defer part.Free()
			if err := cuda.GroupedLinearBF16Dec(b.s, ot.ptr, xt.ptr, l.w.Ptr, ws, part.Ptr, sh); err != nil {
				return fmt.Errorf("grouped out proj %s: %w", l.name, err)
			}
			return nil
		}
		if xt.rows > bf16MinRows && cuda.BF16GroupedFits(sh, xt.ptr, l.w.Ptr) {
			if err := cuda.GroupedLinearBF16(b.s, ot.ptr, xt.ptr, l.w.Ptr, ws, sh); err != nil {
				return fmt.Errorf("grouped out proj %s: %w", l.name, err)
			}
			return nil
		}
	}
	return b.simt(ot.ptr, xt.ptr, l, xt.rows, groups, groups*l.in, b.faithful())
}

// decPartials is scratch for linear_bf16_dec's split-K partials of sh (a
// minimal buffer when it needs none).
func (b *Backend) decPartials(sh cuda.LinearShape) (*cuda.Buffer, error) {
	return b.scratch(cuda.BF16DecScratchBytes(b.s, sh))
}

// bf16MinRows: up to this many rows the bf16-weight linears (grouped output
// projection, fp32 linears, weights_proj) stay on the GEMV kernels (decode),
// which stream the weights once; above it they take the tensor cores.
const bf16MinRows = 8

// gemvRowsMax: up to this many rows the fp32 linears stay on gemvr; above,
// linear_bf16x3_dec reads the head faster (H100: 8 rows 405 against 475 µs,
// 4 rows 398 against 402, 2 rows 394 against 373).
const gemvRowsMax = 4
