package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// chooseFullSort is choose with every token of positive probability as a
// candidate (all sorted): what the candidate histogram must reproduce draw
// for draw.
func chooseFullSort(s *Sampler, x []float32) int32 {
	best := Argmax(x)
	if s.p.Temperature == 0 || math.IsInf(float64(x[best]), 0) {
		return best
	}
	invT := 1 / max(s.p.Temperature, 1e-5)
	m := float64(x[best])
	prob := make([]float64, len(x))
	var sum float64
	for i, v := range x {
		prob[i] = math.Exp((float64(v) - m) * invT)
		sum += prob[i]
	}
	topK, topP, minP := s.p.TopK, s.p.TopP, s.p.MinP
	if topK <= 0 || topK >= len(x) {
		topK = 0
	}
	if topP <= 0 || topP >= 1 {
		topP = 0
	}
	if topK == 0 && topP == 0 {
		return s.choose(x) // the id-order path, unchanged
	}
	var idx []int32
	for i, q := range prob {
		if q > 0 {
			idx = append(idx, int32(i))
		}
	}
	return s.drawRanked(idx, prob, sum, topK, topP, minP)
}

// TestCandidatesMatchFullSort: top-k, top-p and min-p draw the same token as a
// full sort, over flat and peaked rows, ties, −inf entries, long and short
// vocabularies, with the same random stream.
func TestCandidatesMatchFullSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	rows := map[string][]float32{}
	for _, v := range []int{7, 1000, 40000} {
		for _, sigma := range []float64{0.5, 3, 12} {
			x := make([]float32, v)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * sigma)
			}
			rows[fmtRow(v, sigma, "normal")] = x
			q := make([]float32, v) // heavy ties
			for i := range q {
				q[i] = float32(math.Round(rng.NormFloat64() * sigma))
			}
			rows[fmtRow(v, sigma, "ties")] = q
		}
	}
	inf := make([]float32, 3000)
	for i := range inf {
		inf[i] = float32(math.Inf(-1))
		if i%7 == 0 {
			inf[i] = float32(rng.NormFloat64())
		}
	}
	rows["-inf mostly"] = inf
	params := []SamplingParams{
		{Temperature: 1, TopK: 1}, {Temperature: 1, TopK: 50}, {Temperature: 0.3, TopK: 5000},
		{Temperature: 1, TopP: 0.95}, {Temperature: 0.7, TopP: 0.5}, {Temperature: 2, TopP: 0.999999},
		{Temperature: 1, TopP: 1e-9}, {Temperature: 1, TopK: 40, TopP: 0.9, MinP: 0.05},
		{Temperature: 1.3, TopP: 0.8, MinP: 0.2}, {Temperature: 1, TopK: 200000},
	}
	draws := 10
	if testing.Short() {
		draws = 2 // every row and parameter set still; fewer draws of each
	}
	for name, x := range rows {
		for pi, p := range params {
			seedA, seedB := uint64(pi+1), uint64(pi+1)
			pa, pb := p, p
			pa.Seed, pb.Seed = &seedA, &seedB
			a, b := NewSampler(pa, nil), NewSampler(pb, nil)
			for draw := range draws {
				got, want := a.Sample(x).ID, chooseFullSort(b, b.processed(x))
				if got != want {
					t.Fatalf("%s, params %+v, draw %d: candidates %d, full sort %d", name, p, draw, got, want)
				}
			}
		}
	}
}

func fmtRow(v int, sigma float64, kind string) string {
	return fmt.Sprintf("%s v=%d sigma=%g", kind, v, sigma)
}

// TestGreedyWithoutCopy: the greedy fast path is Argmax of processed logits,
// NaN and −inf included.
func TestGreedyWithoutCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	rows := [][]float32{{nan, nan}, {inf, nan, inf}, {nan, 1, 1, nan}, {inf, inf}, {2, nan, 2}, {}}
	for range 200 {
		x := make([]float32, 1+rng.IntN(50))
		for i := range x {
			switch rng.IntN(6) {
			case 0:
				x[i] = nan
			case 1:
				x[i] = inf
			default:
				x[i] = float32(rng.IntN(5))
			}
		}
		rows = append(rows, x)
	}
	s := NewSampler(SamplingParams{}, nil)
	for _, x := range rows {
		if len(x) == 0 {
			continue
		}
		if got, want := argmaxNaNLow(x), Argmax(s.processed(x)); got != want {
			t.Fatalf("%v: fast path %d, Argmax of processed %d", x, got, want)
		}
	}
}
