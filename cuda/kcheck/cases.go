package kcheck

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
)

// RMSNormCase checks rmsnorm_bf16 on [rows, dim].
func RMSNormCase(rows, dim int) Case {
	return Case{Component: "rmsnorm", Shape: shapeStr("%dx%d", rows, dim), Run: func(env *Env) Result {
		r := Result{Component: "rmsnorm", Shape: shapeStr("%dx%d", rows, dim), Limit: LimitFP32}
		rng := env.rng()
		x := randBF16(rng, rows, dim)
		w := randBF16(rng, 1, dim)
		b := &bufs{env: env}
		defer b.free()
		dx, dw := b.upload(cuda.Bytes(x)), b.upload(cuda.Bytes(w))
		dy := b.alloc(2 * rows * dim)
		b.poison(dy, 2*rows*dim)
		if b.err == nil {
			r.Err = cuda.RMSNorm(env.S, dy, dx, dw, rows, dim, 1e-6)
		}
		got := make([]uint16, rows*dim)
		b.download(cuda.Bytes(got), dy)
		want := make([]uint16, rows*dim)
		cpuref.RMSNorm(want, x, w, rows, dim, 1e-6)
		ref := make([]float64, len(want))
		for i, v := range want {
			ref[i] = float64(cpuref.BF16ToF32(v))
		}
		if r.Err == nil && b.err == nil {
			compareBF16(&r, got, ref, nil)
			r.TimeUs, r.Err = timeIt(env, func() error { return cuda.RMSNorm(env.S, dy, dx, dw, rows, dim, 1e-6) })
			r.GBs = float64(4*rows*dim + 2*dim)
		}
		return finish(r, b)
	}}
}

// QuantCase checks quant_fp8_act on [rows, cols]; the first rows hold the
// special blocks (all zero, huge, tiny, exactly 448·2^k).
func QuantCase(rows, cols int) Case {
	return Case{Component: "quant_fp8", Shape: shapeStr("%dx%d", rows, cols), Run: func(env *Env) Result {
		r := Result{Component: "quant_fp8", Shape: shapeStr("%dx%d", rows, cols), Limit: 1.0 / 16}
		rng := env.rng()
		x := randBF16(rng, rows, cols)
		specials := []func(i int) float32{
			func(int) float32 { return 0 },
			func(i int) float32 { return float32(3.3e38) * float32(1-2*(i&1)) },
			func(i int) float32 { return 1e-30 * float32(i+1) },
			func(i int) float32 { return 448 * 4 * float32(i%3-1) },
		}
		for s, f := range specials {
			if s*128 >= rows*cols {
				break
			}
			for i := 0; i < 128; i++ {
				x[s*128+i] = cpuref.F32ToBF16(f(i))
			}
		}
		b := &bufs{env: env}
		defer b.free()
		dx := b.upload(cuda.Bytes(x))
		dq, ds := b.alloc(rows*cols), b.alloc(rows*cols/128)
		b.poison(dq, rows*cols)
		b.poison(ds, rows*cols/128)
		if b.err == nil {
			r.Err = cuda.QuantFP8Act(env.S, dq, ds, dx, rows, cols)
		}
		gq, gs := make([]byte, rows*cols), make([]byte, rows*cols/128)
		b.download(gq, dq)
		b.download(gs, ds)
		wq, ws := quantizeParallel(x, rows, cols)
		if r.Err == nil && b.err == nil {
			// Codes and scales must match exactly; also report the dequantized error.
			for i := range wq {
				if gq[i] != wq[i] {
					r.Mismatch++
				}
			}
			for i := range ws {
				if gs[i] != ws[i] {
					r.Mismatch++
				}
			}
			var dd, rr, dot, gg float64
			for i := range wq {
				v := float64(cpuref.E4M3ToF32(gq[i])) * float64(cpuref.E8M0ToF32(gs[i/128]))
				ref := float64(cpuref.BF16ToF32(x[i]))
				r.Checked++
				if math.IsNaN(v) || math.IsInf(v, 0) {
					r.NonFinite++
					continue
				}
				dd += (v - ref) * (v - ref)
				rr += ref * ref
				dot += v * ref
				gg += v * v
				r.MaxAbs = math.Max(r.MaxAbs, math.Abs(v-ref))
			}
			// Dequantized vs input: e4m3 keeps 4 significant bits, so the
			// relative rounding error of any element is at most 2^-4.
			r.RelErr = math.Sqrt(dd / (rr + 1e-300))
			r.Cos = dot / math.Sqrt(gg*rr+1e-300)
			r.TimeUs, r.Err = timeIt(env, func() error { return cuda.QuantFP8Act(env.S, dq, ds, dx, rows, cols) })
			r.GBs = float64(3*rows*cols + rows*cols/128)
		}
		return finish(r, b)
	}}
}

