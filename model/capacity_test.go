package model

import (
	"errors"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
)

// SizeCache decides the capacity once the weights are prepared: it sees the
// layout of the store the model uses, its value wins over CacheBytes, and
// its error stops New.
func TestSizeCache(t *testing.T) {
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 1)
	refused := errors.New("no memory left")
	for _, tc := range []struct {
		name    string
		size    int64
		err     error
		wantCap int64
	}{
		{"sized", 3 << 20, nil, 3 << 20},
		{"refused", 0, refused, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen *kvcache.Layout
			m, err := New(w, nil, Options{CacheBytes: 1 << 30, SizeCache: func(l kvcache.Layout) (int64, error) {
				seen = &l
				return tc.size, tc.err
			}})
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("error %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if seen == nil || seen.StateBytes != m.Cache().Layout().StateBytes || seen.Store != m.Cache().Layout().Store {
				t.Fatalf("SizeCache saw layout %+v, the model's is %+v", seen, m.Cache().Layout())
			}
			if got := m.Cache().CapacityBytes(); got != tc.wantCap {
				t.Fatalf("capacity %d, want %d", got, tc.wantCap)
			}
		})
	}
}
