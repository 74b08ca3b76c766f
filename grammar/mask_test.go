package grammar

import (
	"math/rand/v2"
	"os"
	"slices"
	"testing"
)

// bruteMask is the reference mask: every token walked through the automaton from s.
func bruteMask(t *testing.T, a *automaton, tt *TokenTable, s int32) []uint32 {
	t.Helper()
	m := make([]uint32, tt.MaskWords())
	for id, b := range tt.vocab {
		if tt.isEOS[id] {
			if a.accepting[s] {
				m[id>>5] |= 1 << (id & 31)
			}
			continue
		}
		if len(b) == 0 {
			continue
		}
		ns := s
		for _, c := range b {
			var err error
			if ns, err = a.next(ns, c); err != nil {
				t.Fatal(err)
			}
			if ns == 0 {
				break
			}
		}
		if ns != 0 {
			m[id>>5] |= 1 << (id & 31)
		}
	}
	return m
}

// TestMaskMatchesBruteForce checks the local-mask decomposition against walking every token,
// on every state a random generation visits, for a range of schemas and free JSON.
func TestMaskMatchesBruteForce(t *testing.T) {
	v := syntheticVocab(t, 800, 5)
	var grammars []*Grammar
	for _, name := range []string{"twenty_fields", "recursive_tree", "expression", "pattern_escapes", "enum_unicode", "format_email", "multi_type"} {
		b, err := os.ReadFile("testdata/schemas/" + name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		g, err := CompileJSONSchema(b)
		if err != nil {
			t.Fatal(err)
		}
		grammars = append(grammars, g)
	}
	g, err := CompileJSON(false)
	if err != nil {
		t.Fatal(err)
	}
	grammars = append(grammars, g)
	for gi, g := range grammars {
		for seed := range 4 {
			m, err := NewMatcher(g, v.table)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(gi)))
			mask := make([]uint32, v.table.MaskWords())
			for step := 0; step < 60 && !m.IsTerminated(); step++ {
				if err := m.FillMask(mask); err != nil {
					t.Fatal(err)
				}
				g.auto.mu.Lock()
				want := bruteMask(t, g.auto, v.table, m.cur().state)
				g.auto.mu.Unlock()
				if !slices.Equal(mask, want) {
					t.Fatalf("grammar %d seed %d step %d: mask differs from brute force", gi, seed, step)
				}
				var ids []int32
				for id := range int32(len(v.tokens)) {
					if mask[id>>5]>>(id&31)&1 != 0 {
						ids = append(ids, id)
					}
				}
				if err := m.Accept(ids[rng.IntN(len(ids))]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}
