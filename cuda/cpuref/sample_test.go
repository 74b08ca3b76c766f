package cpuref_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
	"github.com/megamoe/megamoe/engine"
)

// sampleRow makes logits with NaN, -inf and exact ties sprinkled in.
func sampleRow(rng *rand.Rand, vocab int, scale float64) []float32 {
	x := make([]float32, vocab)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * scale)
		switch rng.IntN(200) {
		case 0:
			x[i] = float32(math.NaN())
		case 1:
			x[i] = float32(math.Inf(-1))
		case 2, 3:
			if i > 0 {
				x[i] = x[rng.IntN(i)]
			}
		}
	}
	return x
}

// TestSampleGreedyKnown: a greedy draw (temp 0) is the argmax, NaN as -inf,
// ties to the lowest id, 0 for a row of -inf and NaN.
func TestSampleGreedyKnown(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		x    []float32
		want int32
	}{
		{[]float32{1, 3, 3, 2}, 1},
		{[]float32{nan, -inf, nan}, 0},
		{[]float32{-inf, nan, -5}, 2},
		{[]float32{0, inf, 1, inf}, 1},
		{[]float32{nan}, 0},
	} {
		zero := []float32{0}
		if got := cpuref.SampleDraw(tc.x, 1, len(tc.x), zero, []int32{0}, zero, zero, []float32{0.5})[0]; got != tc.want {
			t.Errorf("greedy draw of %v = %d, want %d", tc.x, got, tc.want)
		}
	}
}

// engineProb is the engine's float64 p for the quirk check.
func engineProb(x []float32, T float64) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		if v == v && float64(v) > m {
			m = float64(v)
		}
	}
	invT := 1 / max(T, 1e-5)
	p := make([]float64, len(x))
	for i, v := range x {
		if v == v {
			p[i] = math.Exp((float64(v) - m) * invT)
		}
	}
	return p
}

