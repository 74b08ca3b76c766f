// Package parallel holds the collectives of a model split over ranks
// (tensor-parallel attention and head, expert-parallel MoE; spec §8.1): the
// Comm interface the model calls, and Local, an in-process implementation
// over host memory that works with any backend (the CPU reference, or one
// GPU per rank through downloads and uploads).
package parallel

import (
	"errors"
	"fmt"
	"sync"

	"github.com/megamoe/megamoe/backend"
)

// Comm is one rank's end of a communicator over Size ranks. Every rank must
// call the same collectives in the same order; each call blocks until all
// ranks have made it (or the group is aborted).
type Comm interface {
	Rank() int
	Size() int
	// AllReduceSum replaces the F32 tensor t on every rank by the elementwise
	// sum over ranks, added in rank order (every rank gets identical bits).
	AllReduceSum(be backend.Backend, t backend.Tensor) error
	// AllGatherRows writes out [Size·rows, cols] on every rank: the ranks'
	// part [rows, cols] stacked in rank order (NCCL's all-gather layout).
	AllGatherRows(be backend.Backend, part, out backend.Tensor) error
	// Abort makes every pending and later collective of the group fail with
	// err (a rank that failed must not leave the others waiting).
	Abort(err error)
}

// ErrAborted wraps the error a collective returns after Abort.
var ErrAborted = errors.New("parallel: group aborted")

// Local is a group of n ranks in one process exchanging through host memory.
type Local struct {
	n       int
	mu      sync.Mutex
	cond    *sync.Cond
	arrived int
	gen     uint64
	err     error
	slots   [][]float32
}

// NewLocal creates a group of n ranks and returns it with one Comm per rank.
func NewLocal(n int) (*Local, []Comm, error) {
	if n < 1 {
		return nil, nil, fmt.Errorf("parallel: %d ranks", n)
	}
	g := &Local{n: n, slots: make([][]float32, n)}
	g.cond = sync.NewCond(&g.mu)
	comms := make([]Comm, n)
	for r := range comms {
		comms[r] = &localComm{g: g, rank: r}
	}
	return g, comms, nil
}

// Abort fails every pending and later collective with err until Reset.
func (g *Local) Abort(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.err = fmt.Errorf("%w: %v", ErrAborted, err)
	}
	g.cond.Broadcast()
}

// Reset clears an abort once no rank is inside a collective (the caller
// knows: it waited for every rank's step to return).
func (g *Local) Reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.err, g.arrived = nil, 0
	clear(g.slots)
}

// barrier returns when all n ranks have arrived, or the abort error.
func (g *Local) barrier() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return g.err
	}
	g.arrived++
	if g.arrived == g.n {
		g.arrived = 0
		g.gen++
		g.cond.Broadcast()
		return nil
	}
	gen := g.gen
	for g.gen == gen && g.err == nil {
		g.cond.Wait()
	}
	if g.gen == gen {
		return g.err
	}
	return nil
}

// exchange publishes data as rank's slot, waits for all ranks, runs read
// over every slot, and waits again so that no slot is reused while read.
func (g *Local) exchange(rank int, data []float32, read func(slots [][]float32) error) error {
	g.mu.Lock()
	g.slots[rank] = data
	g.mu.Unlock()
	if err := g.barrier(); err != nil {
		return err
	}
	g.mu.Lock()
	slots := append([][]float32(nil), g.slots...)
	g.mu.Unlock()
	rerr := read(slots)
	if err := g.barrier(); err != nil {
		return err
	}
	return rerr
}

type localComm struct {
	g    *Local
	rank int
}

func (c *localComm) Rank() int       { return c.rank }
func (c *localComm) Size() int       { return c.g.n }
func (c *localComm) Abort(err error) { c.g.Abort(err) }

func (c *localComm) AllReduceSum(be backend.Backend, t backend.Tensor) error {
	if t.DType() != backend.F32 {
		return fmt.Errorf("parallel: all-reduce of a %v tensor", t.DType())
	}
	n := t.Rows() * t.Cols()
	mine := make([]float32, n)
	if err := be.Download(t, mine); err != nil {
		c.g.Abort(err)
		return fmt.Errorf("parallel: all-reduce rank %d: %w", c.rank, err)
	}
	sum := make([]float32, n)
	err := c.g.exchange(c.rank, mine, func(slots [][]float32) error {
		for r, s := range slots {
			if len(s) != n {
				return fmt.Errorf("parallel: all-reduce: rank %d sent %d values, rank %d has %d", r, len(s), c.rank, n)
			}
		}
		for i := range sum {
			var a float32
			for _, s := range slots {
				a += s[i]
			}
			sum[i] = a
		}
		return nil
	})
	if err != nil {
		return err
	}
	return be.Upload(t, sum)
}

func (c *localComm) AllGatherRows(be backend.Backend, part, out backend.Tensor) error {
	rows, cols := part.Rows(), part.Cols()
	if part.DType() != backend.F32 || out.DType() != backend.F32 || out.Rows() != rows*c.g.n || out.Cols() != cols {
		return fmt.Errorf("parallel: all-gather of [%d, %d] into [%d, %d] over %d ranks", rows, cols, out.Rows(), out.Cols(), c.g.n)
	}
	mine := make([]float32, rows*cols)
	if err := be.Download(part, mine); err != nil {
		c.g.Abort(err)
		return fmt.Errorf("parallel: all-gather rank %d: %w", c.rank, err)
	}
	all := make([]float32, rows*cols*c.g.n)
	err := c.g.exchange(c.rank, mine, func(slots [][]float32) error {
		for r, s := range slots {
			if len(s) != rows*cols {
				return fmt.Errorf("parallel: all-gather: rank %d sent %d values, want %d", r, len(s), rows*cols)
			}
			copy(all[r*rows*cols:], s)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return be.Upload(out, all)
}
