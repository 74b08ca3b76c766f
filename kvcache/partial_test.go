package kvcache

import (
	"slices"
	"testing"
)

// finish computes the rest of s's tokens, then keeps its end and frees it,
// as the engine does when a request ends.
func finish(m *Manager, s *Sequence, tokens []int32) {
	m.Advance(s, len(tokens)-s.Len())
	m.Commit(s, tokens)
	m.Keep(s, tokens)
	m.Free(s)
}

// TestPartialBlockHit: a finished sequence's partial last block and slot
// stay as evictable cache (no extra memory) and a prompt extending its
// tokens hits up to their exact end, with copies of both (copy-on-write).
func TestPartialBlockHit(t *testing.T) {
	m := prefixManager(t, func(l Layout) int64 { return 10*l.StateBytes + 10*l.BlockBytes })
	l := m.Layout()
	turn1 := toks(1100, 1) // 4 full blocks and 76 tokens
	a, _ := run(t, m, turn1, "")
	fullBlocks := slices.Clone(a.Blocks()[:4])
	last, slot := a.Blocks()[4], a.Slot()
	finish(m, a, turn1)
	m.TakeCopies()
	// 4 blocks cached (no snapshot: the prefill ran in one chunk), the
	// partial block and the slot: what a held, nothing more.
	if m.UsedBytes() != 0 || m.CachedBytes() != 5*l.BlockBytes+l.StateBytes {
		t.Fatalf("after the first turn: used %d, cached %d", m.UsedBytes(), m.CachedBytes())
	}
	turn2 := append(slices.Clone(turn1), toks(60, 9000)...)
	cases := []struct {
		name   string
		tokens []int32
		salt   string
		want   int
	}{
		{"next turn extends it", turn2, "", 1100},
		{"same prompt: one token left to compute", turn1, "", 0},
		{"diverges inside the partial block", append(slices.Clone(turn1[:1050]), toks(100, 7000)...), "", 0},
		{"other salt", turn2, "b", 0},
	}
	var held []*Sequence
	for _, c := range cases {
		s := m.NewSequence()
		got := m.Match(s, c.tokens, c.salt)
		cp := m.TakeCopies()
		if got != c.want || s.Len() != got {
			t.Errorf("%s: hit %d (len %d), want %d", c.name, got, s.Len(), c.want)
		}
		if got == 0 {
			m.Free(s)
			continue
		}
		want := []SlotCopy{{Src: slot, Dst: s.Slot()}, {Src: int(last), Dst: int(s.Blocks()[4]), Block: true}}
		if !slices.Equal(cp, want) || !slices.Equal(s.Blocks()[:4], fullBlocks) || s.Blocks()[4] == last {
			t.Errorf("%s: copies %v, want %v; blocks %v", c.name, cp, want, s.Blocks())
		}
		held = append(held, s)
	}
	// A concurrent hit gets copies of its own: the cached block stays intact.
	s := m.NewSequence()
	if got := m.Match(s, turn2, ""); got != 1100 || s.Blocks()[4] == held[0].Blocks()[4] || s.Slot() == held[0].Slot() {
		t.Fatalf("second hit %d: blocks %v vs %v", got, s.Blocks(), held[0].Blocks())
	}
	m.TakeCopies()
	if err := m.Reserve(s, len(turn2)); err != nil || len(s.Blocks()) != 5 {
		t.Fatalf("reserve after the hit: %v, blocks %v", err, s.Blocks())
	}
	finish(m, s, turn2)
	for _, h := range held {
		m.Free(h)
	}
	// turn2's end is kept too, and is the longer hit now.
	b := m.NewSequence()
	if got := m.Match(b, append(slices.Clone(turn2), 5), ""); got != len(turn2) {
		t.Errorf("third turn: hit %d, want %d", got, len(turn2))
	}
	m.Free(b)
	m.TakeCopies()
	if m.UsedBytes() != 0 {
		t.Errorf("used %d after all freed", m.UsedBytes())
	}
}

