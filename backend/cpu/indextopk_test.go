package cpu

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestIndexTopK: the heap selection returns the first k of a stable sort by
// descending score (ties to the lower index), for k below, at and above the
// candidate count, with many ties and with none.
func TestIndexTopK(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		n, k, levels int // levels > 0: scores drawn from that many values (ties)
	}{
		{0, 4, 0}, {3, 4, 0}, {4, 4, 0}, {5, 0, 0}, {1000, 4, 0}, {1000, 4, 3},
		{8192, 512, 0}, {8192, 512, 7}, {600, 600, 5}, {100, 1, 2},
	} {
		s := make([]float32, tc.n)
		for i := range s {
			if tc.levels > 0 {
				s[i] = float32(r.IntN(tc.levels))
			} else {
				s[i] = r.Float32()*2 - 1
			}
		}
		want := make([]int32, tc.n)
		for i := range want {
			want[i] = int32(i)
		}
		slices.SortStableFunc(want, func(x, y int32) int {
			switch {
			case s[x] > s[y]:
				return -1
			case s[x] < s[y]:
				return 1
			}
			return 0
		})
		want = want[:min(tc.k, tc.n)]
		if got := indexTopK(s, tc.k, nil); !slices.Equal(got, want) {
			t.Errorf("n %d k %d levels %d: got %v, want %v", tc.n, tc.k, tc.levels, got, want)
		}
	}
}
