package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

// TestDSparkDrafter: the captured features of a prefill equal those of
// one-token steps bit for bit; a block's logits do not depend on how the
// context entered the windows (at once or in chunks with blocks drafted in
// between, past window wraps), and drafting a block twice gives the same
// logits (a block leaves no state); the Markov head's bias is finite and
// depends on the previous token.
func TestDSparkDrafter(t *testing.T) {
	const n = 45
	m := newSynth(t, checkpoint.SmallDSparkConfig(), "exact")
	c := m.Config()
	w := m.DSparkDim()
	if !m.HasDSpark() || m.DSparkRows() != c.DSparkBlockSize || w != c.Dim*len(c.DSparkTargetLayers) {
		t.Fatalf("HasDSpark %v rows %d dim %d", m.HasDSpark(), m.DSparkRows(), w)
	}
	toks := prompt(n+1, c.Vocab, 4)
	a := m.Cache().NewSequence()
	defer m.FreeSequence(a)
	o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: a, Tokens: toks[:n], Hidden: true}}})
	if err != nil {
		t.Fatal(err)
	}
	hid := o.Hidden[0]
	if len(hid) != n*w || o.HiddenDim != w {
		t.Fatalf("%d captured values (dim %d), want %d×%d", len(hid), o.HiddenDim, n, w)
	}
	b := m.Cache().NewSequence()
	defer m.FreeSequence(b)
	for p := range n {
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: b, Tokens: toks[p : p+1], Hidden: true}}})
		if err != nil {
			t.Fatal(err)
		}
		equalRows(t, "captured row", p, hid[p*w:(p+1)*w], o.Hidden[0])
	}
	draft := func(it DSparkItem) []float32 {
		t.Helper()
		o, err := m.ForwardDSpark([]DSparkItem{it})
		if err != nil {
			t.Fatal(err)
		}
		if it.Draft && len(o.Logits[0]) != m.DSparkRows()*c.Vocab {
			t.Fatalf("%d block logits, want %d rows", len(o.Logits[0]), m.DSparkRows())
		}
		return o.Logits[0]
	}
	want := draft(DSparkItem{Seq: a, Context: hid, Anchor: toks[n], Draft: true})
	for i, v := range want {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("block logit %d = %v", i, v)
		}
	}
	equalRows(t, "block drafted again", n, want, draft(DSparkItem{Seq: a, Start: n, Anchor: toks[n], Draft: true}))
	rng := rand.New(rand.NewPCG(2, 3))
	for p := 0; p < n; {
		k := min(1+rng.IntN(6), n-p)
		draft(DSparkItem{Seq: b, Start: p, Context: hid[p*w : (p+k)*w], Anchor: toks[p+k], Draft: rng.IntN(2) == 0})
		p += k
	}
	equalRows(t, "block after chunked context", n, want, draft(DSparkItem{Seq: b, Start: n, Anchor: toks[n], Draft: true}))

	bias, err := m.MarkovBias([]int32{toks[0], toks[1]})
	if err != nil {
		t.Fatal(err)
	}
	differ := false
	for i := range c.Vocab {
		if math.IsNaN(float64(bias[0][i])) || math.IsInf(float64(bias[0][i]), 0) {
			t.Fatalf("markov bias %d = %v", i, bias[0][i])
		}
		differ = differ || bias[0][i] != bias[1][i]
	}
	if !differ && toks[0] != toks[1] {
		t.Error("the Markov bias does not depend on the previous token")
	}
}

// TestDSparkRowsOption: Options.DSparkRows sizes the block (and the rings);
// a block outside [1, dspark_block_size] is refused.
func TestDSparkRowsOption(t *testing.T) {
	c := checkpoint.SmallDSparkConfig()
	w := genWeights(t, c, 1)
	for _, tc := range []struct {
		rows, want int
		ok         bool
	}{{0, c.DSparkBlockSize, true}, {2, 2, true}, {c.DSparkBlockSize + 1, 0, false}, {-1, 0, false}} {
		m, err := New(w, nil, Options{Numerics: "exact", DSparkRows: tc.rows})
		if (err == nil) != tc.ok {
			t.Fatalf("rows %d: error %v, want ok %v", tc.rows, err, tc.ok)
		}
		if err != nil {
			continue
		}
		if m.DSparkRows() != tc.want {
			t.Errorf("rows %d: DSparkRows %d, want %d", tc.rows, m.DSparkRows(), tc.want)
		}
		s := m.Cache().NewSequence()
		toks := prompt(30, c.Vocab, 1)
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks, Hidden: true}}})
		if err == nil {
			o, err = m.ForwardDSpark([]DSparkItem{{Seq: s, Context: o.Hidden[0], Anchor: 1, Draft: true}})
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(o.Logits[0]) != tc.want*c.Vocab {
			t.Errorf("rows %d: %d logits, want %d rows", tc.rows, len(o.Logits[0]), tc.want)
		}
		m.FreeSequence(s)
	}
}

