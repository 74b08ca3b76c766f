package kvcache

import (
	"errors"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

func testLayout(t *testing.T) Layout {
	c := &checkpoint.Config{Layers: 3, MTPLayers: 1, CompressRatios: []int{0, 4, 128, 0}, Window: 16, HeadDim: 128, IndexHeadDim: 64}
	l, err := LayoutFromConfig(c, 256, StoreF32)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLayoutBytes(t *testing.T) {
	l := testLayout(t)
	// block: CSA 64 entries×(128+64) + HCA 2 entries×128, 4 bytes each
	if want := int64((64*(128+64) + 2*128) * 4); l.BlockBytes != want {
		t.Errorf("block bytes %d, want %d", l.BlockBytes, want)
	}
	// state: 4 windows 16×128×4 + CSA main (2·8·256·4) + CSA index (2·8·128·4) + HCA (2·128·128·4)
	want := int64(4*16*128*4 + 2*8*256*4 + 2*8*128*4 + 2*128*128*4)
	if l.StateBytes != want {
		t.Errorf("state bytes %d, want %d", l.StateBytes, want)
	}
	if _, err := LayoutFromConfig(&checkpoint.Config{}, 100, StoreF32); err == nil {
		t.Error("block tokens 100 accepted")
	}
}

func TestReserveExhaustReuse(t *testing.T) {
	l := testLayout(t)
	capBytes := l.StateBytes*2 + l.BlockBytes*3
	m := NewManager(l, capBytes)
	a, b := m.NewSequence(), m.NewSequence()
	if a.ID == b.ID || a.Slot() != -1 {
		t.Fatal("fresh sequences")
	}
	if err := m.Reserve(a, 300); err != nil { // slot + 2 blocks
		t.Fatal(err)
	}
	if got, want := m.UsedBytes(), l.StateBytes+2*l.BlockBytes; got != want || m.BytesFor(300) != want {
		t.Fatalf("used %d, want %d (BytesFor %d)", got, want, m.BytesFor(300))
	}
	if !m.TakeFresh(a) || m.TakeFresh(a) {
		t.Error("TakeFresh must report a new slot exactly once")
	}
	if err := m.Reserve(a, 200); err != nil || len(a.Blocks()) != 2 {
		t.Errorf("shrinking reserve: %v, %d blocks", err, len(a.Blocks()))
	}
	// b needs slot + 2 blocks but only 1 block is left: ErrCacheFull, no side effects.
	before := m.UsedBytes()
	if err := m.Reserve(b, 257); !errors.Is(err, ErrCacheFull) {
		t.Fatalf("want ErrCacheFull, got %v", err)
	}
	if m.UsedBytes() != before || b.Slot() != -1 || len(b.Blocks()) != 0 {
		t.Fatal("failed reserve changed state")
	}
	if err := m.Reserve(b, 10); err != nil {
		t.Fatal(err)
	}
	if m.UsedBytes() != capBytes {
		t.Fatalf("used %d, want full %d", m.UsedBytes(), capBytes)
	}
	ablocks := append([]int32(nil), a.Blocks()...)
	aslot := a.Slot()
	m.Free(a)
	m.Free(a) // idempotent
	if m.UsedBytes() != l.StateBytes+l.BlockBytes {
		t.Fatalf("after free: used %d", m.UsedBytes())
	}
	if err := m.Reserve(a, 1); err == nil {
		t.Error("reserve after free accepted")
	}
	c := m.NewSequence()
	if err := m.Reserve(c, 512); err != nil {
		t.Fatal(err)
	}
	if c.Slot() != aslot {
		t.Errorf("slot %d not reused (%d)", c.Slot(), aslot)
	}
	for _, id := range c.Blocks() {
		if id != ablocks[0] && id != ablocks[1] {
			t.Errorf("block %d is not a reused one %v", id, ablocks)
		}
	}
	m.Advance(c, 5)
	if c.Len() != 5 {
		t.Errorf("len %d", c.Len())
	}
	if err := m.Reserve(nil, 1); err == nil {
		t.Error("nil sequence accepted")
	}
}
