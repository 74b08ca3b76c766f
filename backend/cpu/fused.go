package cpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
)

// The fused ops are their definitions on the CPU: the parts in order.

// Linears implements backend.Backend.
func (b *Backend) Linears(x backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	if err := backend.CheckLinears(x, ws, outs); err != nil {
		return err
	}
	for i, w := range ws {
		if err := b.Linear(x, w, outs[i]); err != nil {
			return err
		}
	}
	return nil
}

// NormLinears implements backend.Backend.
func (b *Backend) NormLinears(x backend.Tensor, w backend.Vec, eps float32, normed backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	if err := b.RMSNorm(x, w, eps, normed); err != nil {
		return err
	}
	return b.Linears(normed, ws, outs)
}

// HcPreNormLinears implements backend.Backend.
func (b *Backend) HcPreNormLinears(x backend.Tensor, hc backend.HC, a backend.HcArgs, norm backend.Vec, eps float32, normed, mix backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	pre := b.Empty(normed.Rows(), normed.Cols(), backend.F32)
	if err := b.HcPre(x, hc, a, pre, mix); err != nil {
		return fmt.Errorf("hc pre: %w", err)
	}
	if err := b.RMSNorm(pre, norm, eps, normed); err != nil {
		return fmt.Errorf("rmsnorm: %w", err)
	}
	return b.Linears(normed, ws, outs)
}

// SwiGLULinear implements backend.Backend.
func (b *Backend) SwiGLULinear(g, u backend.Tensor, limit float32, h backend.Tensor, w backend.Linear, out backend.Tensor) error {
	if err := b.SwiGLU(g, u, limit, h); err != nil {
		return err
	}
	return b.Linear(h, w, out)
}

// HeadNormRope implements backend.Backend.
func (b *Backend) HeadNormRope(x backend.Tensor, eps float32, a backend.RopeArgs, bt *backend.Batch) error {
	if err := b.HeadNorm(x, a.HeadDim, eps); err != nil {
		return err
	}
	return b.Rope(x, a, bt)
}

// RopeHadamardFP4 implements backend.Backend.
func (b *Backend) RopeHadamardFP4(x backend.Tensor, a backend.RopeArgs, bt *backend.Batch) error {
	if err := b.Rope(x, a, bt); err != nil {
		return err
	}
	return b.HadamardFP4(x, a.HeadDim)
}

// NormRopeKVQuant implements backend.Backend.
func (b *Backend) NormRopeKVQuant(x backend.Tensor, w backend.Vec, eps float32, a backend.RopeArgs, nope, block int, bt *backend.Batch, out backend.Tensor) error {
	if err := b.RMSNorm(x, w, eps, out); err != nil {
		return err
	}
	if err := b.Rope(out, a, bt); err != nil {
		return err
	}
	return b.KVQuant(out, nope, block)
}

// ExpertsCombinePost implements backend.Backend.
func (b *Backend) ExpertsCombinePost(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, shared, out, x, mix backend.Tensor, h backend.HcArgs) error {
	if err := b.ExpertsCombine(f, e, weights, ids, a, shared, out); err != nil {
		return err
	}
	return b.HcPost(out, x, mix, h, x)
}

// ExpertsCombine implements backend.Backend.
func (b *Backend) ExpertsCombine(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, shared, out backend.Tensor) error {
	acc := b.Empty(out.Rows(), out.Cols(), backend.F32)
	if err := b.Experts(f, e, weights, ids, a, acc); err != nil {
		return err
	}
	return b.Combine(acc, shared, out)
}

// Fork implements backend.Backend: the CPU runs fn at once.
func (b *Backend) Fork(rows int, bt *backend.Batch, fn func() error) error { return fn() }

// Join implements backend.Backend.
func (b *Backend) Join() error { return nil }

// RecordStep implements backend.Backend: every step runs eagerly.
func (b *Backend) RecordStep(bt *backend.Batch, ids []int32, forward func() ([]backend.Tensor, error)) ([]backend.Tensor, error) {
	return forward()
}
