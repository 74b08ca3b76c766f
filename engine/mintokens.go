package engine

import "math"

// holdStops makes the sampler mask the stop tokens until minTokens tokens
// have been accepted (vLLM's min_tokens). While it does, the sequence is
// sampled on the host.
func (s *Sampler) holdStops(stops []int32, minTokens int) {
	s.stops, s.minTokens = stops, minTokens
}

// holding reports whether the stop tokens are masked for the next token.
func (s *Sampler) holding() bool { return s.n < s.minTokens && len(s.stops) > 0 }

// suppressStops sets the stop tokens' logits in x to −inf while holding,
// unless no other token would remain possible (a grammar that can only
// end): then the stop stays, rather than drawing a token nothing allows.
func (s *Sampler) suppressStops(x []float32) {
	if !s.holding() {
		return
	}
	inf := float32(math.Inf(-1))
	saved := make([]float32, len(s.stops))
	for i, id := range s.stops {
		if id >= 0 && int(id) < len(x) {
			saved[i], x[id] = x[id], inf
		}
	}
	for _, v := range x {
		if v > inf {
			return
		}
	}
	for i := len(s.stops) - 1; i >= 0; i-- { // backwards: a stop listed twice saved −inf the second time
		if id := s.stops[i]; id >= 0 && int(id) < len(x) {
			x[id] = saved[i]
		}
	}
}

// rankOf is vLLM's rank of token id in a logits row: the number of tokens at
// least as likely (NaN counts as −inf).
func rankOf(row []float32, id int32) int {
	v := row[id]
	if v != v {
		v = float32(math.Inf(-1))
	}
	n := 0
	for _, x := range row {
		if x >= v || (x != x && math.IsInf(float64(v), -1)) {
			n++
		}
	}
	return n
}
