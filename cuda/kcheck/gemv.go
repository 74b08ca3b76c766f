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

// GemvMMACase checks linear_bf16_dec (cuda.GroupedLinearBF16Dec): the
// grouped linear of GemvFP8Case on bf16-valued x (faithful mode's), with
// FP8 block-scaled (fmt WeightFP8Block) or bf16 weights, on tensor cores.
// Every product is exact and only the fp32 summation order differs from
// the float64 reference, so each output must be bf16-valued and within a
// bf16 ulp plus 2^-20·Σ|products| (a loose fp32 summation bound) of it
// (Mismatch counts the others): a wrong weight, scale or K slot is far off.
func GemvMMACase(m, n, k, r int, f cuda.WeightFormat) Case {
	comp := "gemv_mma_" + map[cuda.WeightFormat]string{cuda.WeightBF16: "bf16", cuda.WeightFP8Block: "fp8"}[f]
	return Case{Component: comp, Shape: shapeStr("%dx%dx%d/%d", m, n, k, r), Run: func(env *Env) Result {
		res := Result{Component: comp, Shape: shapeStr("m=%d n=%d k=%d r=%d", m, n, k, r), Limit: LimitFP32}
		rng := env.rng()
		groups, sCols := n/r, k/128
		ldx := groups * k
		x := make([]float32, m*ldx)
		for i, h := range randBF16(rng, m, ldx) {
			x[i] = cpuref.BF16ToF32(h)
		}
		var w, ws []byte
		wv := func(o, j int) float64 { // the dequantised weight
			if f == cuda.WeightBF16 {
				return float64(cpuref.BF16ToF32(binary.LittleEndian.Uint16(w[2*(o*k+j):])))
			}
			return float64(cpuref.E4M3ToF32(w[o*k+j])) * float64(cpuref.E8M0ToF32(ws[(o/128)*sCols+j/128]))
		}
		if f == cuda.WeightBF16 {
			w = make([]byte, 2*n*k)
			for i, h := range randBF16(rng, n, k) {
				binary.LittleEndian.PutUint16(w[2*i:], h)
			}
			ws = make([]byte, 16)
		} else {
			w = make([]byte, n*k)
			randomBytes(rng, w, weightCode)
			ws = make([]byte, ((n+127)/128)*sCols)
			for i := range ws {
				ws[i] = byte(120 + rng.IntN(10))
			}
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
		sh := cuda.LinearShape{M: m, N: n, K: k, R: r, LdX: ldx, Format: f, SCols: sCols}
		var part cuda.DevicePtr
		if nb := cuda.BF16DecScratchBytes(env.S, sh); nb > 0 {
			part = b.alloc(nb)
			b.poison(part, nb)
		}
		run := func() error { return cuda.GroupedLinearBF16Dec(env.S, dy, dx, dw, dws, part, sh) }
		if b.err == nil {
			res.Err = run()
		}
		got := make([]byte, 4*m*n)
		b.download(got, dy)
		if res.Err == nil && b.err == nil {
			var st ErrStats
			step := sampleStep(m, n, k)
			for row := 0; row < m; row++ {
				for o := row % step; o < n; o += step {
					xr := x[row*ldx+(o/r)*k:]
					sum, abs := 0.0, 0.0
					for j := 0; j < k; j++ {
						t := float64(xr[j]) * wv(o, j)
						sum, abs = sum+t, abs+math.Abs(t)
					}
					gb := binary.LittleEndian.Uint32(got[4*(row*n+o):])
					g := float64(math.Float32frombits(gb))
					res.Checked++
					if math.IsNaN(g) || math.IsInf(g, 0) {
						res.NonFinite++
						continue
					}
					want := float64(cpuref.BF16ToF32(cpuref.F32ToBF16(float32(sum))))
					if ulp := math.Ldexp(1, math.Ilogb(math.Abs(sum)+1e-38)-7); gb&0xffff != 0 || math.Abs(g-sum) > ulp+math.Ldexp(abs, -20) {
						res.Mismatch++
					}
					st.Add(want, g)
				}
			}
			res.Cos, res.RelErr, res.MaxAbs = st.Cos(), st.Rel(), st.MaxAbs
			res.TimeUs, res.Err = timeIt(env, run)
			res.GBs = float64(4*m*ldx + len(w) + len(ws) + 4*m*n)
			res.TFLOPs = 2 * float64(m) * float64(n) * float64(k)
		}
		return finish(res, b)
	}}
}

// sampleStep is the stride of the outputs a GEMV case checks: all of them up
// to 2^27 multiply-adds of float64 reference, then an odd stride (every
// output column is still reached across rows) that keeps it near that.
func sampleStep(m, n, k int) int {
	return max(1, m*n*k>>27) | 1
}

// GemvF32Case checks linear_bf16x3_dec (cuda.LinearF32BF16x3Dec; dec
// false: the SIMT GEMV, cuda.LinearF32Kernel) on the fp32 linear of bf16
// weights [n, k] and fp32 x that is not bf16-valued (the head, the
// compressor): fp32 outputs within 2^-20·Σ|products| (+2^-126) of the
// float64 sum (Mismatch counts the others).
func GemvF32Case(m, n, k int, dec bool) Case {
	comp := "gemv_f32_simt"
	if dec {
		comp = "gemv_f32_x3"
	}
	return Case{Component: comp, Shape: shapeStr("%dx%dx%d", m, n, k), Run: func(env *Env) Result {
		res := Result{Component: comp, Shape: shapeStr("m=%d n=%d k=%d", m, n, k), Limit: LimitFP32}
		rng := env.rng()
		x := make([]float32, m*k)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		w := make([]byte, 2*n*k)
		for i, h := range randBF16(rng, n, k) {
			binary.LittleEndian.PutUint16(w[2*i:], h)
		}
		xb := make([]byte, 4*len(x))
		for i, v := range x {
			binary.LittleEndian.PutUint32(xb[4*i:], math.Float32bits(v))
		}
		b := &bufs{env: env}
		defer b.free()
		dx, dw := b.upload(xb), b.upload(w)
		dy := b.alloc(4 * m * n)
		b.poison(dy, 4*m*n)
		sh := cuda.LinearShape{M: m, N: n, K: k, R: n, LdX: k, Format: cuda.WeightBF16}
		var part cuda.DevicePtr
		if nb := cuda.BF16DecScratchBytes(env.S, sh); dec && nb > 0 {
			part = b.alloc(nb)
			b.poison(part, nb)
		}
		run := func() error {
			if dec {
				return cuda.LinearF32BF16x3Dec(env.S, dy, dx, dw, part, sh)
			}
			return cuda.LinearF32Kernel(env.S, dy, dx, dw, 0, sh, false)
		}
		if b.err == nil {
			res.Err = run()
		}
		got := make([]byte, 4*m*n)
		b.download(got, dy)
		if res.Err == nil && b.err == nil {
			var st ErrStats
			step := sampleStep(m, n, k)
			for row := 0; row < m; row++ {
				for o := row % step; o < n; o += step {
					sum, abs := 0.0, 0.0
					for j := 0; j < k; j++ {
						t := float64(x[row*k+j]) * float64(cpuref.BF16ToF32(binary.LittleEndian.Uint16(w[2*(o*k+j):])))
						sum, abs = sum+t, abs+math.Abs(t)
					}
					g := float64(math.Float32frombits(binary.LittleEndian.Uint32(got[4*(row*n+o):])))
					res.Checked++
					if math.IsNaN(g) || math.IsInf(g, 0) {
						res.NonFinite++
						continue
					}
					if math.Abs(g-sum) > math.Ldexp(abs, -20)+0x1p-126 {
						res.Mismatch++
					}
					st.Add(sum, g)
				}
			}
			res.Cos, res.RelErr, res.MaxAbs = st.Cos(), st.Rel(), st.MaxAbs
			res.TimeUs, res.Err = timeIt(env, run)
			res.GBs = float64(4*m*k + len(w) + 4*m*n)
			res.TFLOPs = 2 * float64(m) * float64(n) * float64(k)
		}
		return finish(res, b)
	}}
}
