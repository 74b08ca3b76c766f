package kcheck

import "math"

// ErrStats accumulates the error of a result against its reference, pair by
// pair (the caller decides what to do with non-finite values): the relative
// L2 error, the cosine similarity and the largest absolute difference. One
// type for the kernel cases, the backend-op comparisons and the end-to-end
// logits checks.
type ErrStats struct {
	num2, den2, got2, dot float64
	MaxAbs                float64
	N                     int
}

// Add counts one (reference, result) pair.
func (s *ErrStats) Add(want, got float64) {
	d := got - want
	s.num2 += d * d
	s.den2 += want * want
	s.got2 += got * got
	s.dot += got * want
	s.MaxAbs = max(s.MaxAbs, math.Abs(d))
	s.N++
}

// Rel is ‖got − want‖ / ‖want‖ (‖want‖ floored at 1e-15).
func (s *ErrStats) Rel() float64 { return math.Sqrt(s.num2 / max(s.den2, 1e-30)) }

// Cos is the cosine between got and want; 1 when both are zero.
func (s *ErrStats) Cos() float64 {
	if s.den2 == 0 && s.got2 == 0 {
		return 1
	}
	return s.dot / max(math.Sqrt(s.den2*s.got2), 1e-300)
}

// RelF32 is the relative L2 error of got against want.
func RelF32(want, got []float32) float64 {
	var s ErrStats
	for i := range want {
		s.Add(float64(want[i]), float64(got[i]))
	}
	return s.Rel()
}
