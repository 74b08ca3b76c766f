package gpu

import (
	"testing"

	"github.com/megamoe/megamoe/backend"
)

// TestDeviceBatchLayouts: the last batchLayouts layouts stay on the device
// (a speculative step alternates between three), an older one is uploaded
// again, and each returned layout keeps its own rows.
func TestDeviceBatchLayouts(t *testing.T) {
	g := openGPU(t, Options{})
	batch := func(start int) *backend.Batch {
		return &backend.Batch{Seqs: []backend.SeqInfo{{Slot: 0, Start: start, Rows: 2}}, Pos: []int32{int32(start), int32(start + 1)}, Seq: []int32{0, 0}}
	}
	var got []*devBatch
	for i := range batchLayouts {
		d, err := g.deviceBatch(batch(10 * i))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d)
	}
	for _, tc := range []struct {
		name  string
		start int
		want  *devBatch // nil: a new upload
	}{
		{"first again", 0, got[0]},
		{"last", 10 * (batchLayouts - 1), got[batchLayouts-1]},
		{"a new one", 1000, nil},
		{"the least recent, evicted", 10, nil},
		{"first, kept as recently used", 0, got[0]},
	} {
		d, err := g.deviceBatch(batch(tc.start))
		if err != nil {
			t.Fatal(err)
		}
		if tc.want != nil && d != tc.want || tc.want == nil && containsBatch(got, d) {
			t.Errorf("%s: layout %p, want %p", tc.name, d, tc.want)
		}
		if d.host[SeqFields] != int32(tc.start) || d.Rows != 2 {
			t.Errorf("%s: layout of positions %v, want from %d", tc.name, d.host[SeqFields:SeqFields+2], tc.start)
		}
		got = append(got, d)
	}
}

func containsBatch(ds []*devBatch, d *devBatch) bool {
	for _, x := range ds {
		if x == d {
			return true
		}
	}
	return false
}
