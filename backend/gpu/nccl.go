package gpu

import (
	"fmt"
	"sync"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/parallel"
)

// NewNCCLComms returns one parallel.Comm per backend (rank r on bs[r], one
// GPU each) over an NCCL communicator: the collectives are enqueued on each
// backend's stream, so a step needs no host synchronisation for them. The
// returned close function destroys the communicators.
func NewNCCLComms(bs []*Backend) ([]parallel.Comm, func() error, error) {
	n, err := cuda.LoadNCCL()
	if err != nil {
		return nil, nil, err
	}
	devs := make([]int, len(bs))
	for r, b := range bs {
		devs[r] = b.dev.Ordinal
	}
	cs, err := n.InitAll(devs)
	if err != nil {
		return nil, nil, err
	}
	g := &ncclGroup{comms: cs}
	out := make([]parallel.Comm, len(bs))
	for r, b := range bs {
		out[r] = &ncclComm{g: g, c: cs[r], b: b}
	}
	return out, g.close, nil
}

// ncclGroup shares the abort state of the ranks of one communicator.
type ncclGroup struct {
	mu    sync.Mutex
	err   error
	comms []*cuda.NCCLComm
}

func (g *ncclGroup) failed() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// abort tears every rank's communicator down (releasing ranks blocked in a
// collective); the group stays failed.
func (g *ncclGroup) abort(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return
	}
	g.err = fmt.Errorf("%w: %v", parallel.ErrAborted, err)
	for _, c := range g.comms {
		c.Abort()
	}
}

func (g *ncclGroup) close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var first error
	for _, c := range g.comms {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

type ncclComm struct {
	g *ncclGroup
	c *cuda.NCCLComm
	b *Backend
}

func (c *ncclComm) Rank() int       { return c.c.Rank }
func (c *ncclComm) Size() int       { return c.c.Size }
func (c *ncclComm) Abort(err error) { c.g.abort(err) }

func (c *ncclComm) own(be backend.Backend) error {
	if be != backend.Backend(c.b) {
		return fmt.Errorf("nccl rank %d: tensor of another backend", c.c.Rank)
	}
	return c.g.failed()
}

func (c *ncclComm) AllReduceSum(be backend.Backend, t backend.Tensor) error {
	if err := c.own(be); err != nil {
		return err
	}
	tt, err := f32(t, -1, -1, "all-reduce")
	if err != nil {
		return err
	}
	return c.c.AllReduceSumF32(c.b.s, tt.ptr, tt.ptr, tt.rows*tt.cols)
}

func (c *ncclComm) AllGatherRows(be backend.Backend, part, out backend.Tensor) error {
	if err := c.own(be); err != nil {
		return err
	}
	pt, err := f32(part, -1, -1, "all-gather part")
	if err != nil {
		return err
	}
	if _, err := f32(out, pt.rows*c.c.Size, pt.cols, "all-gather output"); err != nil {
		return err
	}
	ot := out.(*Tensor)
	return c.c.AllGatherF32(c.b.s, pt.ptr, ot.ptr, pt.rows*pt.cols)
}