func quantizeParallel(x []uint16, rows, cols int) (q, s []byte) {
	q = make([]byte, rows*cols)
	s = make([]byte, rows*cols/128)
	nb := cols / 128
	const chunk = 16
	n := (rows + chunk - 1) / chunk
	done := make(chan struct{}, n)
	for c := 0; c < n; c++ {
		go func(c int) {
			r0, r1 := c*chunk, min((c+1)*chunk, rows)
			cpuref.QuantFP8Act(q[r0*cols:r1*cols], s[r0*nb:r1*nb], x[r0*cols:r1*cols], r1-r0, cols)
			done <- struct{}{}
		}(c)
	}
	for c := 0; c < n; c++ {
		<-done
	}
	return q, s
}

// LinearCase checks linear_fp8: y[m, n] = x[m, k] · W[n, k]ᵀ. checkRows caps
// the rows the CPU twin recomputes (random sample; 0 = all); all outputs are
// checked for being written.
func LinearCase(m, n, k, checkRows int) Case {
	return Case{Component: "linear_fp8", Shape: shapeStr("%dx%dx%d", m, n, k), Run: func(env *Env) Result {
		r := Result{Component: "linear_fp8", Shape: shapeStr("m=%d n=%d k=%d", m, n, k), Limit: LimitGEMM}
		rng := env.rng()
		xq, xs := quantizeParallel(randBF16(rng, m, k), m, k)
		w := make([]byte, n*k)
		randomBytes(rng, w, weightCode)
		ws := make([]byte, ((n+127)/128)*(k/128))
		for i := range ws {
			ws[i] = byte(120 + rng.IntN(10))
		}
		b := &bufs{env: env}
		defer b.free()
		dxq, dxs, dw, dws := b.upload(xq), b.upload(xs), b.upload(w), b.upload(ws)
		dy := b.alloc(2 * m * n)
		b.poison(dy, 2*m*n)
		var scratch cuda.DevicePtr // split K at decode shapes
		if sb := cuda.LinearFP8ScratchBytes(env.S, m, n, k); sb > 0 {
			scratch = b.alloc(sb)
			b.poison(scratch, sb)
		}
		if b.err == nil {
			r.Err = cuda.LinearFP8(env.S, dy, dxq, dxs, dw, dws, m, n, k, scratch)
		}
		got := make([]uint16, m*n)
		b.download(cuda.Bytes(got), dy)
		if r.Err == nil && b.err == nil {
			rowsToCheck := sampleRows(rng, m, checkRows)
			ref := make([]float64, m*n)
			cpuref.LinearFP8(ref, xq, xs, w, ws, m, n, k, rowsToCheck)
			idx := make([]int, 0, len(rowsToCheck)*n)
			for _, row := range rowsToCheck {
				for c := 0; c < n; c++ {
					idx = append(idx, row*n+c)
				}
			}
			compareBF16(&r, got, ref, idx)
			for _, v := range got {
				if v == 0xFFFF {
					r.NonFinite++ // poison left: unwritten
				}
			}
			r.TimeUs, r.Err = timeIt(env, func() error { return cuda.LinearFP8(env.S, dy, dxq, dxs, dw, dws, m, n, k, scratch) })
			r.GBs = float64(m*k + n*k + 2*m*n)
			r.TFLOPs = 2 * float64(m) * float64(n) * float64(k)
		}
		return finish(r, b)
	}}
}

// Routing describes how a MoE case spreads rows over experts.
type Routing int

