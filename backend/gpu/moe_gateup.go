package gpu

import "github.com/megamoe/megamoe/cuda"

// gateUpArgs are the operands of the fused w1/w3 GEMM (cuda.MoEGateUpSwiGLU)
// for nk permuted rows: w13 stacked (w3's rows inter after w1's in every
// expert), or w1 and w3 apart.
func (e *experts) gateUpArgs(hq, hs, xq, xs, perm, weights cuda.DevicePtr, nk int, limit float32, scratch cuda.DevicePtr, tl cuda.MoETileList) cuda.MoEGateUpArgs {
	a := cuda.MoEGateUpArgs{HQ: hq, HS: hs, XQ: xq, XS: xs, Perm: perm, Weights: weights, Limit: limit, Scratch: scratch, Tiles: tl,
		Shape: cuda.MoEShape{Experts: e.count, Rows: nk, N: e.inter, K: e.dim, Format: e.format}}
	gs := func(p *proj) cuda.DevicePtr {
		if p.gscale == nil {
			return 0
		}
		return p.gscale.Ptr
	}
	if p := &e.w13; p.w != nil {
		blk := 32
		if e.format == cuda.NVFP4 {
			blk = 16
		}
		a.W1, a.S1, a.G1 = p.w.Ptr, p.scale.Ptr, gs(p)
		a.W3, a.S3, a.G3 = p.w.Ptr.Add(e.inter*e.dim/2), p.scale.Ptr.Add(e.inter*e.dim/blk), a.G1
		a.Stride = 2 * e.inter
		return a
	}
	a.W1, a.S1, a.G1 = e.w1.w.Ptr, e.w1.scale.Ptr, gs(&e.w1)
	a.W3, a.S3, a.G3 = e.w3.w.Ptr, e.w3.scale.Ptr, gs(&e.w3)
	a.Stride = e.inter
	return a
}
