package engine

import "math"

// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): a draft d
// drawn from the drafter's distribution q is accepted with probability
// min(1, p(d)/q(d)), p being the distribution plain sampling draws from;
// after a rejection the token is drawn from max(0, p−q) normalised. Each
// emitted token is then distributed exactly as p, so a request samples the
// distribution of plain decoding (not its random stream: a seeded request
// gives other tokens with drafts than without, reproducibly). With
// temperature 0, p is a point mass and the rule accepts the draft exactly
// when it is the greedy token.

// dist is the distribution choose draws from for the processed logits x:
// temperature, then top-k, top-p and min-p, normalised; a point mass at the
// argmax where choose is greedy. It reuses the sampler's scratch.
func (s *Sampler) dist(x []float32) []float64 {
	out := make([]float64, len(x))
	best := Argmax(x)
	if s.p.Temperature == 0 || math.IsInf(float64(x[best]), 0) {
		out[best] = 1
		return out
	}
	invT := 1 / max(s.p.Temperature, 1e-5)
	expRel(out, x, float64(x[best]), invT)
	var sum float64
	for _, q := range out {
		sum += q
	}
	topK, topP := s.p.rankFilters(len(x))
	if topK == 0 && topP == 0 {
		var kept float64
		for i, q := range out {
			if q < s.p.MinP || q == 0 {
				out[i] = 0
			}
			kept += out[i]
		}
		for i := range out {
			out[i] /= kept
		}
		return out
	}
	keep := keepRanked(s.candidates(out, sum, topK, topP), out, sum, topK, topP, s.p.MinP)
	var kept float64
	for _, id := range keep {
		kept += out[id]
	}
	res := make([]float64, len(x))
	for _, id := range keep {
		res[id] = out[id] / kept
	}
	return res
}

// targetDist is the distribution SampleMasked draws from for logits.
func (s *Sampler) targetDist(logits []float32, mask []uint32) []float64 {
	x := s.processed(logits)
	if mask != nil {
		applyMask(x, mask)
	}
	s.suppressStops(x) // min_tokens
	return s.dist(x)
}

// draftDist is the drafter's proposal distribution for its logits: the
// request's temperature and filters without penalties or mask (the
// verification applies those).
func (s *Sampler) draftDist(logits []float32) []float64 {
	x := append(s.work[:0], logits...)
	s.work = x
	for i, v := range x {
		if v != v {
			x[i] = float32(math.Inf(-1))
		}
	}
	return s.dist(x)
}

// drawFrom draws an id from the normalised distribution p.
func (s *Sampler) drawFrom(p []float64) int32 {
	u := s.rng.Float64()
	last := int32(0)
	for i, v := range p {
		if v <= 0 {
			continue
		}
		last = int32(i)
		if u -= v; u < 0 {
			return int32(i)
		}
	}
	return last
}

// acceptDraft applies the speculative-sampling rule to draft d with target p
// and proposal q: (d, true) when accepted, else (a token drawn from the
// residual max(0, p−q), false).
func (s *Sampler) acceptDraft(d int32, p, q []float64) (int32, bool) {
	if q[d] > 0 && s.rng.Float64()*q[d] < p[d] {
		return d, true
	}
	r := make([]float64, len(p))
	var sum float64
	for i := range p {
		r[i] = max(p[i]-q[i], 0)
		sum += r[i]
	}
	if sum <= 0 { // p == q up to rounding: the rejection had probability ~0
		return s.drawFrom(p), false
	}
	for i := range r {
		r[i] /= sum
	}
	return s.drawFrom(r), false
}

// withLogprobs is the Sampled of id with the logprobs the request asks for.
func (s *Sampler) withLogprobs(logits []float32, id int32) Sampled {
	out := Sampled{ID: id}
	if s.p.Logprobs || s.p.TopLogprobs > 0 {
		lse := logsumexp(logits)
		out.Logprob = logprobLSE(logits, id, lse)
		if s.p.TopLogprobs > 0 {
			out.Top = topLogprobsLSE(logits, s.p.TopLogprobs, lse)
		}
	}
	return out
}