const (
	RouteUniform    Routing = iota // rows spread at random over all experts
	RouteSkewed                    // one expert takes most rows, many get none
	RouteGap                       // like uniform, but 3 leading and 5 trailing rows belong to no expert
	RouteWideScales                // like uniform, with weight scales over a wide range (MXFP4 2^-31..2^32, NVFP4 e4m3 subnormals to 448)
)

// MoECase checks moe_fp4_gemm with E experts, mTotal permuted rows, and
// [n, k] expert weights. checkRows caps how many rows the CPU twin recomputes
// (a random sample; 0 = all); every row is still checked for being written,
// and rows owned by no expert for being left alone.
func MoECase(experts, mTotal, n, k int, format cuda.FP4Format, route Routing, checkRows int) Case {
	shape := shapeStr("E=%d M=%d n=%d k=%d %s", experts, mTotal, n, k, format)
	if route == RouteSkewed {
		shape += " skewed"
	} else if route == RouteGap {
		shape += " gap"
	} else if route == RouteWideScales {
		shape += " widescale"
	}
	sh := cuda.MoEShape{Experts: experts, Rows: mTotal, N: n, K: k, Format: format}
	return Case{Component: "moe_fp4", Shape: shape, MoE: sh, Run: func(env *Env) Result {
		r := Result{Component: "moe_fp4", Shape: shape, Limit: LimitGEMM}
		rng := env.rng()
		// Row counts per expert.
		lead, tail := 0, 0
		if route == RouteGap && mTotal > 16 {
			lead, tail = 3, 5
		}
		owned := mTotal - lead - tail
		counts := make([]int, experts)
		switch route {
		case RouteSkewed:
			big := rng.IntN(experts)
			counts[big] = owned * 3 / 4
			for i := counts[big]; i < owned; i++ {
				counts[rng.IntN(max(experts/8, 1))]++
			}
		default:
			for i := 0; i < owned; i++ {
				counts[rng.IntN(experts)]++
			}
		}
		off := make([]int32, experts+1)
		off[0] = int32(lead)
		for e := 0; e < experts; e++ {
			off[e+1] = off[e] + int32(counts[e])
		}
		group := 32
		cf := cpuref.MXFP4
		if format == cuda.NVFP4 {
			group, cf = 16, cpuref.NVFP4
		}
		xq, xs := quantizeParallel(randBF16(rng, mTotal, k), mTotal, k)
		perW, perS := n*k/2, n*k/group
		b := &bufs{env: env}
		defer b.free()
		dxq, dxs, doff := b.upload(xq), b.upload(xs), b.upload(cuda.Bytes(off))
		var mw *moeWeights
		if env.ShareWeights {
			mw = env.sharedMoE(rng, experts, n, k, format, b) // benchmarks: the usual scales
		} else {
			// Weights only for experts with rows; the others stay poisoned on the
			// device (0xFF scales are NaN), which the kernel must never read.
			mw = newMoEWeights(rng, experts, n, k, format, route == RouteWideScales, func(e int) bool { return counts[e] > 0 })
			mw.dw, mw.dws = b.buffer(len(mw.w)), b.buffer(len(mw.ws))
			b.poison(mw.dw.Ptr, len(mw.w))
			b.poison(mw.dws.Ptr, len(mw.ws))
			for e := 0; e < experts && b.err == nil; e++ {
				if counts[e] > 0 {
					b.err = env.S.CopyHtoD(mw.dw.Ptr.Add(e*perW), mw.w[e*perW:(e+1)*perW])
					if b.err == nil {
						b.err = env.S.CopyHtoD(mw.dws.Ptr.Add(e*perS), mw.ws[e*perS:(e+1)*perS])
					}
				}
			}
			if format == cuda.NVFP4 {
				mw.dgs = b.buffer(4 * experts)
				if b.err == nil {
					b.err = env.S.CopyHtoD(mw.dgs.Ptr, cuda.Bytes(mw.gs))
				}
			}
		}
		if b.err != nil {
			return finish(r, b)
		}
		w, ws, gs := mw.w, mw.ws, mw.gs
		dw, dws := mw.dw.Ptr, mw.dws.Ptr
		var dgs cuda.DevicePtr
		if mw.dgs != nil {
			dgs = mw.dgs.Ptr
		}
		scratch := b.alloc(cuda.MoEScratchBytes(env.S, sh))
		b.poison(scratch, cuda.MoEScratchBytes(env.S, sh))
		dy := b.alloc(2 * mTotal * n)
		b.poison(dy, 2*mTotal*n)
		// The offsets came by copy: settled, so decpre runs its own kernel.
		run := func() error {
			tl, err := cuda.MoETiles(env.S, doff, sh, scratch)
			if err != nil {
				return err
			}
			return cuda.MoEFP4Tiles(env.S, dy, dxq, dxs, dw, dws, dgs, sh, scratch, tl.Settled())
		}
		if b.err == nil {
			r.Err = run()
		}
		got := make([]uint16, mTotal*n)
		b.download(cuda.Bytes(got), dy)
		if r.Err != nil || b.err != nil {
			return finish(r, b)
		}
		// Rows to recompute on the CPU.
		var rowsToCheck []int
		for i := lead; i < mTotal-tail; i++ {
			rowsToCheck = append(rowsToCheck, i)
		}
		if checkRows > 0 && len(rowsToCheck) > checkRows {
			rng.Shuffle(len(rowsToCheck), func(i, j int) { rowsToCheck[i], rowsToCheck[j] = rowsToCheck[j], rowsToCheck[i] })
			rowsToCheck = rowsToCheck[:checkRows]
			sort.Ints(rowsToCheck)
		}
		ref := make([]float64, mTotal*n)
		cpuref.MoEFP4(ref, xq, xs, off, w, ws, gs, cf, experts, mTotal, n, k, rowsToCheck)
		idx := make([]int, 0, len(rowsToCheck)*n)
		for _, row := range rowsToCheck {
			for c := 0; c < n; c++ {
				idx = append(idx, row*n+c)
			}
		}
		compareBF16(&r, got, ref, idx)
		// Every owned row written; rows owned by no expert untouched.
		for row := 0; row < mTotal; row++ {
			ownedRow := row >= lead && row < mTotal-tail
			for c := 0; c < n; c++ {
				v := got[row*n+c]
				if ownedRow && v == 0xFFFF {
					r.NonFinite++
				}
				if !ownedRow && v != 0xFFFF {
					r.Mismatch++
				}
			}
		}
		r.TimeUs, r.Err = timeIt(env, run)
		active := 0
		for _, c := range counts {
			if c > 0 {
				active++
			}
		}
		r.GBs = float64(active)*float64(perW+perS) + float64(mTotal*(k+2*n))
		r.TFLOPs = 2 * float64(owned) * float64(n) * float64(k)
		return finish(r, b)
	}}
}

