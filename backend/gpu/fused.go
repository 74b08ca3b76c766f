package gpu

import (
	"github.com/megamoe/megamoe/backend"
)

// NormLinears implements backend.Backend: where a linear of ws runs FP8 on
// tensor cores, the norm's kernel also writes the quantisation they share.
func (b *Backend) NormLinears(x backend.Tensor, w backend.Vec, eps float32, normed backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	in, err := b.RMSNormQuant(x, w, eps, normed, ws)
	if err != nil {
		return err
	}
	return b.linearsFrom(in, normed, ws, outs)
}

// HcPreNormLinears implements backend.Backend: the norm (and the linears'
// quantisation) run inside hc pre's final kernel where it fuses.
func (b *Backend) HcPreNormLinears(x backend.Tensor, hc backend.HC, a backend.HcArgs, norm backend.Vec, eps float32, normed, mix backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	pre := b.Empty(normed.Rows(), normed.Cols(), backend.F32)
	defer b.Free(pre)
	in, err := b.hcPreNorm(x, hc, a, norm, eps, pre, normed, mix, ws)
	if err != nil {
		return err
	}
	return b.linearsFrom(in, normed, ws, outs)
}

// SwiGLULinear implements backend.Backend as NormLinears, with swiglu_quant.
func (b *Backend) SwiGLULinear(g, u backend.Tensor, limit float32, h backend.Tensor, w backend.Linear, out backend.Tensor) error {
	ws := []backend.Linear{w}
	in, err := b.SwiGLUQuant(g, u, limit, h, ws)
	if err != nil {
		return err
	}
	return b.linearsFrom(in, h, ws, []backend.Tensor{out})
}

// linearsFrom runs the linears from in, a quantised handle of t or t
// itself, and frees the handle.
func (b *Backend) linearsFrom(in, t backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	if in != t {
		defer b.Free(in)
	}
	if len(ws) == 0 {
		return nil
	}
	return b.Linears(in, ws, outs)
}