// TestPartialBlockEviction: a kept partial block gives way to a sequence
// that needs room, slot and block at once; a hit that can only fit by
// evicting the partial it copies gets its very block and slot back (the
// queued copies are no-ops).
func TestPartialBlockEviction(t *testing.T) {
	m := prefixManager(t, func(l Layout) int64 { return 2*l.StateBytes + 2*l.BlockBytes })
	l := m.Layout()
	p := toks(100, 1)
	a, _ := run(t, m, p, "")
	blk, slot := a.Blocks()[0], a.Slot()
	finish(m, a, p)
	if m.CachedBytes() != l.BlockBytes+l.StateBytes {
		t.Fatalf("cached %d", m.CachedBytes())
	}
	c, _ := run(t, m, toks(100, 5000), "") // takes the free slot and block
	b := m.NewSequence()
	if got := m.Match(b, append(slices.Clone(p), 7, 8), ""); got != 100 {
		t.Fatalf("hit %d, want 100", got)
	}
	want := []SlotCopy{{Src: slot, Dst: slot}, {Src: int(blk), Dst: int(blk), Block: true}}
	if cp := m.TakeCopies(); !slices.Equal(cp, want) || b.Slot() != slot || !slices.Equal(b.Blocks(), []int32{blk}) {
		t.Fatalf("copies %v, want %v; slot %d blocks %v", cp, want, b.Slot(), b.Blocks())
	}
	if m.CachedBytes() != 0 {
		t.Errorf("cached %d after the partial's eviction", m.CachedBytes())
	}
	m.Free(b)
	m.Free(c)
	// Under a slot limit, a partial gives its slot (and block) up.
	m = prefixManager(t, func(l Layout) int64 { return 4*l.StateBytes + 4*l.BlockBytes })
	m.LimitSlots(1)
	d, _ := run(t, m, p, "")
	finish(m, d, p)
	e := m.NewSequence()
	if err := m.Reserve(e, 10); err != nil || m.CachedBytes() != 0 || m.UsedBytes() != l.StateBytes+l.BlockBytes {
		t.Fatalf("reserve under the slot limit: %v, cached %d, used %d", err, m.CachedBytes(), m.UsedBytes())
	}
	m.Free(e)
}

// TestKeepCopy: a copy of a running sequence's state mid-block (a thinking
// chat's prompt but its last token) is kept as a partial block in a new slot
// and block, so a follow-up that diverges right after it hits there; a
// block boundary, a repeat and a full cache keep nothing.
func TestKeepCopy(t *testing.T) {
	prompt := toks(400, 1)
	next := append(slices.Clone(prompt[:399]), toks(50, 9000)...)
	cases := []struct {
		name   string
		cap    func(Layout) int64
		at     int // KeepCopy after computing this many tokens
		twice  bool
		cached func(Layout) int64 // after the sequence ends
		hit    int                // of next
	}{
		{"mid-block", func(l Layout) int64 { return 10*l.StateBytes + 10*l.BlockBytes }, 399, false,
			func(l Layout) int64 { return 2*l.BlockBytes + 2*l.StateBytes }, 399}, // block 0 + its snapshot, the copy
		{"twice: one copy", func(l Layout) int64 { return 10*l.StateBytes + 10*l.BlockBytes }, 399, true,
			func(l Layout) int64 { return 2*l.BlockBytes + 2*l.StateBytes }, 399},
		{"block boundary: Commit's snapshot", func(l Layout) int64 { return 10*l.StateBytes + 10*l.BlockBytes }, 256, false,
			func(l Layout) int64 { return l.BlockBytes + l.StateBytes }, 256},
		{"no room", func(l Layout) int64 { return l.StateBytes + 2*l.BlockBytes }, 399, false,
			func(l Layout) int64 { return l.BlockBytes }, 0}, // the snapshot at 256 had no slot either
	}
	for _, c := range cases {
		m := prefixManager(t, c.cap)
		l := m.Layout()
		s, _ := run(t, m, prompt, "", 256, c.at-256)
		m.TakeCopies()
		used := m.UsedBytes()
		m.KeepCopy(s, prompt[:c.at])
		if c.twice {
			m.KeepCopy(s, prompt[:c.at])
		}
		cp := m.TakeCopies()
		if m.UsedBytes() != used {
			t.Errorf("%s: the sequence's bytes went from %d to %d", c.name, used, m.UsedBytes())
		}
		if kept := c.at%256 != 0 && c.hit > 0; kept != (len(cp) == 2) ||
			kept && (cp[0] != SlotCopy{Src: s.Slot(), Dst: cp[0].Dst} || cp[1] != SlotCopy{Src: int(s.Blocks()[1]), Dst: cp[1].Dst, Block: true} ||
				cp[0].Dst == s.Slot() || slices.Contains(s.Blocks(), int32(cp[1].Dst))) {
			t.Errorf("%s: copies %v (slot %d, blocks %v)", c.name, cp, s.Slot(), s.Blocks())
		}
		m.Advance(s, len(prompt)-c.at)
		m.Commit(s, prompt)
		m.Free(s) // no Keep: the end is no follow-up's prefix
		m.TakeCopies()
		if got, want := m.CachedBytes(), c.cached(l); got != want || m.UsedBytes() != 0 {
			t.Errorf("%s: cached %d, want %d; used %d", c.name, got, want, m.UsedBytes())
		}
		b := m.NewSequence()
		if got := m.Match(b, next, ""); got != c.hit {
			t.Errorf("%s: follow-up hit %d, want %d", c.name, got, c.hit)
		}
		m.Free(b)
	}
}
