package kcheck

import (
	"encoding/binary"
	"math"
	"math/rand/v2"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
)

// gemvRun is what the decode-GEMV cases share: x (fp32 [m, ldx]) and the
// weight bytes uploaded, y [m, n] poisoned, one launch, the sampled outputs
// against their float64 dot products, then the timing.
type gemvRun struct {
	m, n, k, ldx int
	x            []float32
	w, ws        []byte
	partBytes    int // split-K scratch the launch needs (poisoned)
	launch       func(s *cuda.Stream, y, x, w, ws, part cuda.DevicePtr) error
	// dot is output (row, o)'s float64 sum and sum of |products|.
	dot func(row, o int) (sum, abs float64)
	// want is what ErrStats compares an output with; ok, when set, counts
	// the outputs it rejects as Mismatch.
	want func(sum float64) float64
	ok   func(g float64, bits uint32, sum, abs float64) bool
}

func (c gemvRun) run(env *Env, res Result) Result {
	xb := make([]byte, 4*len(c.x))
	for i, v := range c.x {
		binary.LittleEndian.PutUint32(xb[4*i:], math.Float32bits(v))
	}
	b := &bufs{env: env}
	defer b.free()
	dx, dw, dws := b.upload(xb), b.upload(c.w), b.upload(c.ws)
	dy := b.alloc(4 * c.m * c.n)
	b.poison(dy, 4*c.m*c.n)
	var part cuda.DevicePtr
	if c.partBytes > 0 {
		part = b.alloc(c.partBytes)
		b.poison(part, c.partBytes)
	}
	run := func() error { return c.launch(env.S, dy, dx, dw, dws, part) }
	if b.err == nil {
		res.Err = run()
	}
	got := make([]byte, 4*c.m*c.n)
	b.download(got, dy)
	if res.Err == nil && b.err == nil {
		var st ErrStats
		step := sampleStep(c.m, c.n, c.k)
		for row := 0; row < c.m; row++ {
			for o := row % step; o < c.n; o += step {
				sum, abs := c.dot(row, o)
				bits := binary.LittleEndian.Uint32(got[4*(row*c.n+o):])
				g := float64(math.Float32frombits(bits))
				res.Checked++
				if math.IsNaN(g) || math.IsInf(g, 0) {
					res.NonFinite++
					continue
				}
				if c.ok != nil && !c.ok(g, bits, sum, abs) {
					res.Mismatch++
				}
				st.Add(c.want(sum), g)
			}
		}
		res.Cos, res.RelErr, res.MaxAbs = st.Cos(), st.Rel(), st.MaxAbs
		res.TimeUs, res.Err = timeIt(env, run)
		res.GBs = float64(4*c.m*c.ldx + len(c.w) + len(c.ws) + 4*c.m*c.n)
		res.TFLOPs = 2 * float64(c.m) * float64(c.n) * float64(c.k)
	}
	return finish(res, b)
}

// sampleStep is the stride of the outputs a GEMV case checks: all of them up
// to 2^27 multiply-adds of float64 reference, then an odd stride (every
// output column is still reached across rows) that keeps it near that.
func sampleStep(m, n, k int) int {
	return max(1, m*n*k>>27) | 1
}

// fp8BlockWeights are random e4m3 codes [n, k] and e8m0 scales per 128×128
// block, with the dequantised weight.
func fp8BlockWeights(rng *rand.Rand, n, k int) (w, ws []byte, wv func(o, j int) float64) {
	sCols := k / 128
	w = make([]byte, n*k)
	randomBytes(rng, w, weightCode)
	ws = make([]byte, ((n+127)/128)*sCols)
	for i := range ws {
		ws[i] = byte(120 + rng.IntN(10))
	}
	return w, ws, func(o, j int) float64 {
		return float64(cpuref.E4M3ToF32(w[o*k+j])) * float64(cpuref.E8M0ToF32(ws[(o/128)*sCols+j/128]))
	}
}

// bf16Weights are random bf16 weights [n, k] with their values.
func bf16Weights(rng *rand.Rand, n, k int) (w []byte, wv func(o, j int) float64) {
	w = make([]byte, 2*n*k)
	for i, h := range randBF16(rng, n, k) {
		binary.LittleEndian.PutUint16(w[2*i:], h)
	}
	return w, func(o, j int) float64 { return float64(cpuref.BF16ToF32(binary.LittleEndian.Uint16(w[2*(o*k+j):]))) }
}

// groupedDot is the grouped linear's dot product: output o of group o/r
// reads its own k columns of x (row stride ldx).
func groupedDot(x []float32, ldx, k, r int, wv func(o, j int) float64) func(row, o int) (float64, float64) {
	return func(row, o int) (sum, abs float64) {
		xr := x[row*ldx+(o/r)*k:]
		for j := 0; j < k; j++ {
			t := float64(xr[j]) * wv(o, j)
			sum, abs = sum+t, abs+math.Abs(t)
		}
		return sum, abs
	}
}

func roundBF16(sum float64) float64 { return float64(cpuref.BF16ToF32(cpuref.F32ToBF16(float32(sum)))) }