// TestDSparkSpeculativeRollback runs the main model and the drafter as a
// DSpark speculative decoder does: each step verifies the last token and k
// drafts of which the first a are right, rewinds the sequence to them
// (positional rollback) and feeds the drafter the captured features of the
// verified positions. Every verified row's logits and features equal plain
// decoding's bit for bit, and the last block's logits equal those of a
// drafter given the same context without any speculation: neither the
// rejected rows nor the blocks leave a trace. For k = 1…3 and every
// acceptance pattern with the fp32 store (exact numerics), and with the
// compact one (faithful).
func TestDSparkSpeculativeRollback(t *testing.T) {
	for _, mode := range []string{"exact", "faithful"} {
		for k := 1; k <= 3; k++ {
			for _, pt := range acceptPatterns {
				if mode == "faithful" && (k != 3 || pt.name != "random") || testing.Short() && k != 3 {
					continue
				}
				t.Run(fmt.Sprintf("%s k=%d %s", mode, k, pt.name), func(t *testing.T) {
					dsparkSpeculativeRollback(t, mode, k, pt.accept)
				})
			}
		}
	}
}

func dsparkSpeculativeRollback(t *testing.T, mode string, k int, accept func(rng *rand.Rand, s, k int) int) {
	const n, pre = 90, 20
	m, err := New(genWeights(t, checkpoint.SmallDSparkConfig(), 1), nil, Options{Numerics: mode, Drafts: k})
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config()
	w := m.DSparkDim()
	toks := prompt(n, c.Vocab, 9)
	ref := m.Cache().NewSequence()
	defer m.FreeSequence(ref)
	o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: ref, Tokens: toks, AllLogits: true, Hidden: true}}})
	if err != nil {
		t.Fatal(err)
	}
	refRows, refHid := o.Rows(0), o.Hidden[0]

	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	o, err = m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[:pre], Hidden: true}}})
	if err != nil {
		t.Fatal(err)
	}
	fed := 0 // positions the drafter has
	feed := func(hid []float32, from, to int) {
		t.Helper()
		if _, err := m.ForwardDSpark([]DSparkItem{{Seq: s, Start: from, Context: hid, Anchor: toks[to], Draft: true}}); err != nil {
			t.Fatal(err)
		}
		fed = to
	}
	feed(o.Hidden[0], 0, pre)
	rng := rand.New(rand.NewPCG(3, 4))
	kept := pre // cached tokens; the next one is known, not yet fed
	for step := 0; kept+1+k < n-1; step++ {
		a := accept(rng, step, k)
		in := append([]int32(nil), toks[kept:kept+1+k]...)
		for j := 1 + a; j < len(in); j++ {
			in[j] = (in[j] + int32(1+rng.IntN(50))) % int32(c.Vocab)
		}
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: in, AllLogits: true, Hidden: true}}})
		if err != nil {
			t.Fatal(err)
		}
		for r := range 1 + a {
			equalRows(t, "verify row", kept+r, refRows[kept+r], o.Rows(0)[r])
			equalRows(t, "verify row features", kept+r, refHid[(kept+r)*w:(kept+r+1)*w], o.Hidden[0][r*w:(r+1)*w])
		}
		kept += 1 + a
		if err := m.Rewind(s, kept); err != nil {
			t.Fatal(err)
		}
		m.Cache().Shrink(s, kept+1)
		// The drafter gets the verified positions.
		feed(refHid[fed*w:kept*w], fed, kept)
	}
	got, err := m.ForwardDSpark([]DSparkItem{{Seq: s, Start: fed, Anchor: toks[fed], Draft: true}})
	if err != nil {
		t.Fatal(err)
	}
	plain := m.Cache().NewSequence()
	defer m.FreeSequence(plain)
	if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: plain, Tokens: toks[:fed]}}}); err != nil {
		t.Fatal(err)
	}
	want, err := m.ForwardDSpark([]DSparkItem{{Seq: plain, Context: refHid[:fed*w], Anchor: toks[fed], Draft: true}})
	if err != nil {
		t.Fatal(err)
	}
	equalRows(t, "block after speculation", fed, want.Logits[0], got.Logits[0])
}
