package cpuref

import "math"

// FMA32 is fmaf: a·b + c rounded once to float32 (nearest even). The product
// of two float32 is exact in float64; the sum is rounded to float64 and then
// to float32, which differs from one rounding only where the float64 sum is
// a float32 midpoint and is not exact: then its rounding error decides.
func FMA32(a, b, c float32) float32 {
	p, cc := float64(a)*float64(b), float64(c)
	s := p + cc
	r := float32(s)
	if float64(r) == s || math.IsInf(s, 0) || math.IsNaN(s) {
		return r
	}
	bp := s - p
	e := (p - (s - bp)) + (cc - bp) // s + e = p + c exactly (TwoSum)
	if e == 0 {
		return r
	}
	n := math.Nextafter32(r, float32(math.Copysign(math.Inf(1), s-float64(r)))) // r's neighbour on s's side
	if (float64(r)+float64(n))/2 != s {
		return r
	}
	if (e > 0) == (n > r) {
		return n
	}
	return r
}

// GemvBF16 is the decode GEMV of bf16 weights (cuda gemv1_f32_w1 and gemvr)
// bit for bit: y[i, o] (stride n) for rows i < m of x (stride ldx), output
// o of group o/r reading its k columns of x from (o/r)·k, w [n, k]. K is
// split into 2^ls slices of sl = ceil(k/2^ls) rounded up to 8; in a slice
// [kb, ke) with kf = kb + (ke-kb) mod 1024, lane l (of 32) sums, with fmaf
// in K order, the 8 weights at kb + 256t + 8l below kf, then those at
// kf + 256t + 8l; the lanes are added by a xor butterfly (16, 8, 4, 2, 1),
// the slices in order; rnd rounds the sum to bf16.
func GemvBF16(y, x []float32, ldx int, w []uint16, m, n, k, r, ls int, rnd bool) {
	sl := ((k-1)>>ls + 8) &^ 7
	var lanes [32]float32
	for i := range m {
		for o := range n {
			xr := x[i*ldx+(o/r)*k:]
			wr := w[o*k:]
			unit := func(p int, acc float32) float32 {
				for j := p; j < p+8; j++ {
					acc = FMA32(xr[j], BF16ToF32(wr[j]), acc)
				}
				return acc
			}
			var sum float32
			for j := range 1 << ls {
				kb := min(k, j*sl)
				ke := min(k, kb+sl)
				kf := kb + (ke-kb)%1024
				for l := range lanes {
					var acc float32
					for p := kb + 8*l; p < kf; p += 256 {
						acc = unit(p, acc)
					}
					for p := kf + 8*l; p < ke; p += 256 {
						acc = unit(p, acc)
					}
					lanes[l] = acc
				}
				for off := 16; off > 0; off >>= 1 {
					var next [32]float32
					for l := range lanes {
						next[l] = lanes[l] + lanes[l^off]
					}
					lanes = next
				}
				if j == 0 {
					sum = lanes[0]
				} else {
					sum += lanes[0]
				}
			}
			if rnd {
				sum = BF16ToF32(F32ToBF16(sum))
			}
			y[i*n+o] = sum
		}
	}
}
