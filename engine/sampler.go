package engine

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"

	"github.com/megamoe/megamoe/backend"
)

// SamplingParams are the per-request sampling controls (OpenAI + vLLM names).
// The zero value is greedy decoding without penalties.
type SamplingParams struct {
	Temperature       float64 // 0 = greedy (argmax)
	TopP              float64 // nucleus mass in (0, 1]; 0 or 1 = off
	TopK              int     // keep the k most likely; 0 or <0 = off
	MinP              float64 // drop tokens with p < MinP·p_max; 0 = off
	Seed              *uint64 // nil = nondeterministic
	PresencePenalty   float64 // OpenAI: −α·[count>0] over generated tokens
	FrequencyPenalty  float64 // OpenAI: −α·count over generated tokens
	RepetitionPenalty float64 // vLLM/CTRL over prompt+generated: 1 (or 0) = off
	LogitBias         map[int32]float32
	Logprobs          bool // return the chosen token's logprob
	TopLogprobs       int  // and this many alternatives (0–20)
}

// MaxTopLogprobs is OpenAI's bound on top_logprobs.
const MaxTopLogprobs = 20

// Validate checks ranges (the API reports the same bounds with the field name).
func (p *SamplingParams) Validate(vocab int) error {
	switch {
	case math.IsNaN(p.Temperature) || p.Temperature < 0:
		return fmt.Errorf("temperature %v must be >= 0", p.Temperature)
	case math.IsNaN(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("top_p %v must be in [0, 1]", p.TopP)
	case math.IsNaN(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return fmt.Errorf("min_p %v must be in [0, 1]", p.MinP)
	case math.IsNaN(p.RepetitionPenalty) || p.RepetitionPenalty < 0:
		return fmt.Errorf("repetition_penalty %v must be > 0", p.RepetitionPenalty)
	case p.TopLogprobs < 0 || p.TopLogprobs > MaxTopLogprobs:
		return fmt.Errorf("top_logprobs %d must be in [0, %d]", p.TopLogprobs, MaxTopLogprobs)
	case math.IsNaN(p.PresencePenalty) || math.IsNaN(p.FrequencyPenalty):
		return errors.New("penalties must be numbers")
	}
	for id := range p.LogitBias {
		if id < 0 || int(id) >= vocab {
			return fmt.Errorf("logit_bias token %d outside the vocabulary [0, %d)", id, vocab)
		}
	}
	return nil
}

// TokenLogprob is one candidate with its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Sampled is the outcome of one sampling step.
type Sampled struct {
	ID      int32
	Logprob float32        // log p(ID) under the raw model distribution (set when Logprobs)
	Top     []TokenLogprob // the TopLogprobs most likely tokens, most likely first
}

// Sampler turns one logits row into a token for one sequence. It owns the
// sequence's RNG (so a fixed seed reproduces the output whatever else is in
// the batch) and the occurrence counts the penalties need.
type Sampler struct {
	p      SamplingParams
	rng    *rand.Rand
	counts map[int32]int  // generated tokens
	seen   map[int32]bool // prompt + generated (repetition penalty)
	n      int            // generated tokens accepted
	// stops are masked while n < minTokens (holdStops).
	stops     []int32
	minTokens int
	// scratch reused across steps
	work []float32
	prob []float64
	idx  []int32
}

// NewSampler creates a sampler; prompt feeds the repetition penalty.
func NewSampler(p SamplingParams, prompt []int32) *Sampler {
	var seed uint64
	if p.Seed != nil {
		seed = *p.Seed
	} else {
		seed = rand.Uint64()
	}
	s := &Sampler{p: p, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), counts: map[int32]int{}}
	if p.RepetitionPenalty > 0 && p.RepetitionPenalty != 1 {
		s.seen = make(map[int32]bool, len(prompt))
		for _, t := range prompt {
			s.seen[t] = true
		}
	}
	return s
}

// Params returns the sampling parameters.
func (s *Sampler) Params() SamplingParams { return s.p }

// Accept records a generated token for the penalties.
func (s *Sampler) Accept(id int32) {
	s.n++
	s.counts[id]++
	if s.seen != nil {
		s.seen[id] = true
	}
}

// Sample picks the next token from logits (len = vocab); logits is not modified.
func (s *Sampler) Sample(logits []float32) Sampled { return s.SampleMasked(logits, nil) }

// SampleMasked is Sample over the tokens whose bit is set in mask (nil: all);
// logprobs stay those of the raw logits.
func (s *Sampler) SampleMasked(logits []float32, mask []uint32) Sampled {
	var out Sampled
	lse := 0.0
	if s.p.Logprobs || s.p.TopLogprobs > 0 {
		lse = logsumexp(logits) // once for both (a pass of exp over the vocabulary)
		if s.p.TopLogprobs > 0 {
			out.Top = topLogprobsLSE(logits, s.p.TopLogprobs, lse)
		}
	}
	switch {
	case mask != nil || s.holding():
		x := s.processed(logits)
		if mask != nil {
			applyMask(x, mask)
		}
		s.suppressStops(x)
		out.ID = s.choose(x)
	case s.p.Temperature == 0 && s.unbiased():
		out.ID = argmaxNaNLow(logits) // choose(processed(logits)) without the copy
	default:
		out.ID = s.choose(s.processed(logits))
	}
	if s.p.Logprobs || s.p.TopLogprobs > 0 {
		out.Logprob = logprobLSE(logits, out.ID, lse)
	}
	return out
}

// DeviceDraw returns the parameters to draw this sequence's next token on the
// model's device (backend.Draw, with a uniform from the sequence's RNG), or
// false where the host must sample: logit bias, penalties or logprobs.
func (s *Sampler) DeviceDraw() (backend.Draw, bool) {
	if !s.unbiased() || s.p.Logprobs || s.p.TopLogprobs > 0 {
		return backend.Draw{}, false
	}
	d := backend.Draw{Temp: float32(s.p.Temperature), TopP: float32(s.p.TopP), MinP: float32(s.p.MinP)}
	if s.p.TopK > 0 && s.p.TopK <= math.MaxInt32 {
		d.TopK = int32(s.p.TopK)
	}
	if s.p.Temperature > 0 {
		d.U = float32(s.rng.Float64()) // the backend keeps it below 1
	}
	return d, true
}

// unbiased reports that processed would only turn NaN into −inf.
func (s *Sampler) unbiased() bool {
	return !s.holding() && len(s.p.LogitBias) == 0 && s.seen == nil && s.p.PresencePenalty == 0 && s.p.FrequencyPenalty == 0
}

// argmaxNaNLow is Argmax with NaN read as −inf: the first largest value, 0
// when every entry is NaN or −inf. It is the whole host cost of a greedy
// token, so it tests 8 entries a branch: a block is rescanned only when one
// of them beats the best so far, which is rare after the first blocks (twice
// as fast as one entry a branch over a 129280-entry row).
func argmaxNaNLow(x []float32) int32 {
	best, bv := 0, float32(math.Inf(-1))
	i := 0
	for ; i+8 <= len(x); i += 8 {
		c := x[i : i+8 : i+8]
		if c[0] > bv || c[1] > bv || c[2] > bv || c[3] > bv || c[4] > bv || c[5] > bv || c[6] > bv || c[7] > bv {
			for j, v := range c {
				if v > bv {
					best, bv = i+j, v
				}
			}
		}
	}
	for ; i < len(x); i++ {
		if x[i] > bv {
			best, bv = i, x[i]
		}
	}
	return int32(best)
}

// processed applies logit_bias and the penalties to a copy of logits; NaN becomes −inf.
func (s *Sampler) processed(logits []float32) []float32 {
	x := append(s.work[:0], logits...)
	s.work = x
	for i, v := range x {
		if v != v {
			x[i] = float32(math.Inf(-1))
		}
	}
	for id, b := range s.p.LogitBias {
		if int(id) < len(x) {
			x[id] += b
		}
	}
	if rp := float32(s.p.RepetitionPenalty); s.seen != nil {
		for id := range s.seen {
			if int(id) >= len(x) || id < 0 {
				continue
			}
			if x[id] > 0 {
				x[id] /= rp
			} else {
				x[id] *= rp
			}
		}
	}
	if s.p.PresencePenalty != 0 || s.p.FrequencyPenalty != 0 {
		for id, c := range s.counts {
			if int(id) >= len(x) || id < 0 {
				continue
			}
			x[id] -= float32(s.p.FrequencyPenalty)*float32(c) + float32(s.p.PresencePenalty)
		}
	}
	return x
}

// choose is greedy for T=0, else temperature → top-k → top-p → min-p → draw.
// Only the candidates that can survive the filters are sorted (a full sort of a
// 129k vocabulary per token would dominate a decode step on the CPU).
func (s *Sampler) choose(x []float32) int32 {
	best := Argmax(x)
	if s.p.Temperature == 0 || math.IsInf(float64(x[best]), 0) {
		// Greedy; or nothing is possible (argmax then picks id 0); or a +inf
		// logit, which takes all the mass.
		return best
	}
	invT := 1 / max(s.p.Temperature, 1e-5)
	m := float64(x[best])
	if cap(s.prob) < len(x) {
		s.prob = make([]float64, len(x))
	}
	prob := s.prob[:len(x)] // unnormalised, prob[best] = 1
	expRel(prob, x, m, invT)
	var sum float64
	for _, q := range prob {
		sum += q
	}
	topK, topP := s.p.rankFilters(len(x))
	minP := s.p.MinP
	if topK == 0 && topP == 0 {
		// No rank-based filter: draw over the ids in order, honouring min-p.
		thr := minP // relative to prob[best] = 1
		var kept float64
		for _, q := range prob {
			if q >= thr {
				kept += q
			}
		}
		u := s.rng.Float64() * kept
		last := best
		for i, q := range prob {
			if q < thr || q == 0 {
				continue
			}
			last = int32(i)
			if u -= q; u < 0 {
				return int32(i)
			}
		}
		return last
	}
	return s.drawRanked(s.candidates(prob, sum, topK, topP), prob, sum, topK, topP, minP)
}

// drawRanked sorts the candidates idx by rank (prob descending, ties to the
// lower id), keeps the first topK (> 0), then the shortest prefix holding topP
// (> 0) of their mass, then drops tokens under minP (prob[best] = 1), and
// draws one in rank order.
func (s *Sampler) drawRanked(idx []int32, prob []float64, sum float64, topK int, topP, minP float64) int32 {
	idx = keepRanked(idx, prob, sum, topK, topP, minP)
	var kept float64
	for _, id := range idx {
		kept += prob[id]
	}
	u := s.rng.Float64() * kept
	for _, id := range idx {
		if u -= prob[id]; u < 0 {
			return id
		}
	}
	return idx[len(idx)-1]
}

// keepRanked sorts idx by rank and returns the prefix that survives top-k,
// top-p and min-p (drawRanked's filters).
func keepRanked(idx []int32, prob []float64, sum float64, topK int, topP, minP float64) []int32 {
	slices.SortFunc(idx, func(a, b int32) int {
		if c := cmp.Compare(prob[b], prob[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	n := len(idx)
	if topK > 0 && topK < n {
		n = topK
		sum = 0
		for _, id := range idx[:n] {
			sum += prob[id]
		}
	}
	if topP > 0 {
		var c float64
		for i, id := range idx[:n] {
			c += prob[id]
			if c >= topP*sum {
				n = i + 1
				break
			}
		}
	}
	if minP > 0 {
		for i := 1; i < n; i++ {
			if prob[idx[i]] < minP {
				n = i
				break
			}
		}
	}
	return idx[:n]
}

// expParallelMin is the row length from which expRel splits the row over
// goroutines (a 129k vocabulary: ~2 ms of math.Exp on one core).
const expParallelMin = 1 << 15

// expRel sets prob[i] = exp((x[i] - m)·invT) in float64, in parallel chunks
// for long rows (each value is the same whoever computes it).
func expRel(prob []float64, x []float32, m, invT float64) {
	fill := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			prob[i] = math.Exp((float64(x[i]) - m) * invT)
		}
	}
	n := len(x)
	workers := min(runtime.GOMAXPROCS(0), n/(expParallelMin/2))
	if n < expParallelMin || workers < 2 {
		fill(0, n)
		return
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fill(lo, hi)
		}(w*n/workers, (w+1)*n/workers)
	}
	wg.Wait()
}

// candidates returns the tokens that can survive top-k (k > 0) or top-p: all
// tokens with prob at least some threshold, where that set holds k tokens,
// or (without top-k) at least topP of the mass sum. Every other token ranks
// below all of them, so sorting the candidates gives the head of the full
// rank order. The threshold is the lower edge of a power-of-two bucket of a
// one-pass histogram (a full sort of a 129k vocabulary took tens of ms).
func (s *Sampler) candidates(prob []float64, sum float64, topK int, topP float64) []int32 {
	var cnt [2048]int32
	var mass [2048]float64
	for _, q := range prob {
		if q > 0 {
			e := math.Float64bits(q) >> 52
			cnt[e]++
			mass[e] += q
		}
	}
	idx := s.idx[:0]
	var c int32
	var ms float64
	for e := 2047; e >= 0; e-- {
		c += cnt[e]
		ms += mass[e]
		enough := topK > 0 && int(c) >= topK || topK == 0 && ms >= topP*sum
		if !enough && e > 0 {
			continue
		}
		thr := math.Float64frombits(uint64(e) << 52) // e = 0: every q > 0
		idx = idx[:0]
		var m float64
		for i, q := range prob {
			if q >= thr && q > 0 {
				idx = append(idx, int32(i))
				m += q
			}
		}
		// The bucket sums are rounded in another order: confirm on the set.
		if e == 0 || topK > 0 || m >= topP*sum {
			break
		}
	}
	s.idx = idx
	return idx
}

// Argmax is the greedy choice: the largest logit, ties to the lower id, NaN
// skipped (an all-NaN row gives 0).
func Argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] || (x[best] != x[best] && v == v) {
			best = i
		}
	}
	return int32(best)
}

