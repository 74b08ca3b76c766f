package kvcache

import (
	"slices"
	"testing"
)

func prefixManager(t *testing.T, capBytes func(Layout) int64) *Manager {
	t.Helper()
	l := testLayout(t)
	m := NewManager(l, capBytes(l))
	if err := m.EnablePrefixCaching(); err == nil {
		t.Fatal("prefix caching enabled without the model's seed")
	}
	m.AllowPrefixCaching("test")
	if err := m.EnablePrefixCaching(); err != nil {
		t.Fatal(err)
	}
	return m
}

func toks(n int, base int32) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = base + int32(i)
	}
	return v
}

// run admits a sequence of tokens through Match, computes its tokens in
// chunks (Advance + Commit) and returns it (not freed) with the hit.
func run(t *testing.T, m *Manager, tokens []int32, salt string, chunks ...int) (*Sequence, int) {
	t.Helper()
	s := m.NewSequence()
	hit := m.Match(s, tokens, salt)
	if err := m.Reserve(s, len(tokens)); err != nil {
		t.Fatal(err)
	}
	for _, n := range chunks {
		m.Advance(s, n)
		m.Commit(s, tokens)
	}
	return s, hit
}

func TestPrefixHitAndSnapshots(t *testing.T) {
	m := prefixManager(t, func(l Layout) int64 { return 20*l.StateBytes + 20*l.BlockBytes })
	prompt := toks(600, 1)
	a, hit := run(t, m, prompt, "", 256, 256, 88)
	if hit != 0 {
		t.Fatalf("cold cache hit %d", hit)
	}
	cp := m.TakeCopies()
	if len(cp) != 2 || cp[0].Src != a.Slot() || cp[1].Src != a.Slot() || cp[0].Dst == cp[1].Dst {
		t.Fatalf("snapshots at 256 and 512: copies %v", cp)
	}
	blocks := slices.Clone(a.Blocks())
	m.Free(a)
	if m.UsedBytes() != 0 || m.CachedBytes() != 2*m.Layout().BlockBytes+2*m.Layout().StateBytes {
		t.Fatalf("after free: used %d, cached %d", m.UsedBytes(), m.CachedBytes())
	}
	for _, tc := range []struct {
		name   string
		tokens []int32
		salt   string
		want   int
	}{
		{"same prompt", prompt, "", 512},
		{"diverges in block 2", append(slices.Clone(prompt[:300]), toks(300, 5000)...), "", 256},
		{"whole blocks only, one token left", prompt[:512], "", 256},
		{"shorter than a block", prompt[:200], "", 0},
		{"other salt", prompt, "tenant b", 0},
		{"diverges in block 1", toks(600, 2), "", 0},
	} {
		s := m.NewSequence()
		got := m.Match(s, tc.tokens, tc.salt)
		cp := m.TakeCopies()
		if got != tc.want || s.Len() != got {
			t.Errorf("%s: hit %d (len %d), want %d", tc.name, got, s.Len(), tc.want)
		}
		if got > 0 && (len(cp) != 1 || cp[0].Dst != s.Slot() || !slices.Equal(s.Blocks(), blocks[:got/256])) {
			t.Errorf("%s: copies %v, slot %d, blocks %v", tc.name, cp, s.Slot(), s.Blocks())
		}
		if got == 0 && (len(cp) != 0 || s.Slot() != -1) {
			t.Errorf("%s: a miss queued %v, slot %d", tc.name, cp, s.Slot())
		}
		m.Free(s)
	}
}