// newMoEWeights draws random expert weights for the experts fill picks (the
// rest stay zero on the host): FP4 codes of every value, MXFP4 scales near
// 2^-6, NVFP4 scales in [2^-3, 2^3) with global scales 2^-12..2^-8; wide
// scales span MXFP4 2^-31..2^32 and NVFP4 e4m3 subnormals up to 448, so that
// kernels which fold the scales into other factors meet every exponent case.
func newMoEWeights(rng *rand.Rand, experts, n, k int, format cuda.FP4Format, wide bool, fill func(e int) bool) *moeWeights {
	group := 32
	if format == cuda.NVFP4 {
		group = 16
	}
	perW, perS := n*k/2, n*k/group
	mw := &moeWeights{w: make([]byte, experts*perW), ws: make([]byte, experts*perS), gs: make([]float32, experts)}
	for e := 0; e < experts; e++ {
		if !fill(e) {
			continue
		}
		randomBytes(rng, mw.w[e*perW:(e+1)*perW], func(x byte) byte { return x })
		sc := mw.ws[e*perS : (e+1)*perS]
		switch {
		case format == cuda.NVFP4 && wide:
			randomBytes(rng, sc, func(x byte) byte { return 1 + x%0x7e })
			mw.gs[e] = float32(math.Ldexp(1+rng.Float64(), -12+rng.IntN(4)))
		case format == cuda.NVFP4:
			randomBytes(rng, sc, func(x byte) byte { return 0x20 + x%0x30 })
			mw.gs[e] = float32(math.Ldexp(1+rng.Float64(), -12+rng.IntN(4)))
		case wide:
			randomBytes(rng, sc, func(x byte) byte { return 96 + x%64 })
		default:
			randomBytes(rng, sc, func(x byte) byte { return 118 + x%8 })
		}
	}
	return mw
}

