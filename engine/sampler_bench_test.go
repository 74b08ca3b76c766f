package engine

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkSample: the host sampler on one row of the real vocabulary
// (129280), the engine's cost per sampled token.
func BenchmarkSample(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 129280)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	for _, c := range []struct {
		name string
		p    SamplingParams
	}{
		{"greedy", SamplingParams{}},
		{"T1", SamplingParams{Temperature: 1}},
		{"T0.7_topp0.95", SamplingParams{Temperature: 0.7, TopP: 0.95}},
		{"T1_topk50", SamplingParams{Temperature: 1, TopK: 50}},
	} {
		b.Run(c.name, func(b *testing.B) {
			seed := uint64(3)
			c.p.Seed = &seed
			s := NewSampler(c.p, nil)
			for b.Loop() {
				s.Sample(logits)
			}
		})
	}
}
