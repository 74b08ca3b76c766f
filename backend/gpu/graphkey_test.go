package gpu

import (
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
)

// batchOf lays out sequences of (rows, keep, slot, spare) as the model does.
func batchOf(name string, seqs ...[4]int) *backend.Batch {
	bt := &backend.Batch{Name: name}
	for i, s := range seqs {
		bt.Seqs = append(bt.Seqs, backend.SeqInfo{Slot: s[2], Spare: s[3], Start: 100, Row0: len(bt.Pos), Rows: s[0], Keep: s[1]})
		for r := range s[0] {
			bt.Pos = append(bt.Pos, int32(100+r))
			bt.Seq = append(bt.Seq, int32(i))
		}
	}
	return bt
}

// TestGraphKeys: steps whose sequences differ only in what the recording
// takes as inputs (kept rows per sequence, slots, last rows of an MTP pass)
// share a key; the others do not; steps that are not recorded have none.
func TestGraphKeys(t *testing.T) {
	cases := []struct {
		name string
		a, b *backend.Batch
		same bool
	}{
		{"verify: kept rows per sequence and slots", batchOf("", [4]int{3, 1, 0, 5}, [4]int{4, 2, 1, 6}), batchOf("", [4]int{4, 2, 2, 7}, [4]int{3, 1, 3, 8}), true},
		{"verify: kept rows in all", batchOf("", [4]int{3, 1, 0, 5}, [4]int{3, 1, 1, 6}), batchOf("", [4]int{4, 2, 0, 5}, [4]int{3, 1, 1, 6}), false},
		{"verify beside a decode row: slots", batchOf("", [4]int{3, 1, 0, 5}, [4]int{1, 0, 1, -1}), batchOf("", [4]int{3, 1, 2, 5}, [4]int{1, 0, 1, -1}), false},
		{"mtp: rows per sequence", batchOf("mtp", [4]int{2, 0, 0, 0}, [4]int{1, 0, 1, 0}), batchOf("mtp", [4]int{1, 0, 3, 0}, [4]int{2, 0, 1, 0}), true},
		{"mtp against a decode step", batchOf("mtp", [4]int{1, 0, 0, 0}), batchOf("", [4]int{1, 0, 0, 0}), false},
		{"dspark context: rows per sequence and slots", batchOf("dspark ctx", [4]int{2, 0, 0, 0}, [4]int{1, 0, 1, 0}), batchOf("dspark ctx", [4]int{1, 0, 3, 0}, [4]int{2, 0, 2, 0}), true},
		{"dspark context: rows in all", batchOf("dspark ctx", [4]int{2, 0, 0, 0}), batchOf("dspark ctx", [4]int{3, 0, 0, 0}), false},
		{"dspark blocks: slots", batchOf("dspark draw", [4]int{4, 0, 0, 0}, [4]int{4, 0, 1, 0}), batchOf("dspark draw", [4]int{4, 0, 5, 0}, [4]int{4, 0, 2, 0}), true},
		{"dspark blocks drawn or not", batchOf("dspark draw", [4]int{4, 0, 0, 0}), batchOf("dspark", [4]int{4, 0, 0, 0}), false},
		{"dspark context against an mtp pass", batchOf("dspark ctx", [4]int{1, 0, 0, 0}), batchOf("mtp", [4]int{1, 0, 0, 0}), false},
	}
	for _, c := range cases {
		ka, _ := graphKey(c.a)
		kb, _ := graphKey(c.b)
		if ka == "" || kb == "" || (ka == kb) != c.same {
			t.Errorf("%s: keys %q and %q, want the same: %v", c.name, ka, kb, c.same)
		}
	}
	for _, bt := range []*backend.Batch{
		batchOf("", [4]int{5, 0, 0, 0}),            // a prompt
		batchOf("mtp", [4]int{40, 0, 0, 0}),        // the MTP block over a prompt
		batchOf("mtp all", [4]int{2, 0, 0, 0}),     // every row's logits
		batchOf("dspark ctx", [4]int{40, 0, 0, 0}), // the DSpark context of a prompt
		batchOf("dspark other", [4]int{4, 0, 0, 0}),
	} {
		if k, _ := graphKey(bt); k != "" {
			t.Errorf("%+v: key %q, want none", bt.Seqs, k)
		}
	}
}

// TestStepLists: a verification's lists are its parts' rows and its
// speculative sequences' spare and state slots; an MTP pass's the last row
// of each sequence.
func TestStepLists(t *testing.T) {
	l := stepLists(batchOf("", [4]int{3, 1, 0, 5}, [4]int{1, 0, 1, -1}, [4]int{4, 2, 2, 7}))
	want := [numLists][]int32{listKeepRows: {0, 3, 4, 5}, listSpecRows: {1, 2, 6, 7}, listSpares: {5, 7}, listSlots: {0, 2}}
	for i := range want {
		if !slices.Equal(l[i], want[i]) {
			t.Errorf("verification list %d: %v, want %v", i, l[i], want[i])
		}
	}
	l = stepLists(batchOf("mtp", [4]int{2, 0, 0, 0}, [4]int{1, 0, 1, 0}, [4]int{3, 0, 2, 0}))
	if !slices.Equal(l[listLast], []int32{1, 2, 5}) || l[listKeepRows] != nil {
		t.Errorf("mtp lists %v, want last rows [1 2 5] only", l)
	}
}

// TestRecordingFixed: under a key of totals only the gathers that depend on
// the row count alone may be baked into a recording.
func TestRecordingFixed(t *testing.T) {
	c := &recording{totals: true}
	for _, tc := range []struct {
		rows []int
		want bool
	}{
		{[]int{0, 1, 2, 3}, true}, // every row
		{[]int{1, 5, 9}, true},    // one hc stream of every row
		{[]int{0}, true},
		{[]int{2}, false},
		{[]int{1, 2}, false}, // starts past its stride
		{[]int{0, 1, 3}, false},
		{nil, false}, // a slot copy
	} {
		if got := c.fixed(tc.rows); got != tc.want {
			t.Errorf("fixed(%v) = %v, want %v", tc.rows, got, tc.want)
		}
	}
	if !(&recording{}).fixed(nil) {
		t.Error("a key of every sequence's layout fixes a slot copy")
	}
}
