package cpuref

import (
	"cmp"
	"math"
	"slices"
)

// Twins of kernels/sample.cu, written straightforwardly (a full sort where the
// kernel uses a radix select). They follow engine/sampler.go's choose given the
// uniform u, with these exact rules, which make the GPU and the twin agree bit
// for bit:
//
//   - NaN logits are -inf; best = argmax with ties to the lowest id (0 for an
//     all -inf row). temp <= 0 (or NaN) or a non-finite max: best.
//   - invT = 1/max(T, 1e-5) in fp32; p_i = fp32(exp(float64(fp32((x_i-m)·invT)))),
//     so p_best = 1. (The engine keeps p in float64: ties in p, and the order
//     among near-equal p, can differ there.)
//   - Masses are u64 fixed point, w_i = round(p_i·2^40), summed exactly; a token
//     with p < 2^-41 weighs 0 and is never drawn.
//   - No top-k and no top-p: kept = {p > 0, p >= min_p (if > 0)}, drawn in id order.
//   - Otherwise, in rank order (p descending, ties to the lower id) over {p > 0}:
//     top-k (0 < k < vocab) keeps the first k; top-p (0 < top_p < 1) keeps the
//     shortest prefix with mass >= ceil(top_p·mass(kept)); min-p (> 0, clamped
//     to 1) drops p < min_p; drawn in rank order.
//   - Draw: the first kept token whose cumulative mass >= floor(u·kept)+1, i.e.
//     exceeds u·kept; u is clamped into [0, 1).

const sampleScale = 1 << 40

var negInf = float32(math.Inf(-1))

func sampleClean(v float32) float32 {
	if v != v {
		return negInf
	}
	return v
}

func sampleArgmaxRow(x []float32) (float32, int) {
	m, best := negInf, 0
	for i, v := range x {
		if v = sampleClean(v); v > m {
			m, best = v, i
		}
	}
	return m, best
}

// SampleProb is the kernel's p for logit x, row max m and fp32 invT.
func SampleProb(x, m, invT float32) float32 {
	x = sampleClean(x)
	if x == negInf {
		return 0
	}
	d := float32(float32(x-m) * invT)
	return float32(math.Exp(float64(d)))
}

func sampleWeight(p float32) uint64 { return uint64(math.RoundToEven(float64(p) * sampleScale)) }

// SampleDraw returns the drawn id of every row (see the rules above); the
// per-row parameters mirror the kernel's device arrays.
func SampleDraw(logits []float32, rows, vocab int, temp []float32, topK []int32, topP, minP, u []float32) []int32 {
	ids, _ := SampleDrawMargin(logits, rows, vocab, temp, topK, topP, minP, u)
	return ids
}

// SampleDrawMargin is SampleDraw that also returns, per row, how close the
// outcome came to flipping: the smallest distance, relative to the mass
// involved, between a threshold (u·kept, top_p·mass) and a cumulative mass
// boundary next to the chosen cut. Greedy rows get 1.
func SampleDrawMargin(logits []float32, rows, vocab int, temp []float32, topK []int32, topP, minP, u []float32) ([]int32, []float64) {
	ids := make([]int32, rows)
	margin := make([]float64, rows)
	for r := range ids {
		ids[r], margin[r] = sampleRow(logits[r*vocab:(r+1)*vocab], temp[r], topK[r], topP[r], minP[r], u[r])
	}
	return ids, margin
}

// cutMargin is the relative distance of threshold t from the cumulative masses
// just before and at the chosen element.
func cutMargin(t float64, before, at uint64, total uint64) float64 {
	return min(math.Abs(t-float64(before)), math.Abs(float64(at)-t)) / float64(total)
}

func sampleRow(x []float32, T float32, k int32, tp, mp, u float32) (int32, float64) {
	m, best := sampleArgmaxRow(x)
	if !(T > 0) || math.IsInf(float64(m), 0) {
		return int32(best), 1
	}
	invT := 1 / max(T, 1e-5)
	p := make([]float32, len(x))
	for i, v := range x {
		p[i] = SampleProb(v, m, invT)
	}
	kOn := k > 0 && int(k) < len(x)
	pOn := tp > 0 && tp < 1
	mOn := mp > 0
	mp = min(mp, 1)
	if !(u >= 0) {
		u = 0
	}
	if u >= 1 {
		u = math.Nextafter32(1, 0)
	}
	var keep []int32 // the kept ids in draw order
	margin := 1.0
	if !kOn && !pOn {
		for i, q := range p {
			if q > 0 && (!mOn || q >= mp) {
				keep = append(keep, int32(i))
			}
		}
	} else {
		for i, q := range p {
			if q > 0 {
				keep = append(keep, int32(i))
			}
		}
		slices.SortFunc(keep, func(a, b int32) int {
			if c := cmp.Compare(p[b], p[a]); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		if kOn && int(k) < len(keep) {
			keep = keep[:k]
		}
		if pOn {
			var sum uint64
			for _, id := range keep {
				sum += sampleWeight(p[id])
			}
			t := float64(tp) * float64(sum)
			tau := max(uint64(math.Ceil(t)), 1)
			var c uint64
			for i, id := range keep {
				w := sampleWeight(p[id])
				if c+w >= tau {
					margin = min(margin, cutMargin(t, c, c+w, sum))
					keep = keep[:i+1]
					break
				}
				c += w
			}
		}
		if mOn {
			n := len(keep)
			for i, id := range keep {
				if p[id] < mp {
					n = i
					break
				}
			}
			keep = keep[:n]
		}
	}
	var kept uint64
	for _, id := range keep {
		kept += sampleWeight(p[id])
	}
	t := float64(u) * float64(kept)
	tau := uint64(math.Floor(t)) + 1
	var c uint64
	for _, id := range keep {
		w := sampleWeight(p[id])
		if w > 0 && c+w >= tau {
			return id, min(margin, cutMargin(t, c, c+w, kept))
		}
		c += w
	}
	return int32(best), margin
}

// SampleMask sets, in place, the logits of the tokens mask disallows (bit
// i%32 of word i/32 clear) to -inf: how the kernel reads a masked token, so
// SampleDraw of the masked logits is the kernel's masked draw. A nil mask
// allows every token.
func SampleMask(x []float32, mask []uint32) {
	if mask == nil {
		return
	}
	for i := range x {
		if mask[i>>5]>>(i&31)&1 == 0 {
			x[i] = negInf
		}
	}
}
