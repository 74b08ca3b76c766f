// Package cpuref holds straightforward CPU twins of the CUDA kernels in
// package cuda, written from the formulas of spec §3.1, §3.3, §3.4, §6.2 and
// §9. They favour clarity over speed; sums are carried in float64 so the twin
// is a higher-precision reference for the GPU's fp32 accumulation.
package cpuref

import (
	"math"
	"runtime"
	"sync"
)

// BF16ToF32 widens a bf16 bit pattern.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds to nearest even; NaN stays NaN.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// E4M3ToF32 decodes an e4m3fn byte (bias 7, max 448, 0x7f/0xff NaN).
func E4M3ToF32(b byte) float32 {
	em := b & 0x7f
	var v float32
	switch {
	case em == 0x7f:
		return float32(math.NaN())
	case em < 8:
		v = float32(em) / 512
	default:
		e := int(em >> 3)
		m := float32(em & 7)
		v = float32(math.Ldexp(float64(1+m/8), e-7))
	}
	if b&0x80 != 0 {
		return -v
	}
	return v
}

// F32ToE4M3 rounds x to the nearest e4m3 value (ties to even), saturating at ±448.
func F32ToE4M3(x float32) byte {
	if x != x {
		return 0x7f
	}
	var s byte
	if math.Signbit(float64(x)) {
		s = 0x80
	}
	a := math.Abs(float64(x))
	if a >= 448 {
		return s | 0x7e
	}
	if a < 1.0/64 { // subnormal grid m·2^-9 (m = 8 is the smallest normal, code 0x08)
		return s | byte(math.RoundToEven(a*512))
	}
	f, exp := math.Frexp(a) // a = f·2^exp, f in [0.5, 1)
	e := exp - 1
	m := math.RoundToEven((2*f - 1) * 8)
	if m == 8 {
		m, e = 0, e+1
	}
	return s | byte((e+7)<<3) | byte(m)
}

// E8M0ToF32 decodes a ue8m0 scale: 2^(b-127), 255 is NaN.
func E8M0ToF32(b byte) float32 {
	if b == 255 {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(b)-127))
}

var e2m1 = [8]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// E2M1ToF32 decodes an fp4 nibble (bit 3 sign).
func E2M1ToF32(q byte) float32 {
	v := e2m1[q&7]
	if q&8 != 0 {
		return -v
	}
	return v
}

// parallelRows runs f(r) for r in [0, rows) on all cores.
func parallelRows(rows int, f func(r int)) {
	w := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	next := make(chan int, rows)
	for r := 0; r < rows; r++ {
		next <- r
	}
	close(next)
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				f(r)
			}
		}()
	}
	wg.Wait()
}

// RMSNorm (spec §3.1): upcast, r = 1/sqrt(mean(x²)+eps), w·(x·r) in fp32, one bf16 rounding.
func RMSNorm(out, x, w []uint16, rows, dim int, eps float32) {
	for r := 0; r < rows; r++ {
		xr := x[r*dim : (r+1)*dim]
		var ss float64
		for _, v := range xr {
			f := float64(BF16ToF32(v))
			ss += f * f
		}
		mean := float32(ss / float64(dim))
		rs := float32(1 / math.Sqrt(float64(mean+eps)))
		for i, v := range xr {
			out[r*dim+i] = F32ToBF16(BF16ToF32(w[i]) * (BF16ToF32(v) * rs))
		}
	}
}

// QuantFP8Act (spec §3.3, block 128): amax ≥ 1e-4, s = 2^ceil(log2(amax·(1/448))),
// q = e4m3(clamp(x/s, ±448)); scales are e8m0 bytes (exponent + 127), [rows, cols/128].
func QuantFP8Act(q, scales []byte, x []uint16, rows, cols int) {
	nb := cols / 128
	for r := 0; r < rows; r++ {
		for b := 0; b < nb; b++ {
			blk := x[r*cols+b*128 : r*cols+b*128+128]
			var amax float32
			for _, v := range blk {
				if a := float32(math.Abs(float64(BF16ToF32(v)))); a > amax {
					amax = a
				}
			}
			amax = max(amax, 1e-4)
			t := amax * float32(1.0/448.0)
			tb := math.Float32bits(t)
			e := int(tb>>23&0xff) - 127
			if tb&0x7fffff != 0 {
				e++
			}
			e = min(e, 127)
			s := float32(math.Ldexp(1, e))
			for i, v := range blk {
				y := BF16ToF32(v) / s
				y = min(max(y, -448), 448)
				q[r*cols+b*128+i] = F32ToE4M3(y)
			}
			scales[r*nb+b] = byte(e + 127)
		}
	}
}

