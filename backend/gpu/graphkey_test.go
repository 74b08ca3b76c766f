package gpu

import (
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
)

// batchOf lays out sequences of (rows, slot) as the model does.
func batchOf(name string, seqs ...[2]int) *backend.Batch {
	bt := &backend.Batch{Name: name}
	for i, s := range seqs {
		bt.Seqs = append(bt.Seqs, backend.SeqInfo{Slot: s[1], Start: 100, Row0: len(bt.Pos), Rows: s[0]})
		for r := range s[0] {
			bt.Pos = append(bt.Pos, int32(100+r))
			bt.Seq = append(bt.Seq, int32(i))
		}
	}
	return bt
}

// hiddenOf marks bt as a step that also returns its final streams.
func hiddenOf(bt *backend.Batch) *backend.Batch {
	bt.Hidden = true
	return bt
}

// TestGraphKeys: steps whose sequences differ only in what the recording
// takes as inputs (slots, last rows of an MTP pass) share a key; the others
// do not; steps that are not recorded have none.
func TestGraphKeys(t *testing.T) {
	cases := []struct {
		name string
		a, b *backend.Batch
		same bool
	}{
		{"verify: slots", batchOf("verify", [2]int{3, 0}, [2]int{3, 1}), batchOf("verify", [2]int{3, 2}, [2]int{3, 3}), true},
		{"verify: rows per sequence", batchOf("verify", [2]int{3, 0}, [2]int{4, 1}), batchOf("verify", [2]int{4, 0}, [2]int{3, 1}), false},
		{"verify beside a decode row: slots", batchOf("verify", [2]int{3, 0}, [2]int{1, 1}), batchOf("verify", [2]int{3, 2}, [2]int{1, 3}), true},
		{"mtp: rows per sequence", batchOf("mtp", [2]int{2, 0}, [2]int{1, 1}), batchOf("mtp", [2]int{1, 3}, [2]int{2, 1}), true},
		{"mtp against a decode step", batchOf("mtp", [2]int{1, 0}), batchOf("", [2]int{1, 0}), false},
		{"dspark context: rows per sequence and slots", batchOf("dspark ctx", [2]int{2, 0}, [2]int{1, 1}), batchOf("dspark ctx", [2]int{1, 3}, [2]int{2, 2}), true},
		{"dspark context: rows in all", batchOf("dspark ctx", [2]int{2, 0}), batchOf("dspark ctx", [2]int{3, 0}), false},
		{"dspark blocks: slots", batchOf("dspark draw", [2]int{4, 0}, [2]int{4, 1}), batchOf("dspark draw", [2]int{4, 5}, [2]int{4, 2}), true},
		{"dspark blocks drawn or not", batchOf("dspark draw", [2]int{4, 0}), batchOf("dspark", [2]int{4, 0}), false},
		{"dspark context against an mtp pass", batchOf("dspark ctx", [2]int{1, 0}), batchOf("mtp", [2]int{1, 0}), false},
		{"decode with and without its final streams", hiddenOf(batchOf("", [2]int{1, 0})), batchOf("", [2]int{1, 0}), false},
		{"decode with its final streams: slots", hiddenOf(batchOf("", [2]int{1, 0})), hiddenOf(batchOf("", [2]int{1, 2})), true},
	}
	for _, c := range cases {
		ka, _ := graphKey(c.a)
		kb, _ := graphKey(c.b)
		if ka == "" || kb == "" || (ka == kb) != c.same {
			t.Errorf("%s: keys %q and %q, want the same: %v", c.name, ka, kb, c.same)
		}
	}
	for _, bt := range []*backend.Batch{
		batchOf("", [2]int{5, 0}),            // a prompt
		batchOf("verify", [2]int{40, 0}),     // more rows than a verification has
		batchOf("mtp", [2]int{40, 0}),        // the MTP block over a prompt
		batchOf("mtp all", [2]int{2, 0}),     // every row's logits
		batchOf("dspark ctx", [2]int{40, 0}), // the DSpark context of a prompt
		batchOf("dspark other", [2]int{4, 0}),
	} {
		if k, _ := graphKey(bt); k != "" {
			t.Errorf("%+v: key %q, want none", bt.Seqs, k)
		}
	}
}

// TestStepLists: an MTP pass's list is the last row of each sequence; a
// verification has none.
func TestStepLists(t *testing.T) {
	if l := stepLists(batchOf("verify", [2]int{3, 0}, [2]int{1, 1})); l[listLast] != nil {
		t.Errorf("verification lists %v, want none", l)
	}
	l := stepLists(batchOf("mtp", [2]int{2, 0}, [2]int{1, 1}, [2]int{3, 2}))
	if !slices.Equal(l[listLast], []int32{1, 2, 5}) {
		t.Errorf("mtp lists %v, want last rows [1 2 5]", l)
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