// TestSampleDrawMatchesEngine feeds the twin the first uniform the engine's
// seeded Sampler draws (NewSampler's PCG stream; choose reads one Float64)
// and compares the tokens. Allowed differences, counted: rows whose threshold
// lies within 1e-5 of a mass boundary, and rows where the two tokens have
// p within 1e-5 (order among near-equal p: fp32 vs float64 ties). Rows where
// exactly k tokens have p > 1e-7 under top-k and top-p are skipped: there the
// engine's candidate shortcut applies top-p against the full mass instead of
// the top-k mass (a quirk of engine/sampler.go).
func TestSampleDrawMatchesEngine(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	temps := []float32{0, 0.3, 1, 2}
	topKs := []int32{0, 1, 50, 4096}
	topPs := []float32{0, 0.5, 0.95}
	minPs := []float32{0, 0.05}
	var rows, near, ties, quirk, fail int
	for _, vocab := range []int{1000, 32000} {
		for _, T := range temps {
			for _, k := range topKs {
				for _, tp := range topPs {
					for _, mp := range minPs {
						for rep := 0; rep < 3; rep++ {
							x := sampleRow(rng, vocab, 1+3*rng.Float64())
							seed := rng.Uint64()
							ep := engine.SamplingParams{Temperature: float64(T), TopK: int(k), TopP: float64(tp), MinP: float64(mp), Seed: &seed}
							want := engine.NewSampler(ep, nil).Sample(x).ID
							u := cuda.Uniform32(rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)).Float64())
							ids, margin := cpuref.SampleDrawMargin(x, 1, vocab, []float32{T}, []int32{k}, []float32{tp}, []float32{mp}, []float32{u})
							rows++
							if ids[0] == want {
								continue
							}
							p := engineProb(x, float64(T))
							if k > 0 && tp > 0 && tp < 1 {
								n := 0
								for _, q := range p {
									if q > 1e-7 {
										n++
									}
								}
								if n == int(k) {
									quirk++
									continue
								}
							}
							switch {
							case margin[0] < 1e-5:
								near++
							case math.Abs(p[ids[0]]-p[want]) <= 1e-5*max(p[ids[0]], p[want]):
								ties++
							default:
								fail++
								t.Errorf("vocab=%d T=%v k=%d top_p=%v min_p=%v u=%v: twin %d (p=%g), engine %d (p=%g), margin %g",
									vocab, T, k, tp, mp, u, ids[0], p[ids[0]], want, p[want], margin[0])
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d rows: %d differ near a threshold, %d by near-equal p, %d skipped (engine quirk), %d unexplained", rows, near, ties, quirk, fail)
}

// TestSampleDrawDistribution checks the twin's draws against the exact kept
// distribution on a tiny row (u swept over a fine grid).
func TestSampleDrawDistribution(t *testing.T) {
	x := []float32{2, 1, 1, 0, float32(math.NaN()), -1}
	for _, tc := range []struct {
		name string
		k    int32
		tp   float32
		mp   float32
		want []int32 // kept ids in draw order
	}{
		{"all", 0, 0, 0, []int32{0, 1, 2, 3, 5}},
		{"min_p", 0, 0, 0.3, []int32{0, 1, 2}},
		{"top_k2", 2, 0, 0, []int32{0, 1}},
		{"top_p", 0, 0.7, 0, []int32{0, 1}},
		{"top_k_p", 3, 0.5, 0, []int32{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := make([]float64, len(x))
			var total float64
			for _, id := range tc.want {
				p[id] = float64(cpuref.SampleProb(x[id], 2, 1))
				total += p[id]
			}
			var c float64
			for _, id := range tc.want {
				lo, hi := c/total, (c+p[id])/total
				c += p[id]
				for _, f := range []float64{0.001, 0.5, 0.999} {
					u := float32(lo + f*(hi-lo))
					got := cpuref.SampleDraw(x, 1, len(x), []float32{1}, []int32{tc.k}, []float32{tc.tp}, []float32{tc.mp}, []float32{u})[0]
					if got != id {
						t.Errorf("u=%v: got %d, want %d", u, got, id)
					}
				}
			}
		})
	}
}

// ---- a sequential model of kernels/sample.cu's selection, checked against the twin ----

type kbound struct {
	key uint32
	id  int
}

func (b kbound) has(key uint32, i int) bool { return key > b.key || (key == b.key && i <= b.id) }

type kmodel struct {
	p []float32
}

func (km kmodel) w(i int, mass bool) uint64 {
	if !mass {
		return 1
	}
	return uint64(math.RoundToEven(float64(km.p[i]) * (1 << 40)))
}

func (km kmodel) sum(b kbound) uint64 {
	var s uint64
	for i, q := range km.p {
		if q > 0 && b.has(math.Float32bits(q), i) {
			s += km.w(i, true)
		}
	}
	return s
}

func (km kmodel) ordered(b kbound, eq bool, eqkey uint32, mass bool, tau uint64) int {
	var c uint64
	for i, q := range km.p {
		key := math.Float32bits(q)
		if q > 0 && b.has(key, i) && (!eq || key == eqkey) {
			w := km.w(i, mass)
			if w > 0 && c < tau && c+w >= tau {
				return i
			}
			c += w
		}
	}
	return -1
}

func (km kmodel) rank(b kbound, mass bool, tau uint64) (kbound, bool) {
	var prefix uint32
	var acc uint64
	var hmin []int
	bin := 0
	for pass := 0; pass < 3; pass++ {
		wd, sh := 11, []int{21, 10, 0}[pass]
		if pass == 2 {
			wd = 10
		}
		nb, hs := 1<<wd, sh+wd
		hist := make([]uint64, nb)
		hmin = make([]int, nb)
		for j := range hmin {
			hmin[j] = math.MaxInt32
		}
		for i, q := range km.p {
			key := math.Float32bits(q)
			if !(q > 0) || !b.has(key, i) || (hs < 32 && key>>hs != prefix>>hs) {
				continue
			}
			bn := int(key>>sh) & (nb - 1)
			hist[bn] += km.w(i, mass)
			hmin[bn] = min(hmin[bn], i)
		}
		bin = -1
		run := acc
		for bn := nb - 1; bn >= 0; bn-- {
			if run < tau && run+hist[bn] >= tau {
				bin, acc = bn, run
			}
			run += hist[bn]
		}
		if bin < 0 {
			return b, false
		}
		prefix |= uint32(bin) << sh
	}
	wt := uint64(1)
	if mass {
		wt = uint64(math.RoundToEven(float64(math.Float32frombits(prefix)) * (1 << 40)))
	}
	j := (tau-acc+wt-1)/wt - 1
	id := hmin[bin]
	if j > 0 {
		id = km.ordered(b, true, prefix, false, j+1)
	}
	return kbound{prefix, id}, id >= 0
}

// kernelModel follows sample_draw step by step.
func kernelModel(x []float32, T float32, k int32, tp, mp, u float32) int32 {
	m, best := negInfArgmax(x)
	if !(T > 0) || math.IsInf(float64(m), 0) {
		return int32(best)
	}
	invT := 1 / max(T, 1e-5)
	km := kmodel{make([]float32, len(x))}
	for i, v := range x {
		km.p[i] = cpuref.SampleProb(v, m, invT)
	}
	kOn, pOn, mOn := k > 0 && int(k) < len(x), tp > 0 && tp < 1, mp > 0
	mp = min(mp, 1)
	u = min(max(u, 0), math.Nextafter32(1, 0))
	all := kbound{0, -1}
	id := -1
	if !kOn && !pOn {
		b := all
		if mOn {
			b = kbound{math.Float32bits(mp), math.MaxInt32}
		}
		kept := km.sum(b)
		id = km.ordered(b, false, 0, true, uint64(math.Floor(float64(u)*float64(kept)))+1)
	} else {
		b := all
		if kOn {
			if s, ok := km.rank(b, false, uint64(k)); ok {
				b = s
			}
		}
		if pOn {
			tau := max(uint64(math.Ceil(float64(tp)*float64(km.sum(b)))), 1)
			if s, ok := km.rank(b, true, tau); ok {
				b = s
			}
		}
		if mOn {
			q := kbound{math.Float32bits(mp), math.MaxInt32}
			if q.key > b.key || (q.key == b.key && q.id < b.id) {
				b = q
			}
		}
		kept := km.sum(b)
		if s, ok := km.rank(b, true, uint64(math.Floor(float64(u)*float64(kept)))+1); ok {
			id = s.id
		}
	}
	if id < 0 {
		return int32(best)
	}
	return int32(id)
}

func negInfArgmax(x []float32) (float32, int) {
	m, best := float32(math.Inf(-1)), 0
	for i, v := range x {
		if v == v && v > m {
			m, best = v, i
		}
	}
	return m, best
}

// TestKernelModelMatchesTwin checks the kernel's radix-select algorithm (as a
// sequential model) against the twin's full sort, with heavy ties.
func TestKernelModelMatchesTwin(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	n := 0
	for _, vocab := range []int{1, 2, 37, 1000, 20000} {
		for rep := 0; rep < 60; rep++ {
			x := sampleRow(rng, vocab, 1+3*rng.Float64())
			if rep%4 == 1 { // coarse logits: many exact ties in p
				for i := range x {
					x[i] = float32(math.Round(float64(x[i]) * 2))
				}
			}
			T := []float32{0, 0.3, 1, 2, 50}[rng.IntN(5)]
			k := []int32{0, 1, 2, 50, 4096, int32(vocab)}[rng.IntN(6)]
			tp := []float32{0, 0.5, 0.95, 0.999}[rng.IntN(4)]
			mp := []float32{0, 0.05, 0.5}[rng.IntN(3)]
			u := rng.Float32()
			want := cpuref.SampleDraw(x, 1, vocab, []float32{T}, []int32{k}, []float32{tp}, []float32{mp}, []float32{u})[0]
			if got := kernelModel(x, T, k, tp, mp, u); got != want {
				t.Errorf("vocab=%d T=%v k=%d top_p=%v min_p=%v u=%v: model %d, twin %d", vocab, T, k, tp, mp, u, got, want)
			}
			n++
		}
	}
	t.Logf("%d rows", n)
}