// LinearFP8 (spec §3.4): per 128-K block, Σ xq·wq, times act_scale·w_scale,
// summed; result in float64 (not rounded), [m, n]. Only the rows listed
// (all when nil) are computed.
func LinearFP8(ref []float64, xq, xs, w, ws []byte, m, n, k int, rows []int) {
	nb := k / 128
	wf := decodeE4M3(w)
	if rows == nil {
		rows = make([]int, m)
		for i := range rows {
			rows[i] = i
		}
	}
	parallelRows(len(rows), func(i int) {
		r := rows[i]
		xf := decodeE4M3(xq[r*k : (r+1)*k])
		for c := 0; c < n; c++ {
			var sum float64
			for b := 0; b < nb; b++ {
				var p float64
				for i := b * 128; i < b*128+128; i++ {
					p += float64(xf[i]) * float64(wf[c*k+i])
				}
				sum += p * float64(E8M0ToF32(xs[r*nb+b])) * float64(E8M0ToF32(ws[(c/128)*nb+b]))
			}
			ref[r*n+c] = sum
		}
	})
}

func decodeE4M3(b []byte) []float32 {
	out := make([]float32, len(b))
	for i, v := range b {
		out[i] = E4M3ToF32(v)
	}
	return out
}

// Format of FP4 expert weights.
type Format int

const (
	MXFP4 Format = iota // e8m0 per 32 K
	NVFP4               // e4m3 per 16 K, fp32 global scale per expert
)

// MoEFP4 (spec §3.4 FP4 expert linear, §9 NVFP4): for every expert e and row
// m in [off[e], off[e+1]), per scale group of K: Σ xq·code, times
// act_scale[m, k/128]·w_scale[n, group], summed; times G_e for NVFP4. Only the
// rows listed in rowsToCheck (all when nil) are computed; others stay NaN.
func MoEFP4(ref []float64, xq, xs []byte, off []int32, w, wscale []byte, gscale []float32,
	format Format, experts, rowsTotal, n, k int, rowsToCheck []int) {
	for i := range ref {
		ref[i] = math.NaN()
	}
	owner := make([]int, rowsTotal)
	for i := range owner {
		owner[i] = -1
	}
	for e := 0; e < experts; e++ {
		for r := int(off[e]); r < int(off[e+1]); r++ {
			owner[r] = e
		}
	}
	if rowsToCheck == nil {
		rowsToCheck = make([]int, rowsTotal)
		for i := range rowsToCheck {
			rowsToCheck[i] = i
		}
	}
	group := 32
	if format == NVFP4 {
		group = 16
	}
	ng, nb := k/group, k/128
	parallelRows(len(rowsToCheck), func(i int) {
		r := rowsToCheck[i]
		e := owner[r]
		if e < 0 {
			return
		}
		xf := decodeE4M3(xq[r*k : (r+1)*k])
		g := 1.0
		if format == NVFP4 {
			g = float64(gscale[e])
		}
		for c := 0; c < n; c++ {
			row := w[(e*n+c)*(k/2) : (e*n+c+1)*(k/2)]
			srow := wscale[(e*n+c)*ng : (e*n+c+1)*ng]
			var sum float64
			for gi := 0; gi < ng; gi++ {
				var p float64
				for kk := gi * group; kk < (gi+1)*group; kk++ {
					code := row[kk/2] >> (4 * (kk & 1)) & 0xf
					p += float64(xf[kk]) * float64(E2M1ToF32(code))
				}
				var ws float64
				if format == NVFP4 {
					ws = float64(E4M3ToF32(srow[gi]))
				} else {
					ws = float64(E8M0ToF32(srow[gi]))
				}
				sum += p * float64(E8M0ToF32(xs[r*nb+gi*group/128])) * ws
			}
			ref[r*n+c] = sum * g
		}
	})
}

// SwiGLU (spec §6.2): g = min(gate, L), u = clamp(up, ±L), h = silu(g)·u·w, fp32;
// returns the unrounded values, [rows, inter]. weights nil means 1.
func SwiGLU(ref []float64, gate, up []uint16, ld int, weights []float32, rows, inter int, limit float32) {
	for r := 0; r < rows; r++ {
		w := 1.0
		if weights != nil {
			w = float64(weights[r])
		}
		for i := 0; i < inter; i++ {
			g := math.Min(float64(BF16ToF32(gate[r*ld+i])), float64(limit))
			u := math.Max(math.Min(float64(BF16ToF32(up[r*ld+i])), float64(limit)), -float64(limit))
			silu := g / (1 + math.Exp(-g))
			ref[r*inter+i] = silu * u * w
		}
	}
}
