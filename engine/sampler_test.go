package engine

import (
	"math"
	"testing"
)

func seed(v uint64) *uint64 { return &v }

var negInf = float32(math.Inf(-1))

// softmax64 is the reference distribution of logits/T.
func softmax64(x []float32, t float64) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, float64(v))
	}
	p := make([]float64, len(x))
	var s float64
	for i, v := range x {
		p[i] = math.Exp((float64(v) - m) / t)
		s += p[i]
	}
	for i := range p {
		p[i] /= s
	}
	return p
}

func histogram(t *testing.T, p SamplingParams, logits []float32, n int) []float64 {
	t.Helper()
	s := NewSampler(p, nil)
	h := make([]float64, len(logits))
	for range n {
		id := s.Sample(logits).ID
		if id < 0 || int(id) >= len(logits) {
			t.Fatalf("sampled id %d out of range", id)
		}
		h[id]++
	}
	for i := range h {
		h[i] /= float64(n)
	}
	return h
}

func TestGreedyArgmax(t *testing.T) {
	cases := []struct {
		name   string
		logits []float32
		want   int32
	}{
		{"plain", []float32{0.1, 3, -2, 2.9}, 1},
		{"first of ties", []float32{1, 5, 5, 0}, 1},
		{"nan ignored", []float32{float32(math.NaN()), 1, 2}, 2},
		{"all -inf", []float32{negInf, negInf, negInf}, 0},
		{"one finite", []float32{negInf, negInf, -1e30}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewSampler(SamplingParams{}, nil)
			if got := s.Sample(c.logits).ID; got != c.want {
				t.Fatalf("greedy = %d, want %d", got, c.want)
			}
		})
	}
}

// The empirical distribution of temperature sampling matches softmax(x/T).
func TestTemperatureDistribution(t *testing.T) {
	logits := []float32{1, 2, 0.5, -1, 1.5}
	const n = 200000
	for _, temp := range []float64{0.5, 1, 2} {
		h := histogram(t, SamplingParams{Temperature: temp, Seed: seed(7)}, logits, n)
		want := softmax64(logits, temp)
		for i := range want {
			// 5 standard errors of a binomial proportion.
			tol := 5 * math.Sqrt(want[i]*(1-want[i])/n)
			if math.Abs(h[i]-want[i]) > tol+1e-9 {
				t.Errorf("T=%v token %d: freq %.4f, want %.4f ± %.4f", temp, i, h[i], want[i], tol)
			}
		}
	}
}

func TestTopKTopPMinPDistribution(t *testing.T) {
	// probabilities at T=1: 0.4, 0.3, 0.2, 0.1 (logits are their logs)
	p := []float64{0.4, 0.3, 0.2, 0.1}
	logits := make([]float32, len(p))
	for i, v := range p {
		logits[i] = float32(math.Log(v))
	}
	cases := []struct {
		name string
		sp   SamplingParams
		want []float64
	}{
		{"top_k 2", SamplingParams{Temperature: 1, TopK: 2}, []float64{4.0 / 7, 3.0 / 7, 0, 0}},
		{"top_k 1 is greedy", SamplingParams{Temperature: 1, TopK: 1}, []float64{1, 0, 0, 0}},
		{"top_k > vocab", SamplingParams{Temperature: 1, TopK: 100}, p},
		{"top_p 0.7 keeps 2", SamplingParams{Temperature: 1, TopP: 0.7}, []float64{4.0 / 7, 3.0 / 7, 0, 0}},
		{"top_p 0.71 keeps 3", SamplingParams{Temperature: 1, TopP: 0.71}, []float64{4.0 / 9, 3.0 / 9, 2.0 / 9, 0}},
		{"top_p tiny keeps 1", SamplingParams{Temperature: 1, TopP: 1e-6}, []float64{1, 0, 0, 0}},
		{"top_p 1 is off", SamplingParams{Temperature: 1, TopP: 1}, p},
		{"min_p 0.6 drops p<0.24", SamplingParams{Temperature: 1, MinP: 0.6}, []float64{4.0 / 7, 3.0 / 7, 0, 0}},
		{"min_p 0.45 drops p<0.18", SamplingParams{Temperature: 1, MinP: 0.45}, []float64{4.0 / 9, 3.0 / 9, 2.0 / 9, 0}},
		{"min_p 1 keeps max", SamplingParams{Temperature: 1, MinP: 1}, []float64{1, 0, 0, 0}},
		{"top_k 3 then top_p 0.5", SamplingParams{Temperature: 1, TopK: 3, TopP: 0.5}, []float64{4.0 / 7, 3.0 / 7, 0, 0}},
		{"top_k 3 + min_p 0.6", SamplingParams{Temperature: 1, TopK: 3, MinP: 0.6}, []float64{4.0 / 7, 3.0 / 7, 0, 0}},
	}
	const n = 100000
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.sp.Seed = seed(11)
			h := histogram(t, c.sp, logits, n)
			for i := range c.want {
				tol := 5*math.Sqrt(c.want[i]*(1-c.want[i])/n) + 1e-9
				if math.Abs(h[i]-c.want[i]) > tol {
					t.Errorf("token %d: freq %.4f, want %.4f", i, h[i], c.want[i])
				}
			}
		})
	}
}