// sharedMoE returns the environment's weights for an expert shape, drawn and
// uploaded on first use (every expert filled).
func (e *Env) sharedMoE(rng *rand.Rand, experts, n, k int, format cuda.FP4Format, b *bufs) *moeWeights {
	key := fmt.Sprintf("%d %d %d %s", experts, n, k, format)
	if mw := e.weights[key]; mw != nil {
		return mw
	}
	mw := newMoEWeights(rng, experts, n, k, format, false, func(int) bool { return true })
	up := func(data []byte) *cuda.Buffer {
		if b.err != nil {
			return nil
		}
		buf, err := e.Ctx.Alloc(max(len(data), 1))
		if err == nil {
			err = e.S.CopyHtoD(buf.Ptr, data)
		}
		b.err = err
		return buf
	}
	mw.dw, mw.dws = up(mw.w), up(mw.ws)
	if format == cuda.NVFP4 {
		mw.dgs = up(cuda.Bytes(mw.gs))
	}
	if b.err == nil {
		if e.weights == nil {
			e.weights = map[string]*moeWeights{}
		}
		e.weights[key] = mw
	}
	return mw
}

// SwiGLUCase checks swiglu_bf16 on a fused [rows, 2·inter] gate|up input.
func SwiGLUCase(rows, inter int, weighted bool) Case {
	shape := shapeStr("%dx%d", rows, inter)
	if !weighted {
		shape += " w=1"
	}
	return Case{Component: "swiglu", Shape: shape, Run: func(env *Env) Result {
		r := Result{Component: "swiglu", Shape: shape, Limit: LimitFP32}
		rng := env.rng()
		in := randBF16(rng, rows, 2*inter)
		// Push some values past the clamp limit on both sides.
		for i := range in {
			if rng.IntN(50) == 0 {
				in[i] = cpuref.F32ToBF16(float32(rng.NormFloat64() * 30))
			}
		}
		var wts []float32
		if weighted {
			wts = make([]float32, rows)
			for i := range wts {
				wts[i] = float32(rng.Float64() * 2.5)
			}
		}
		const limit = 10
		b := &bufs{env: env}
		defer b.free()
		din := b.upload(cuda.Bytes(in))
		var dw cuda.DevicePtr
		if weighted {
			dw = b.upload(cuda.Bytes(wts))
		}
		dout := b.alloc(2 * rows * inter)
		b.poison(dout, 2*rows*inter)
		run := func() error {
			return cuda.SwiGLU(env.S, dout, din, din.Add(2*inter), 2*inter, dw, rows, inter, limit)
		}
		if b.err == nil {
			r.Err = run()
		}
		got := make([]uint16, rows*inter)
		b.download(cuda.Bytes(got), dout)
		if r.Err == nil && b.err == nil {
			ref := make([]float64, rows*inter)
			cpuref.SwiGLU(ref, in, in[inter:], 2*inter, wts, rows, inter, limit)
			compareBF16(&r, got, ref, nil)
			r.TimeUs, r.Err = timeIt(env, run)
			r.GBs = float64(6 * rows * inter)
		}
		return finish(r, b)
	}}
}

