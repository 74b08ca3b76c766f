package cuda_test

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/cuda"
)

// TestPoolAllocExact: AllocExact reserves the size rounded to 512 bytes, not
// to its class, for sizes just above a power of two (the largest slack).
func TestPoolAllocExact(t *testing.T) {
	ctx, _ := gpu(t)
	p := ctx.NewPool()
	defer p.Trim()
	for _, n := range []int{1, 3000, 1<<20 + 1} {
		before := p.Stats().InUse
		b, err := p.AllocExact(n)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := p.Stats().InUse-before, int64((n+511)/512*512); got != want || b.Size != n {
			t.Errorf("AllocExact(%d): %d bytes reserved, size %d; want %d, %d", n, got, b.Size, want, n)
		}
		b.Free()
	}
	if _, err := p.AllocExact(0); err == nil {
		t.Errorf("AllocExact(0) accepted")
	}
}

func TestPoolHold(t *testing.T) {
	ctx, _ := gpu(t)
	p := ctx.NewPool()
	defer p.Trim()
	a, err := p.Alloc(3000)
	if err != nil {
		t.Fatal(err)
	}
	ptr := a.Ptr
	p.Hold()
	a.Free()
	b, err := p.Alloc(2900) // same class: must not get the held block
	if err != nil {
		t.Fatal(err)
	}
	if b.Ptr == ptr {
		t.Fatalf("a block freed under Hold was reused before Release")
	}
	p.Hold() // nested: only the last Release returns the blocks
	p.Release()
	c, err := p.Alloc(2900)
	if err != nil || c.Ptr == ptr {
		t.Fatalf("held block reused after an inner Release (err %v)", err)
	}
	cptr := c.Ptr
	c.Free() // held too
	p.Release()
	got := map[cuda.DevicePtr]bool{}
	for range 2 {
		d, err := p.Alloc(2900)
		if err != nil {
			t.Fatal(err)
		}
		got[d.Ptr] = true
		defer d.Free()
	}
	if !got[ptr] || !got[cptr] {
		t.Errorf("held blocks %#x, %#x not returned by Release: got %v", ptr, cptr, got)
	}
	b.Free()
	p.Release() // unmatched: no effect
	if st := p.Stats(); st.InUse != 2*st.Cached {
		t.Errorf("stats %+v: want two blocks in use, one cached", st)
	}
}

// forkJoin issues, on s: x = 0x11111111; a fork to side that sets x =
// 0x22222222 and y = x; a join; then z = y on s. Eager or captured, z must
// read 0x22222222 (side ran after the fork, s's copy after the join).
func forkJoin(t *testing.T, ctx *cuda.Context, s, side *cuda.Stream, x, y, z cuda.DevicePtr, join bool) error {
	t.Helper()
	fork, err := ctx.NewSyncEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer fork.Close()
	done, err := ctx.NewSyncEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer done.Close()
	steps := []func() error{
		func() error { return s.Memset32(x, 0x11111111, 64) },
		func() error { return fork.Record(s) },
		func() error { return side.WaitEvent(fork) },
		func() error { return side.Memset32(x, 0x22222222, 64) },
		func() error { return side.CopyDtoD(y, x, 256) },
		func() error { return done.Record(side) },
	}
	if join {
		steps = append(steps, func() error { return s.WaitEvent(done) })
	}
	steps = append(steps, func() error { return s.CopyDtoD(z, y, 256) })
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

func TestStreamForkJoin(t *testing.T) {
	ctx, s := gpu(t)
	side, err := ctx.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer side.Close()
	buf, err := ctx.Alloc(3 * 256)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	x, y, z := buf.Ptr, buf.Ptr.Add(256), buf.Ptr.Add(512)
	check := func(what string) {
		t.Helper()
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 256)
		if err := s.CopyDtoH(got, z); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 256; i += 4 {
			if v := binary.LittleEndian.Uint32(got[i:]); v != 0x22222222 {
				t.Fatalf("%s: z[%d] = %#x, want 0x22222222", what, i/4, v)
			}
		}
	}
	if err := s.Memset32(z, 0, 64); err != nil {
		t.Fatal(err)
	}
	if err := forkJoin(t, ctx, s, side, x, y, z, true); err != nil {
		t.Fatal(err)
	}
	check("eager")

	// Captured: side joins the capture through the fork event; the graph's
	// replay redoes both branches in order.
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if err := forkJoin(t, ctx, s, side, x, y, z, true); err != nil {
		t.Fatal(err)
	}
	g, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ge, err := g.Instantiate()
	if err != nil {
		t.Fatal(err)
	}
	defer ge.Close()
	for _, p := range []cuda.DevicePtr{x, y, z} {
		if err := s.Memset32(p, 0, 64); err != nil {
			t.Fatal(err)
		}
	}
	if err := ge.Launch(s); err != nil {
		t.Fatal(err)
	}
	check("replay")

	// A fork that never joins back cannot end the capture.
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if err := forkJoin(t, ctx, s, side, x, y, z, false); err != nil {
		t.Fatal(err)
	}
	if g, err := s.EndCapture(); err == nil {
		g.Close()
		t.Fatal("EndCapture accepted a capture whose fork was not joined")
	} else if !strings.Contains(err.Error(), "UNJOINED") && !strings.Contains(err.Error(), "INVALIDATED") {
		t.Errorf("unjoined capture: %v, want a stream capture error", err)
	}
	// Both streams work eagerly again afterwards.
	if err := forkJoin(t, ctx, s, side, x, y, z, true); err != nil {
		t.Fatal(err)
	}
	check("eager after the failed capture")
}
