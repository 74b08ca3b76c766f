package cpu

import (
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
)

// TestSlice: a slice reads and writes its rows of the tensor, and bad
// ranges are errors.
func TestSlice(t *testing.T) {
	b := New(Options{})
	x := b.Alloc(4, 3, backend.F32)
	if err := b.Upload(x, []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		row0, rows int
		want       []float32
		bad        bool
	}{
		{row0: 1, rows: 2, want: []float32{3, 4, 5, 6, 7, 8}},
		{row0: 3, rows: 1, want: []float32{9, 10, 11}},
		{row0: 4, rows: 0, want: []float32{}},
		{row0: 3, rows: 2, bad: true},
		{row0: -1, rows: 1, bad: true},
	} {
		v, err := b.Slice(x, c.row0, c.rows)
		if c.bad {
			if err == nil {
				t.Errorf("slice [%d,+%d) of 4 rows: no error", c.row0, c.rows)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, c.rows*3)
		if err := b.Download(v, got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("slice [%d,+%d): %v, want %v", c.row0, c.rows, got, c.want)
		}
	}
	v, _ := b.Slice(x, 2, 1)
	if err := b.Upload(v, []float32{-1, -2, -3}); err != nil {
		t.Fatal(err)
	}
	all := make([]float32, 12)
	_ = b.Download(x, all)
	if !slices.Equal(all[6:9], []float32{-1, -2, -3}) || all[5] != 5 || all[9] != 9 {
		t.Errorf("upload into a slice wrote %v", all)
	}
}
