package main

import "testing"

func TestPercentile(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3}
	for _, c := range []struct{ p, want float64 }{{50, 3}, {90, 5}, {99, 5}, {1, 1}} {
		if got := pct(v, c.p); got != c.want {
			t.Errorf("pct(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if pct(nil, 50) != 0 {
		t.Error("empty percentile")
	}
}
