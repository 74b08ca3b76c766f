package kcheck

import (
	"encoding/binary"
	"math"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
)

// GemvFP8Case checks the decode GEMV (cuda.LinearF32Kernel at m <= 8 rows)
// on FP8 block-scaled weights [n, k] in groups of r output rows, each group
// reading its own k columns of x (the attention's grouped output projection
// wo_a), bf16-rounded outputs. Reference: float64 sums of the dequantised
// products; the GPU sums in fp32, so LimitFP32.
func GemvFP8Case(m, n, k, r int) Case {
	return Case{Component: "gemv_fp8", Shape: shapeStr("%dx%dx%d/%d", m, n, k, r), Run: func(env *Env) Result {
		res := Result{Component: "gemv_fp8", Shape: shapeStr("m=%d n=%d k=%d r=%d", m, n, k, r), Limit: LimitFP32}
		rng := env.rng()
		groups, sCols := n/r, k/128
		ldx := groups * k
		x := make([]float32, m*ldx)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		w := make([]byte, n*k)
		randomBytes(rng, w, weightCode)
		ws := make([]byte, ((n+127)/128)*sCols)
		for i := range ws {
			ws[i] = byte(120 + rng.IntN(10))
		}
		xb := make([]byte, 4*len(x))
		for i, v := range x {
			binary.LittleEndian.PutUint32(xb[4*i:], math.Float32bits(v))
		}
		b := &bufs{env: env}
		defer b.free()
		dx, dw, dws := b.upload(xb), b.upload(w), b.upload(ws)
		dy := b.alloc(4 * m * n)
		b.poison(dy, 4*m*n)
		sh := cuda.LinearShape{M: m, N: n, K: k, R: r, LdX: ldx, Format: cuda.WeightFP8Block, SCols: sCols}
		run := func() error { return cuda.LinearF32Kernel(env.S, dy, dx, dw, dws, sh, true) }
		if b.err == nil {
			res.Err = run()
		}
		got := make([]byte, 4*m*n)
		b.download(got, dy)
		if res.Err == nil && b.err == nil {
			var st ErrStats
			for row := 0; row < m; row++ {
				for o := 0; o < n; o++ {
					xr := x[row*ldx+(o/r)*k:]
					sum := 0.0
					for j := 0; j < k; j++ {
						sc := float64(cpuref.E8M0ToF32(ws[(o/128)*sCols+j/128]))
						sum += float64(xr[j]) * float64(cpuref.E4M3ToF32(w[o*k+j])) * sc
					}
					g := float64(math.Float32frombits(binary.LittleEndian.Uint32(got[4*(row*n+o):])))
					res.Checked++
					if math.IsNaN(g) || math.IsInf(g, 0) {
						res.NonFinite++
						continue
					}
					st.Add(float64(cpuref.BF16ToF32(cpuref.F32ToBF16(float32(sum)))), g)
				}
			}
			res.Cos, res.RelErr, res.MaxAbs = st.Cos(), st.Rel(), st.MaxAbs
			res.TimeUs, res.Err = timeIt(env, run)
			res.GBs = float64(4*m*ldx + n*k + len(ws) + 4*m*n)
			res.TFLOPs = 2 * float64(m) * float64(n) * float64(k)
		}
		return finish(res, b)
	}}
}
