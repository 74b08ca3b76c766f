package model

import (
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
)

// TestKeptStreams: streams kept on the device (KeepHidden, KeepNext) are
// the host ones (Hidden, WantHidden) bit for bit, and an MTP pass reading
// its input on the device (In; one run, several runs of one tensor, and
// runs of two tensors beside host rows) gives the host input's logits.
func TestKeptStreams(t *testing.T) {
	m := newSynth(t, checkpoint.SmallConfig(), "exact")
	defer m.Close()
	c := m.Config()
	w := c.HcDim()
	toks := [][]int32{prompt(12, c.Vocab, 7), prompt(9, c.Vocab, 8)}
	type run struct {
		logits [][]float32
		next   [][]float32
	}
	// pass prefills both sequences and runs the MTP block over each one's
	// rows 2.. (after one pass over rows 0..1), its inputs chosen by in.
	pass := func(in func(o *Output, i, r0, n int, hid []float32) (MTPItem, *Hidden)) run {
		var b Batch
		seqs := make([]*kvcache.Sequence, len(toks))
		for i, tk := range toks {
			seqs[i] = m.Cache().NewSequence()
			defer m.FreeSequence(seqs[i])
			b.Items = append(b.Items, BatchItem{Seq: seqs[i], Tokens: tk, Hidden: true, KeepHidden: true})
		}
		o, err := m.Forward(&b)
		if err != nil {
			t.Fatal(err)
		}
		defer m.FreeHidden(o.Kept)
		for i := range toks {
			got, err := m.DownloadHidden(HiddenRef{H: o.Kept, Row0: o.KeptRow[i], Rows: len(toks[i])})
			if err != nil {
				t.Fatal(err)
			}
			equalBits(t, "kept streams", i, o.Hidden[i], got)
		}
		var mi []MTPItem
		for i, tk := range toks {
			pre := MTPItem{Seq: seqs[i], Hidden: o.Hidden[i][:2*w], Next: tk[1:3]}
			if _, err := m.ForwardMTP([]MTPItem{pre}); err != nil {
				t.Fatal(err)
			}
			it, other := in(o, i, 2, len(tk)-3, o.Hidden[i][2*w:(len(tk)-1)*w])
			if other != nil {
				defer m.FreeHidden(other)
			}
			it.Seq, it.Start, it.Next, it.AllLogits, it.WantHidden, it.KeepNext = seqs[i], 2, tk[3:], true, true, true
			mi = append(mi, it)
		}
		r, err := m.ForwardMTP(mi)
		if err != nil {
			t.Fatal(err)
		}
		defer m.FreeHidden(r.Kept)
		var out run
		for i := range mi {
			kept, err := m.DownloadHidden(HiddenRef{H: r.Kept, Row0: r.KeptRow[i], Rows: 1})
			if err != nil {
				t.Fatal(err)
			}
			equalBits(t, "kept MTP streams", i, r.Hidden[i], kept)
			out.logits = append(out.logits, r.Logits[i])
			out.next = append(out.next, kept)
		}
		return out
	}
	host := func(o *Output, i, r0, n int, hid []float32) (MTPItem, *Hidden) {
		return MTPItem{Hidden: hid}, nil
	}
	cases := []struct {
		name string
		in   func(o *Output, i, r0, n int, hid []float32) (MTPItem, *Hidden)
	}{
		{"device", func(o *Output, i, r0, n int, _ []float32) (MTPItem, *Hidden) {
			return MTPItem{In: HiddenRef{H: o.Kept, Row0: o.KeptRow[i] + r0, Rows: n}}, nil
		}},
		{"device and host", func(o *Output, i, r0, n int, hid []float32) (MTPItem, *Hidden) {
			if i == 0 {
				return MTPItem{Hidden: hid}, nil
			}
			return MTPItem{In: HiddenRef{H: o.Kept, Row0: o.KeptRow[i] + r0, Rows: n}}, nil
		}},
		{"two tensors", func(o *Output, i, r0, n int, hid []float32) (MTPItem, *Hidden) {
			if i == 0 {
				return MTPItem{In: HiddenRef{H: o.Kept, Row0: o.KeptRow[i] + r0, Rows: n}}, nil
			}
			h := &Hidden{t: m.be.Empty(n, w, backend.F32)}
			if err := m.be.Upload(h.t, hid); err != nil {
				t.Fatal(err)
			}
			return MTPItem{In: HiddenRef{H: h, Rows: n}}, h
		}},
	}
	want := pass(host)
	for _, tc := range cases {
		got := pass(tc.in)
		for i := range want.logits {
			equalBits(t, tc.name+" logits", i, want.logits[i], got.logits[i])
			equalBits(t, tc.name+" next streams", i, want.next[i], got.next[i])
		}
	}
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[0][:2], KeepHidden: true}}})
	if err != nil {
		t.Fatal(err)
	}
	m.FreeHidden(o.Kept)
	for _, in := range []HiddenRef{{H: o.Kept, Rows: 1}, {H: &Hidden{t: m.be.Empty(1, w, backend.F32)}, Row0: 1, Rows: 1}} {
		if _, err := m.ForwardMTP([]MTPItem{{Seq: s, In: in, Next: toks[0][1:2]}}); err == nil {
			t.Errorf("an MTP pass over rows %d..%d of a freed or short tensor: no error", in.Row0, in.Row0+in.Rows)
		}
	}
}

func equalBits(t *testing.T, what string, i int, want, got []float32) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%s %d: %d values, want %d", what, i, len(got), len(want))
	}
	for v := range want {
		if math.Float32bits(want[v]) != math.Float32bits(got[v]) {
			t.Fatalf("%s %d: value %d = %v, want %v", what, i, v, got[v], want[v])
		}
	}
}
