package kvcache

import (
	"errors"
	"testing"
)

func TestMaxTokens(t *testing.T) {
	l := Layout{BlockTokens: 256, StateBytes: 1000, BlockBytes: 500}
	for _, tc := range []struct {
		name     string
		capacity int64
		seqs     int
		want     int
	}{
		{"no sequence", 10_000, 0, 0},
		{"state only", 1000, 1, 0},
		{"below state", 999, 1, 0},
		{"one block", 1500, 1, 256},
		{"partial block", 1999, 1, 256},
		{"many blocks", 1000 + 7*500, 1, 7 * 256},
		{"two sequences", 2 * (1000 + 3*500), 2, 3 * 256},
		{"two sequences rounding down", 2*(1000+3*500) + 1, 2, 3 * 256},
		{"too many sequences", 10_000, 11, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManager(l, tc.capacity)
			got := m.MaxTokens(tc.seqs)
			if got != tc.want {
				t.Fatalf("MaxTokens(%d) = %d, want %d", tc.seqs, got, tc.want)
			}
			if tc.seqs != 1 || got == 0 {
				return
			}
			// The bound is tight: that length reserves on an empty cache, one block more does not.
			if err := m.Reserve(m.NewSequence(), got); err != nil {
				t.Fatalf("reserve %d: %v", got, err)
			}
			if m2 := NewManager(l, tc.capacity); m2.Reserve(m2.NewSequence(), got+1) == nil {
				t.Fatalf("reserve %d fits, MaxTokens said %d", got+1, got)
			}
		})
	}
	if got := NewManager(Layout{BlockTokens: 256, StateBytes: 10}, 100).MaxTokens(1); got != maxTokens {
		t.Fatalf("no growing part: %d, want %d", got, maxTokens)
	}
}

// A slot limit caps MaxSlots and refuses a sequence beyond it until one is freed.
func TestLimitSlots(t *testing.T) {
	m := NewManager(Layout{BlockTokens: 256, StateBytes: 100, BlockBytes: 50}, 10_000)
	m.LimitSlots(2)
	if got := m.MaxSlots(); got != 2 {
		t.Fatalf("MaxSlots %d, want 2", got)
	}
	a, b, c := m.NewSequence(), m.NewSequence(), m.NewSequence()
	for _, s := range []*Sequence{a, b} {
		if err := m.Reserve(s, 10); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Reserve(c, 10); !errors.Is(err, ErrCacheFull) {
		t.Fatalf("third slot: %v, want ErrCacheFull", err)
	}
	m.Free(a)
	if err := m.Reserve(c, 10); err != nil {
		t.Fatalf("after a free: %v", err)
	}
	m.LimitSlots(0)
	if got := m.MaxSlots(); got != 100 {
		t.Fatalf("MaxSlots without a limit %d, want 100", got)
	}
}