// logsumexp of a row, ignoring NaN; −inf if every entry is −inf or NaN.
func logsumexp(x []float32) float64 {
	m := math.Inf(-1)
	for _, v := range x {
		if float64(v) > m {
			m = float64(v)
		}
	}
	if math.IsInf(m, 0) {
		return m
	}
	var s float64
	for _, v := range x {
		if v == v {
			s += math.Exp(float64(v) - m)
		}
	}
	return m + math.Log(s)
}

// logprobLSE is log softmax(logits)[id] given lse = logsumexp(logits).
func logprobLSE(logits []float32, id int32, lse float64) float32 {
	if id < 0 || int(id) >= len(logits) {
		return float32(math.Inf(-1))
	}
	v := logits[id]
	if v != v || math.IsInf(lse, 0) {
		return float32(math.Inf(-1))
	}
	return float32(float64(v) - lse)
}

// topLogprobsLSE returns the n > 0 most likely tokens of log
// softmax(logits), most likely first, ties broken by lower id, given lse =
// logsumexp(logits).
func topLogprobsLSE(logits []float32, n int, lse float64) []TokenLogprob {
	n = min(n, len(logits))
	// Partial selection: keep a small sorted list (n ≤ 20).
	top := make([]TokenLogprob, 0, n+1)
	less := func(a, b TokenLogprob) bool { // a ranks before b
		return a.Logprob > b.Logprob || (a.Logprob == b.Logprob && a.ID < b.ID)
	}
	for i, v := range logits {
		if v != v {
			v = float32(math.Inf(-1))
		}
		c := TokenLogprob{ID: int32(i), Logprob: v}
		if len(top) == n && !less(c, top[n-1]) {
			continue
		}
		j := len(top)
		top = append(top, c)
		for j > 0 && less(c, top[j-1]) {
			top[j] = top[j-1]
			j--
		}
		top[j] = c
		if len(top) > n {
			top = top[:n]
		}
	}
	for i := range top {
		if math.IsInf(lse, 0) || math.IsInf(float64(top[i].Logprob), -1) {
			top[i].Logprob = float32(math.Inf(-1))
		} else {
			top[i].Logprob = float32(float64(top[i].Logprob) - lse)
		}
	}
	return top
}

// rankFilters returns p's top-k and top-p for a vocabulary of n ids, 0 for
// one that keeps every id.
func (p SamplingParams) rankFilters(n int) (int, float64) {
	topK, topP := p.TopK, p.TopP
	if topK <= 0 || topK >= n {
		topK = 0
	}
	if topP <= 0 || topP >= 1 {
		topP = 0
	}
	return topK, topP
}
