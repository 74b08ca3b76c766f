package gpu

import (
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

// The estimate grows with every bound and holds the indexer's score rows over
// the whole context (4 bytes per compressed entry per row).
func TestStepWorkspaceBounds(t *testing.T) {
	c, err := checkpoint.PresetConfig("flash")
	if err != nil {
		t.Fatal(err)
	}
	sz := sizers{linear: func(m, n, k int) int { return 0 }, moe: func(rows, n, k int) int { return 1 << 20 }}
	at := func(s StepShape) int64 {
		t.Helper()
		w, err := stepWorkspace(c, s, sz)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	base := StepShape{Rows: 512, Seqs: 64, Context: 4096}
	for _, tc := range []struct {
		name     string
		s        StepShape
		minGrowB int64 // bytes more than base at least
	}{
		{"more rows", StepShape{Rows: 1024, Seqs: 64, Context: 4096}, 1},
		{"1M context: score rows of 512 × 262144 entries", StepShape{Rows: 512, Seqs: 64, Context: 1 << 20}, 512 * ((1<<20)/4 - 4096/4) * 4},
		{"graphs", StepShape{Rows: 512, Seqs: 64, Context: 4096, Graphs: true}, 64 * 4096 / 4 * 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, b := at(tc.s), at(base); got-b < tc.minGrowB {
				t.Fatalf("%d bytes, base %d: grew %d, want >= %d", got, b, got-b, tc.minGrowB)
			}
		})
	}
	for _, s := range []StepShape{{Seqs: 1, Context: 1}, {Rows: 1, Context: 1}, {Rows: 1, Seqs: 1}} {
		if _, err := stepWorkspace(c, s, sz); err == nil || !strings.Contains(err.Error(), "positive") {
			t.Errorf("%+v: error %v", s, err)
		}
	}
}

// TestStepWorkspaceCoversSteps (GPU): a prefill step of every logits row and
// recorded decode steps take no more pool memory than StepWorkspace says.
func TestStepWorkspaceCoversSteps(t *testing.T) {
	g := openGPU(t, Options{Graphs: true})
	c := checkpoint.SmallConfig()
	m, err := model.New(genWeights(t, c, 1), g, model.Options{CacheBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	footprint := func() int64 {
		if err := g.Sync(); err != nil {
			t.Fatal(err)
		}
		st := g.Context().Pool().Stats()
		n := st.InUse + st.Cached
		if g.graphs.arena != nil {
			a := g.graphs.arena.Stats()
			n += a.InUse + a.Cached
		}
		return n
	}
	before := footprint()
	const rows, decode = 96, 6
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	toks := make([]int32, rows+decode)
	for i := range toks {
		toks[i] = int32((i*104729 + 7) % c.Vocab)
	}
	if _, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks[:rows], AllLogits: true}}}); err != nil {
		t.Fatal(err)
	}
	for i := rows; i < len(toks); i++ { // the second decode step of a layout is recorded
		if _, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks[i : i+1]}}}); err != nil {
			t.Fatal(err)
		}
	}
	used := footprint() - before
	want, err := g.StepWorkspace(c, StepShape{Rows: rows, Seqs: 1, Context: len(toks), Graphs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("steps took %d pool bytes, StepWorkspace %d", used, want)
	if used > want {
		t.Fatalf("steps took %d pool bytes, more than StepWorkspace's %d", used, want)
	}
}
