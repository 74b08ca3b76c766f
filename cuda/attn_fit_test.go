package cuda

import "testing"

func TestAttnClusterFit(t *testing.T) {
	for _, c := range []struct {
		keys, groups, rows, want int
	}{
		{0, 8, 1, attnCluster}, // unknown: the default
		{64, 8, 1, 1},          // one block: no split
		{128, 8, 1, 2},         // a window of 128
		{129, 8, 1, 4},
		{256, 8, 1, 4},
		{640, 8, 1, 8},  // window + 512 selected
		{640, 8, 8, 4},  // 8 × 8 × 8 CTAs > 2 an SM: halved
		{640, 16, 8, 2}, // and again
		{128, 16, 8, 2}, // never below 2
	} {
		if got := attnClusterFit(AttnShape{MaxKeys: c.keys, Rows: c.rows}, c.groups, 132); got != c.want {
			t.Errorf("%d keys, %d groups, %d rows: cluster %d, want %d", c.keys, c.groups, c.rows, got, c.want)
		}
	}
}
