package parallel

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/internal/testctx"
)

// onRanks runs f on every rank concurrently and returns their errors.
func onRanks(comms []Comm, f func(c Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = f(c) }()
	}
	wg.Wait()
	return errs
}

func TestCollectives(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			_, comms, err := NewLocal(n)
			if err != nil {
				t.Fatal(err)
			}
			const rows, cols = 3, 5
			got := make([][]float32, n)
			gath := make([][]float32, n)
			errs := onRanks(comms, func(c Comm) error {
				be := cpu.New(cpu.Options{Threads: 1})
				x := be.Alloc(rows, cols, backend.F32)
				v := make([]float32, rows*cols)
				for i := range v {
					v[i] = float32(c.Rank()*100 + i)
				}
				if err := be.Upload(x, v); err != nil {
					return err
				}
				for range 3 { // repeated collectives reuse the slots
					if err := be.Upload(x, v); err != nil {
						return err
					}
					if err := c.AllReduceSum(be, x); err != nil {
						return err
					}
				}
				got[c.Rank()] = make([]float32, rows*cols)
				if err := be.Download(x, got[c.Rank()]); err != nil {
					return err
				}
				if err := be.Upload(x, v); err != nil {
					return err
				}
				out := be.Alloc(n*rows, cols, backend.F32)
				if err := c.AllGatherRows(be, x, out); err != nil {
					return err
				}
				gath[c.Rank()] = make([]float32, rows*n*cols)
				return be.Download(out, gath[c.Rank()])
			})
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			for r := range n {
				for i, g := range got[r] {
					want := float32(0)
					for k := range n {
						want += float32(k*100 + i)
					}
					if g != want {
						t.Fatalf("rank %d all-reduce [%d] = %g, want %g", r, i, g, want)
					}
				}
				for k := range n {
					for i := range rows * cols {
						if g, want := gath[r][k*rows*cols+i], float32(k*100+i); g != want {
							t.Fatalf("rank %d all-gather part %d [%d] = %g, want %g", r, k, i, g, want)
						}
					}
				}
			}
		})
	}
}

// TestAbort: a rank waiting in a collective is released with ErrAborted when
// another rank aborts, later collectives fail too, and Reset makes the group
// usable again.
func TestAbort(t *testing.T) {
	g, comms, err := NewLocal(2)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(cpu.Options{Threads: 1})
	x := be.Alloc(1, 4, backend.F32)
	done := make(chan error, 1)
	go func() { done <- comms[0].AllReduceSum(be, x) }()
	ctx := testctx.New(t)
	// Abort only once rank 0 waits in the barrier (it holds mu from arriving
	// to waiting), so that the abort must wake it.
	for waiting := false; !waiting; {
		g.mu.Lock()
		waiting = g.arrived == 1
		g.mu.Unlock()
		if ctx.Err() != nil {
			t.Fatal("rank 0 never reached the barrier")
		}
		runtime.Gosched()
	}
	comms[1].Abort(errors.New("rank 1 ran out of memory"))
	select {
	case err := <-done:
		if !errors.Is(err, ErrAborted) {
			t.Fatalf("waiting rank: %v, want ErrAborted", err)
		}
	case <-ctx.Done():
		t.Fatal("abort did not release the waiting rank")
	}
	if err := comms[0].AllReduceSum(be, x); !errors.Is(err, ErrAborted) {
		t.Fatalf("after abort: %v", err)
	}
	g.Reset()
	errs := onRanks(comms, func(c Comm) error { return c.AllReduceSum(be, be.Alloc(1, 4, backend.F32)) })
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("after reset: %v", errs)
	}
}

func TestBadArguments(t *testing.T) {
	if _, _, err := NewLocal(0); err == nil {
		t.Error("0 ranks accepted")
	}
	_, comms, _ := NewLocal(2)
	be := cpu.New(cpu.Options{Threads: 1})
	if err := comms[0].AllGatherRows(be, be.Alloc(2, 3, backend.F32), be.Alloc(3, 3, backend.F32)); err == nil {
		t.Error("all-gather into the wrong height accepted")
	}
	if err := comms[0].AllReduceSum(be, be.Alloc(2, 3, backend.I32)); err == nil {
		t.Error("all-reduce of an I32 tensor accepted")
	}
	// Ranks that disagree on the size fail instead of reading past a slot.
	errs := onRanks(comms, func(c Comm) error { return c.AllReduceSum(be, be.Alloc(1, 2+c.Rank(), backend.F32)) })
	if errs[0] == nil && errs[1] == nil {
		t.Error("mismatched all-reduce sizes accepted")
	}
}