// A large vocabulary exercises the candidate-threshold path of top-p/top-k.
func TestTopPLargeVocabMatchesFullSort(t *testing.T) {
	const v = 50000
	logits := make([]float32, v)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i)*12.9898)*5 - float64(i%97)*0.01)
	}
	want := softmax64(logits, 1)
	// With top_p = 1-1e-9 nearly everything stays; the threshold path must fall back.
	sp := SamplingParams{Temperature: 1, TopP: 0.999999999, Seed: seed(3)}
	s := NewSampler(sp, nil)
	for range 100 {
		id := s.Sample(logits).ID
		if want[id] == 0 {
			t.Fatalf("sampled zero-probability token %d", id)
		}
	}
	// top_k 5 picks only among the 5 largest.
	order := topLogprobsLSE(logits, 5, logsumexp(logits))
	allowed := map[int32]bool{}
	for _, c := range order {
		allowed[c.ID] = true
	}
	s = NewSampler(SamplingParams{Temperature: 3, TopK: 5, Seed: seed(4)}, nil)
	for range 500 {
		if id := s.Sample(logits).ID; !allowed[id] {
			t.Fatalf("top_k 5 sampled %d outside the top 5", id)
		}
	}
}

func TestSeedReproducible(t *testing.T) {
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(math.Cos(float64(i)))
	}
	run := func(s *uint64) []int32 {
		sm := NewSampler(SamplingParams{Temperature: 1.2, TopP: 0.9, Seed: s}, nil)
		var out []int32
		for range 50 {
			out = append(out, sm.Sample(logits).ID)
		}
		return out
	}
	a, b, c := run(seed(42)), run(seed(42)), run(seed(43))
	same := func(x, y []int32) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Fatal("same seed gave different samples")
	}
	if same(a, c) {
		t.Fatal("different seeds gave identical 50-token samples")
	}
}

func TestPenalties(t *testing.T) {
	cases := []struct {
		name   string
		sp     SamplingParams
		prompt []int32
		gen    []int32
		logits []float32
		want   int32
	}{
		{"no penalty", SamplingParams{}, nil, []int32{0, 0}, []float32{2, 1.5, 0}, 0},
		{"frequency 0.3x2 flips", SamplingParams{FrequencyPenalty: 0.3}, nil, []int32{0, 0}, []float32{2, 1.5, 0}, 1},
		{"frequency 0.2x2 keeps", SamplingParams{FrequencyPenalty: 0.2}, nil, []int32{0, 0}, []float32{2, 1.5, 0}, 0},
		{"presence once", SamplingParams{PresencePenalty: 0.6}, nil, []int32{0, 0, 0}, []float32{2, 1.5, 0}, 1},
		{"presence counts once", SamplingParams{PresencePenalty: 0.4}, nil, []int32{0, 0, 0}, []float32{2, 1.5, 0}, 0},
		{"negative presence encourages", SamplingParams{PresencePenalty: -1}, nil, []int32{2}, []float32{2, 1.5, 1.2}, 2},
		{"repetition divides positive", SamplingParams{RepetitionPenalty: 2}, []int32{0}, nil, []float32{2, 1.5, 0}, 1},
		{"repetition multiplies negative", SamplingParams{RepetitionPenalty: 2}, []int32{1}, nil, []float32{-1, -0.6, -1.5}, 0},
		{"repetition 1 is off", SamplingParams{RepetitionPenalty: 1}, []int32{0}, nil, []float32{2, 1.5, 0}, 0},
		{"prompt not counted by frequency", SamplingParams{FrequencyPenalty: 2}, []int32{0}, nil, []float32{2, 1.5, 0}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := NewSampler(c.sp, c.prompt)
			for _, g := range c.gen {
				s.Accept(g)
			}
			if got := s.Sample(c.logits).ID; got != c.want {
				t.Fatalf("got %d, want %d", got, c.want)
			}
		})
	}
}