// SmallCases are quick shapes for the package tests (seconds on the CPU side).
func SmallCases() []Case {
	cs := []Case{
		RMSNormCase(1, 256), RMSNormCase(7, 4096), RMSNormCase(3, 7168),
		QuantCase(1, 128), QuantCase(5, 512), QuantCase(33, 4096),
		LinearCase(1, 256, 512, 0), LinearCase(8, 136, 384, 0), LinearCase(70, 384, 1024, 0), LinearCase(130, 256, 256, 0),
		LinearCase(16, 200, 256, 0), LinearCase(40, 256, 1024, 0), // decode kernel, 2 token tiles; tiled + split K
		// linear_fp8_tdec (PathDecWG): 2, 4, 9 and 16 tokens, rows past N
		// (n % 16 = 8); slices of 13, 29 (the ring of 4 wrapping; the last
		// slice 28), 7 (the last 5) and 3 blocks; one-block slices with two
		// idle warps.
		LinearCase(2, 1048, 6656, 0), LinearCase(9, 264, 14720, 0), LinearCase(16, 520, 3328, 0),
		LinearCase(4, 2056, 1536, 0), LinearCase(1, 24, 256, 0),
		// linear_fp8_tdec3 (auto on sm_90a, planTDec): K of 129 blocks in
		// slices of 33 (4-block chunks, the ring of 6 wrapping, a 1-block
		// tail; the last slice 30, a 2-block tail), rows past N; N of 32776
		// in one-block slices with two idle warps.
		LinearCase(2, 136, 16512, 0), LinearCase(3, 32776, 256, 0),
		// linear_fp8_dsk (auto where its warps fit one wave, and decsk): one
		// token tile with 4, 2 and 1 K blocks a warp, two tiles with 2; CTAs
		// of a row group unsplit (133 groups) and split over 2 and 3 CTAs
		// with idle warps and a short last slice; rows past N (n % 16 = 8).
		LinearCase(1, 2120, 512, 0), LinearCase(2, 1064, 2304, 0), LinearCase(5, 1032, 1280, 0),
		LinearCase(11, 1048, 2176, 0), LinearCase(16, 1056, 2048, 0),
		// sm_90a wgmma kernel: row and column tails with split K, split K over 8, the stage ring wrapping.
		LinearCase(300, 1032, 2048, 0), LinearCase(512, 512, 4096, 64), LinearCase(1100, 1280, 1024, 64),
		SwiGLUCase(1, 256, true), SwiGLUCase(9, 2048, true), SwiGLUCase(4, 3072, false),
		GemvFP8Case(1, 512, 1024, 256), GemvFP8Case(3, 384, 512, 128), // grouped, as wo_a
		// linear_bf16_dec: split K (2-chunk slices), one slice of 6 chunks, the
		// chunk ring wrapping (10 and 18 chunks), 2 and 4 token tiles.
		GemvMMACase(1, 1024, 512, 256, cuda.WeightFP8Block), GemvMMACase(8, 512, 384, 128, cuda.WeightFP8Block),
		GemvMMACase(3, 384, 1024, 128, cuda.WeightBF16), GemvMMACase(2, 256, 640, 128, cuda.WeightBF16),
		GemvMMACase(5, 128, 1152, 128, cuda.WeightFP8Block), GemvMMACase(13, 256, 2048, 256, cuda.WeightBF16),
		GemvMMACase(32, 256, 1024, 128, cuda.WeightFP8Block), GemvMMACase(20, 128, 384, 128, cuda.WeightBF16),
		// linear_bf16x3_dec (fp32 x in three planes): one slice, split K, 2 and 4 token tiles.
		GemvF32Case(1, 384, 640, true), GemvF32Case(3, 256, 1024, true), GemvF32Case(9, 128, 2048, true),
		GemvF32Case(27, 256, 512, true), GemvF32Case(4, 256, 512, false),
		// The SIMT GEMV of bf16 weights: gemv1, gemvr's picks at 2, 3 and 8
		// rows and its other variants (8 K slices with ragged tails; the
		// other slicings: cuda TestGemvRowsBits).
		GemvF32Case(1, 200, 1032, false), GemvF32Case(2, 132, 1032, false), GemvF32Case(3, 200, 1032, false),
		GemvF32Case(8, 200, 264, false),
	}
	for _, m := range []int{2, 4, 8} {
		for _, g := range cuda.GemvRowsVariants(m)[1:] {
			cs = append(cs, GemvRowsCase(m, 200, 1032, g))
		}
	}
	for _, f := range []cuda.FP4Format{cuda.MXFP4, cuda.NVFP4} {
		cs = append(cs,
			MoECase(256, 1, 256, 512, f, RouteUniform, 0),
			MoECase(256, 8, 256, 512, f, RouteUniform, 0),
			MoECase(384, 512, 128, 256, f, RouteSkewed, 0),
			MoECase(48, 512, 256, 256, f, RouteGap, 0),
			MoECase(256, 64, 256, 512, f, RouteGap, 0),     // decode kernel, unowned rows
			MoECase(16, 100, 264, 384, f, RouteUniform, 0), // decode kernel, N % 64 != 0
			MoECase(256, 4096, 128, 256, f, RouteUniform, 256),
			// Tiled paths at every wgmma token tile (16, 32, 64, 128 rows per
			// expert on average): column tails, a skewed expert over many
			// tiles, unowned rows, the stage ring wrapping.
			MoECase(16, 200, 264, 384, f, RouteUniform, 0),
			MoECase(8, 200, 256, 512, f, RouteSkewed, 0),
			MoECase(4, 200, 384, 256, f, RouteGap, 0),
			MoECase(4, 1000, 256, 640, f, RouteUniform, 128),
			// Scales over every exponent case (the wgmma path folds them).
			MoECase(4, 1000, 256, 256, f, RouteWideScales, 128),
			MoECase(256, 8, 256, 512, f, RouteWideScales, 0),
		)
	}
	return cs
}

