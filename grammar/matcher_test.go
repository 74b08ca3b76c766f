package grammar

import (
	"errors"
	"slices"
	"testing"
)

// tinyVocab: single letters and a few multi-byte tokens, EOS last, one special token.
func tinyVocab(t *testing.T) (*TokenTable, map[string]int32) {
	words := []string{"a", "b", "c", "{", "}", `"`, ":", ",", "ab", "abc", `{"`, `":`, "1", "2", "12", "", "<eos>"}
	toks := make([][]byte, len(words))
	ids := map[string]int32{}
	for i, w := range words {
		if w != "<eos>" {
			toks[i] = []byte(w)
		}
		ids[w] = int32(i)
	}
	ids["<special>"] = ids[""]
	tt, err := NewTokenTable(toks, []int32{ids["<eos>"]})
	if err != nil {
		t.Fatal(err)
	}
	return tt, ids
}

func allowed(tt *TokenTable, m *Matcher, t *testing.T) []int32 {
	t.Helper()
	mask := make([]uint32, tt.MaskWords())
	if err := m.FillMask(mask); err != nil {
		t.Fatal(err)
	}
	var out []int32
	for id := range int32(tt.Size()) {
		if mask[id>>5]>>(id&31)&1 != 0 {
			out = append(out, id)
		}
	}
	return out
}

func TestMatcher(t *testing.T) {
	tt, id := tinyVocab(t)
	g, err := CompileGBNF(`root ::= "ab" "c"? "12"`)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMatcher(g, tt)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := allowed(tt, m, t), []int32{id["a"], id["ab"], id["abc"]}; !slices.Equal(got, want) {
		t.Fatalf("start mask %v, want %v", got, want)
	}
	fb, err := m.ForcedBytes()
	if err != nil || string(fb) != "ab" {
		t.Fatalf("ForcedBytes %q %v, want ab", fb, err)
	}
	if err := m.Accept(id["b"]); !errors.Is(err, ErrRejected) {
		t.Fatalf("Accept(b) at start: %v", err)
	}
	if err := m.Accept(id["<special>"]); !errors.Is(err, ErrRejected) {
		t.Fatalf("special token: %v", err)
	}
	if err := m.Accept(id["<eos>"]); !errors.Is(err, ErrRejected) {
		t.Fatalf("EOS before the end: %v", err)
	}
	for _, w := range []string{"ab", "c", "1"} {
		if err := m.Accept(id[w]); err != nil {
			t.Fatalf("Accept(%q): %v", w, err)
		}
	}
	if m.CanTerminate() {
		t.Fatal("can terminate after abc1")
	}
	fb, _ = m.ForcedBytes()
	if string(fb) != "2" {
		t.Fatalf("ForcedBytes %q, want 2", fb)
	}
	m.Rollback(2) // back to "ab"
	if m.Steps() != 1 {
		t.Fatalf("steps %d after rollback", m.Steps())
	}
	if got, want := allowed(tt, m, t), []int32{id["c"], id["1"], id["12"]}; !slices.Equal(got, want) {
		t.Fatalf("mask after ab %v, want %v", got, want)
	}
	if err := m.AcceptBytes([]byte("12")); err != nil {
		t.Fatal(err)
	}
	if !m.CanTerminate() || m.IsTerminated() {
		t.Fatal("complete output should allow termination")
	}
	if got := allowed(tt, m, t); !slices.Equal(got, []int32{id["<eos>"]}) {
		t.Fatalf("mask at the end %v, want only EOS", got)
	}
	if err := m.Accept(id["<eos>"]); err != nil {
		t.Fatal(err)
	}
	if !m.IsTerminated() {
		t.Fatal("not terminated after EOS")
	}
	if got := allowed(tt, m, t); len(got) != 0 {
		t.Fatalf("mask after termination %v", got)
	}
	if err := m.Accept(id["a"]); !errors.Is(err, ErrRejected) {
		t.Fatalf("token after EOS: %v", err)
	}
	m.Rollback(1)
	if m.IsTerminated() || !m.CanTerminate() {
		t.Fatal("rollback of EOS")
	}
	m.Rollback(100)
	if m.Steps() != 0 {
		t.Fatal("rollback past the start")
	}
	if err := m.FillMask(make([]uint32, 0)); err == nil {
		t.Fatal("short mask accepted")
	}
}

func TestMatcherDraftRollback(t *testing.T) {
	tt, id := tinyVocab(t)
	g, err := CompileJSONSchema([]byte(`{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMatcher(g, tt)
	if err != nil {
		t.Fatal(err)
	}
	// a draft of 5 tokens whose 4th leaves the grammar: the first 3 are accepted
	draft := []string{`{"`, "a", `":`, "a", "1"}
	n := 0
	for _, w := range draft {
		if m.Accept(id[w]) != nil {
			break
		}
		n++
	}
	if n != 3 {
		t.Fatalf("accepted %d draft tokens, want 3", n)
	}
	m.Rollback(1) // the target model kept only 2
	if err := m.Accept(id[`":`]); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"12", "}", "<eos>"} {
		if err := m.Accept(id[w]); err != nil {
			t.Fatalf("Accept(%q): %v", w, err)
		}
	}
	if !m.IsTerminated() {
		t.Fatal("not terminated")
	}
}

func TestTokenTableErrors(t *testing.T) {
	if _, err := NewTokenTable([][]byte{[]byte("a")}, []int32{3}); err == nil {
		t.Fatal("eos outside the vocabulary accepted")
	}
}

func TestMatcherWorkLimit(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxWork = 50
	g, err := CompileGBNFLimits(`root ::= ([a-z] | [a-c] [a-z]?)* "x"`, lim)
	if err != nil {
		t.Fatal(err)
	}
	v := syntheticVocab(t, 100, 1)
	m, err := NewMatcher(g, v.table)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.FillMask(make([]uint32, v.table.MaskWords())); !errors.Is(err, ErrLimit) {
		t.Fatalf("FillMask past MaxWork: %v, want ErrLimit", err)
	}
}