// TestPrefixEviction: unreferenced blocks and snapshots give way, oldest
// first, to sequences that need room; referenced ones never do.
func TestPrefixEviction(t *testing.T) {
	m := prefixManager(t, func(l Layout) int64 { return 3*l.StateBytes + 3*l.BlockBytes })
	l := m.Layout()
	a, _ := run(t, m, toks(300, 1), "", 256, 44) // slot, 2 blocks, a snapshot
	m.Free(a)
	if m.CachedBytes() != l.BlockBytes+l.StateBytes || m.UsedBytes() != 0 {
		t.Fatalf("cached %d used %d", m.CachedBytes(), m.UsedBytes())
	}
	// b hits a's block and adds 2 blocks, a slot and a snapshot at 512.
	b, hit := run(t, m, toks(700, 1), "", 256, 188)
	if hit != 256 || m.CachedBytes() != 2*l.StateBytes {
		t.Fatalf("hit %d, cached %d", hit, m.CachedBytes())
	}
	// c needs a slot and 4 blocks (4 blocks outweigh a slot in this layout):
	// with b's storage referenced it does not fit, whatever is evicted.
	c := m.NewSequence()
	if m.Match(c, toks(1000, 9), "") != 0 || m.Reserve(c, 1000) == nil {
		t.Fatal("c fitted into referenced storage")
	}
	m.Free(c)
	m.TakeCopies()
	m.Free(b) // b's blocks 0..1 are full and cached, block 2 is private
	d, hit := run(t, m, toks(700, 1), "", 188)
	if hit != 512 {
		t.Fatalf("after b: hit %d, want 512", hit)
	}
	m.Free(d)
	// e needs a slot and 3 blocks: the least recently used snapshot (at 256;
	// d's hit touched the one at 512) goes first, and is enough.
	e, _ := run(t, m, toks(3*256, 7), "")
	if m.UsedBytes() != l.StateBytes+3*l.BlockBytes || m.CachedBytes() != l.StateBytes+2*l.BlockBytes {
		t.Fatalf("used %d cached %d", m.UsedBytes(), m.CachedBytes())
	}
	m.Free(e)
	for _, tc := range []struct {
		tokens []int32
		want   int
	}{{toks(300, 1), 0}, {toks(700, 1), 512}} {
		f := m.NewSequence()
		if got := m.Match(f, tc.tokens, ""); got != tc.want {
			t.Errorf("%d tokens after eviction: hit %d, want %d", len(tc.tokens), got, tc.want)
		}
		m.Free(f)
	}
}

func TestPrefixOff(t *testing.T) {
	m := NewManager(testLayout(t), 1<<30)
	s := m.NewSequence()
	if m.Match(s, toks(600, 1), "") != 0 {
		t.Fatal("hit with prefix caching off")
	}
	_ = m.Reserve(s, 600)
	m.Advance(s, 512)
	m.Commit(s, toks(600, 1))
	if len(m.TakeCopies()) != 0 {
		t.Fatal("snapshot with prefix caching off")
	}
	m.Free(s)
	if m.UsedBytes() != 0 || m.CachedBytes() != 0 {
		t.Fatalf("used %d cached %d", m.UsedBytes(), m.CachedBytes())
	}
}

// TestPrefixHitEvictsItsSnapshot: when the restored sequence's slot can only
// come from evicting the snapshot it restores from, it gets that very slot
// (the queued copy is a no-op and the state is already in place).
func TestPrefixHitEvictsItsSnapshot(t *testing.T) {
	m := prefixManager(t, func(l Layout) int64 { return 2*l.StateBytes + 2*l.BlockBytes })
	a, _ := run(t, m, toks(300, 1), "", 256)
	cp := m.TakeCopies()
	if len(cp) != 1 {
		t.Fatalf("copies %v", cp)
	}
	snap := cp[0].Dst
	m.Free(a)
	c, _ := run(t, m, toks(100, 9), "") // a slot and a block stay in use
	b := m.NewSequence()
	if hit := m.Match(b, toks(300, 1), ""); hit != 256 {
		t.Fatalf("hit %d", hit)
	}
	if cp := m.TakeCopies(); len(cp) != 1 || cp[0] != (SlotCopy{Src: snap, Dst: snap}) || b.Slot() != snap {
		t.Fatalf("copies %v, slot %d, snapshot slot %d", cp, b.Slot(), snap)
	}
	if m.CachedBytes() != 0 {
		t.Errorf("cached %d after the snapshot's eviction", m.CachedBytes())
	}
	m.Free(b)
	m.Free(c)
}

// TestPrefixSlotLimit: under LimitSlots, snapshots give their slots up to
// sequences (and to newer snapshots), oldest first.
func TestPrefixSlotLimit(t *testing.T) {
	m := prefixManager(t, func(l Layout) int64 { return 10*l.StateBytes + 10*l.BlockBytes })
	m.LimitSlots(2)
	a, _ := run(t, m, toks(600, 1), "", 256, 256) // slot + snapshot at 256; no slot left for 512
	if cp := m.TakeCopies(); len(cp) != 2 {
		t.Fatalf("copies %v: the snapshot at 512 evicts the one at 256", cp)
	}
	m.Free(a)
	c, hit := run(t, m, toks(600, 1), "")
	if hit != 512 {
		t.Fatalf("hit %d, want 512", hit)
	}
	// A new sequence takes the snapshot's slot: only cached blocks remain.
	b := m.NewSequence()
	if err := m.Reserve(b, 10); err != nil {
		t.Fatal(err)
	}
	if m.CachedBytes() != 0 || b.Slot() < 0 {
		t.Fatalf("cached %d, slot %d", m.CachedBytes(), b.Slot())
	}
	m.Free(b)
	m.Free(c)
}