// GemvFP8Case checks the decode GEMV (cuda.LinearF32Kernel at m <= 8 rows)
// on FP8 block-scaled weights [n, k] in groups of r output rows, each group
// reading its own k columns of x (the attention's grouped output projection
// wo_a), bf16-rounded outputs. Reference: float64 sums of the dequantised
// products; the GPU sums in fp32, so LimitFP32.
func GemvFP8Case(m, n, k, r int) Case {
	return Case{Component: "gemv_fp8", Shape: shapeStr("%dx%dx%d/%d", m, n, k, r), Run: func(env *Env) Result {
		res := Result{Component: "gemv_fp8", Shape: shapeStr("m=%d n=%d k=%d r=%d", m, n, k, r), Limit: LimitFP32}
		rng := env.rng()
		ldx := n / r * k
		x := make([]float32, m*ldx)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		w, ws, wv := fp8BlockWeights(rng, n, k)
		sh := cuda.LinearShape{M: m, N: n, K: k, R: r, LdX: ldx, Format: cuda.WeightFP8Block, SCols: k / 128}
		return gemvRun{m: m, n: n, k: k, ldx: ldx, x: x, w: w, ws: ws,
			launch: func(s *cuda.Stream, y, x, w, ws, _ cuda.DevicePtr) error {
				return cuda.LinearF32Kernel(s, y, x, w, ws, sh, true)
			},
			dot: groupedDot(x, ldx, k, r, wv), want: roundBF16}.run(env, res)
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
		ldx := n / r * k
		x := make([]float32, m*ldx)
		for i, h := range randBF16(rng, m, ldx) {
			x[i] = cpuref.BF16ToF32(h)
		}
		var (
			w, ws []byte
			wv    func(o, j int) float64
		)
		if f == cuda.WeightBF16 {
			w, wv = bf16Weights(rng, n, k)
			ws = make([]byte, 16)
		} else {
			w, ws, wv = fp8BlockWeights(rng, n, k)
		}
		sh := cuda.LinearShape{M: m, N: n, K: k, R: r, LdX: ldx, Format: f, SCols: k / 128}
		return gemvRun{m: m, n: n, k: k, ldx: ldx, x: x, w: w, ws: ws, partBytes: cuda.BF16DecScratchBytes(env.S, sh),
			launch: func(s *cuda.Stream, y, x, w, ws, part cuda.DevicePtr) error {
				return cuda.GroupedLinearBF16Dec(s, y, x, w, ws, part, sh)
			},
			dot: groupedDot(x, ldx, k, r, wv), want: roundBF16,
			ok: func(g float64, bits uint32, sum, abs float64) bool {
				ulp := math.Ldexp(1, math.Ilogb(math.Abs(sum)+1e-38)-7)
				return bits&0xffff == 0 && math.Abs(g-sum) <= ulp+math.Ldexp(abs, -20)
			}}.run(env, res)
	}}
}

// GemvF32Case checks linear_bf16x3_dec (cuda.LinearF32BF16x3Dec; dec
// false: the SIMT GEMV, cuda.LinearF32Kernel: gemv1 at one row, gemvr at
// 2-8) on the fp32 linear of bf16 weights [n, k] and fp32 x that is not
// bf16-valued (the head, the compressor): fp32 outputs within
// 2^-20·Σ|products| (+2^-126) of the float64 sum (Mismatch counts the
// others).
func GemvF32Case(m, n, k int, dec bool) Case {
	if dec {
		return gemvF32Case("gemv_f32_x3", m, n, k, true, func(s *cuda.Stream, y, x, w, part cuda.DevicePtr, sh cuda.LinearShape) error {
			return cuda.LinearF32BF16x3Dec(s, y, x, w, part, sh)
		})
	}
	return gemvF32Case("gemv_f32_simt", m, n, k, false, func(s *cuda.Stream, y, x, w, _ cuda.DevicePtr, sh cuda.LinearShape) error {
		return cuda.LinearF32Kernel(s, y, x, w, 0, sh, false)
	})
}

// GemvRowsCase is GemvF32Case on gemvr variant g (cuda.LinearF32Rows).
func GemvRowsCase(m, n, k int, g cuda.GemvRows) Case {
	return gemvF32Case("gemv_f32_rows_"+g.String(), m, n, k, false, func(s *cuda.Stream, y, x, w, _ cuda.DevicePtr, sh cuda.LinearShape) error {
		return cuda.LinearF32Rows(s, y, x, w, sh, false, g)
	})
}

func gemvF32Case(comp string, m, n, k int, split bool, launch func(s *cuda.Stream, y, x, w, part cuda.DevicePtr, sh cuda.LinearShape) error) Case {
	return Case{Component: comp, Shape: shapeStr("%dx%dx%d", m, n, k), Run: func(env *Env) Result {
		res := Result{Component: comp, Shape: shapeStr("m=%d n=%d k=%d", m, n, k), Limit: LimitFP32}
		rng := env.rng()
		x := make([]float32, m*k)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		w, wv := bf16Weights(rng, n, k)
		sh := cuda.LinearShape{M: m, N: n, K: k, R: n, LdX: k, Format: cuda.WeightBF16}
		c := gemvRun{m: m, n: n, k: k, ldx: k, x: x, w: w, ws: make([]byte, 16),
			launch: func(s *cuda.Stream, y, x, w, _, part cuda.DevicePtr) error { return launch(s, y, x, w, part, sh) },
			dot:    groupedDot(x, k, k, n, wv),
			want:   func(sum float64) float64 { return sum },
			ok: func(g float64, _ uint32, sum, abs float64) bool {
				return math.Abs(g-sum) <= math.Ldexp(abs, -20)+0x1p-126
			}}
		if split {
			c.partBytes = cuda.BF16DecScratchBytes(env.S, sh)
		}
		return c.run(env, res)
	}}
}