func TestLogitBias(t *testing.T) {
	logits := []float32{3, 2, 1, 0}
	s := NewSampler(SamplingParams{LogitBias: map[int32]float32{3: 100}}, nil)
	if got := s.Sample(logits).ID; got != 3 {
		t.Fatalf("+100 bias: got %d", got)
	}
	s = NewSampler(SamplingParams{LogitBias: map[int32]float32{0: -100}}, nil)
	if got := s.Sample(logits).ID; got != 1 {
		t.Fatalf("-100 bias: got %d", got)
	}
	// Sampling never picks a banned token, and logprobs stay on the raw logits.
	s = NewSampler(SamplingParams{Temperature: 1, Seed: seed(1), Logprobs: true,
		LogitBias: map[int32]float32{0: float32(math.Inf(-1)), 1: -100}}, nil)
	for range 2000 {
		r := s.Sample(logits)
		if r.ID == 0 || r.ID == 1 {
			t.Fatalf("banned token %d sampled", r.ID)
		}
		if want := logprobLSE(logits, r.ID, logsumexp(logits)); r.Logprob != want {
			t.Fatalf("logprob %v, want raw %v", r.Logprob, want)
		}
	}
}

func TestNoNaNOnInfLogits(t *testing.T) {
	rows := [][]float32{
		{negInf, negInf, negInf, negInf},
		{negInf, 0, negInf, negInf},
		{float32(math.NaN()), negInf, 1, float32(math.Inf(1))},
		{-1e38, -3e38, -2e38, -1e38},
	}
	params := []SamplingParams{
		{}, {Temperature: 1}, {Temperature: 0.01, TopP: 0.5}, {Temperature: 2, TopK: 2, MinP: 0.3},
		{Temperature: 1, FrequencyPenalty: 2, PresencePenalty: 1, RepetitionPenalty: 1.5},
	}
	for ri, row := range rows {
		for pi, p := range params {
			p.Seed = seed(5)
			p.Logprobs, p.TopLogprobs = true, 3
			s := NewSampler(p, []int32{0, 1})
			s.Accept(2)
			for range 20 {
				r := s.Sample(row)
				if r.ID < 0 || int(r.ID) >= len(row) {
					t.Fatalf("row %d params %d: id %d", ri, pi, r.ID)
				}
				if r.Logprob != r.Logprob || r.Logprob > 0 {
					t.Fatalf("row %d params %d: logprob %v", ri, pi, r.Logprob)
				}
				for _, c := range r.Top {
					if c.Logprob != c.Logprob || c.Logprob > 0 {
						t.Fatalf("row %d params %d: top logprob %v", ri, pi, c.Logprob)
					}
				}
			}
		}
	}
	// A finite row among -inf must only ever sample finite tokens.
	s := NewSampler(SamplingParams{Temperature: 1, Seed: seed(9)}, nil)
	for range 100 {
		if id := s.Sample(rows[1]).ID; id != 1 {
			t.Fatalf("sampled -inf token %d", id)
		}
	}
}

func TestTopLogprobs(t *testing.T) {
	logits := []float32{0, 2, 1, 2, -1}
	topN := func(n int) []TokenLogprob { return topLogprobsLSE(logits, n, logsumexp(logits)) }
	top := topN(3)
	if len(top) != 3 || top[0].ID != 1 || top[1].ID != 3 || top[2].ID != 2 {
		t.Fatalf("order %+v", top)
	}
	p := softmax64(logits, 1)
	for _, c := range top {
		if math.Abs(float64(c.Logprob)-math.Log(p[c.ID])) > 1e-6 {
			t.Fatalf("token %d logprob %v, want %v", c.ID, c.Logprob, math.Log(p[c.ID]))
		}
	}
	if got := topN(10); len(got) != len(logits) {
		t.Fatalf("n>vocab gave %d", len(got))
	}
	var sum float64
	for _, c := range topN(5) {
		sum += math.Exp(float64(c.Logprob))
	}
	if math.Abs(sum-1) > 1e-6 {
		t.Fatalf("probabilities sum to %v", sum)
	}
}

func TestValidate(t *testing.T) {
	bad := []SamplingParams{
		{Temperature: -0.1}, {TopP: 1.5}, {TopP: -1}, {MinP: 2}, {RepetitionPenalty: -1},
		{TopLogprobs: 21}, {TopLogprobs: -1}, {Temperature: math.NaN()},
		{LogitBias: map[int32]float32{100: 1}}, {LogitBias: map[int32]float32{-1: 1}},
	}
	for i, p := range bad {
		if p.Validate(100) == nil {
			t.Errorf("case %d (%+v) accepted", i, p)
		}
	}
	good := []SamplingParams{{}, {Temperature: 2, TopP: 1, TopK: 5, MinP: 0.1, TopLogprobs: 20, LogitBias: map[int32]float32{99: 5}}}
	for i, p := range good {
		if err := p.Validate(100); err != nil {
			t.Errorf("good case %d: %v", i, err)
		}
	}
}