// HeadVocab is the output head's rows (spec §1: vocab, Flash and Pro).
const HeadVocab = 129280

// Model dimensions (spec §1): hidden d, MoE intermediate, experts, top-k.
type Model struct {
	Name                 string
	D, Inter, Experts, K int
}

var (
	Flash = Model{Name: "flash", D: 4096, Inter: 2048, Experts: 256, K: 6}
	Pro   = Model{Name: "pro", D: 7168, Inter: 3072, Experts: 384, K: 6}
)

// ModelCases are the real-dimension checks for cmd/gpucheck: decode (1 token)
// and prefill-sized batches.
func ModelCases(m Model) []Case {
	var cs []Case
	for _, t := range []int{1, 64, 512} {
		cs = append(cs, RMSNormCase(t, m.D), QuantCase(t, m.D))
	}
	cs = append(cs, QuantCase(512, m.Inter))
	// Shared expert / dense FP8 linears: w1|w3 fused [2·inter, d] and w2 [d, inter].
	for _, t := range []int{1, 64, 512} {
		cs = append(cs, LinearCase(t, 2*m.Inter, m.D, 32), LinearCase(t, m.D, m.Inter, 32))
	}
	for _, t := range []int{1, 512} {
		cs = append(cs, SwiGLUCase(t*m.K, m.Inter, true))
	}
	// Routed experts: rows = tokens × top-k; gate|up fused (n = 2·inter, k = d)
	// and down (n = d, k = inter).
	for _, f := range []cuda.FP4Format{cuda.MXFP4, cuda.NVFP4} {
		for _, t := range []int{1, 8, 512} {
			rows := t * m.K
			cs = append(cs, MoECase(m.Experts, rows, 2*m.Inter, m.D, f, RouteUniform, 48))
		}
		cs = append(cs, MoECase(m.Experts, 512*m.K, m.D, m.Inter, f, RouteUniform, 48))
	}
	cs = append(cs, MoECase(48, 4096, 2*m.Inter, m.D, cuda.MXFP4, RouteGap, 48))
	return cs
}

// Run executes a case, turning a panic-free failure into a Result.
func Run(env *Env, c Case) Result {
	r := c.Run(env)
	if r.Component == "" {
		r.Component, r.Shape = c.Component, c.Shape
	}
	return r
}

// Row formats a result as a table row.
func Row(r Result) string {
	status := "PASS"
	if !r.Pass {
		status = "FAIL"
	}
	s := fmt.Sprintf("%-10s %-36s cos=%.7f rel=%.2e max=%.3g nonfin=%d mism=%d n=%d  %8.1fus %7.1fGB/s %6.1fTF/s  lim=%.0e %s",
		r.Component, r.Shape, r.Cos, r.RelErr, r.MaxAbs, r.NonFinite, r.Mismatch, r.Checked, r.TimeUs, r.GBs, r.TFLOPs, r.Limit, status)
	if r.Err != nil {
		s += "  err=" + r.Err.Error()
	}
	return s
}

// sampleRows returns all of [0, m) or a sorted random sample of n rows.
func sampleRows(rng *rand.Rand, m, n int) []int {
	rows := make([]int, m)
	for i := range rows {
		rows[i] = i
	}
	if n > 0 && m > n {
		rng.Shuffle(m, func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
		rows = rows[:n]
		sort.Ints(rows)
	}
	return rows
}
