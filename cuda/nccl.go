package cuda

import (
	"fmt"
	"os"
)

// NCCL is a loaded libnccl.so.2 (dlopen, like libcuda): communicators for
// several GPUs of one process and the collectives the sharded model needs,
// enqueued on our streams.
type NCCL struct {
	api     ncclAPI
	Version int // e.g. 22805 for 2.28.5
}

// ncclAPI is the subset of NCCL we use; results are raw ncclResult_t.
type ncclAPI interface {
	libPath() string
	version() (int, int)
	errString(r int) string
	commInitAll(devs []int) ([]uintptr, int)
	commDestroy(c uintptr) int
	commAbort(c uintptr) int
	allReduceSumF32(send, recv DevicePtr, count int, c, s uintptr) int
	allGatherF32(send, recv DevicePtr, count int, c, s uintptr) int
}

// LoadNCCL opens libnccl (MEGAMOE_NCCL overrides the path). NVLink
// multicast is switched off (NCCL_NVLS_ENABLE=0) unless the environment
// already says otherwise: the shared machines require it.
func LoadNCCL() (*NCCL, error) {
	if os.Getenv("NCCL_NVLS_ENABLE") == "" {
		if err := os.Setenv("NCCL_NVLS_ENABLE", "0"); err != nil {
			return nil, fmt.Errorf("nccl: %w", err)
		}
	}
	api, err := openNCCL()
	if err != nil {
		return nil, err
	}
	v, r := api.version()
	if r != 0 {
		return nil, &Error{Call: "ncclGetVersion", Code: r, Name: api.errString(r)}
	}
	return &NCCL{api: api, Version: v}, nil
}

// Path is the library that was opened.
func (n *NCCL) Path() string { return n.api.libPath() }

func (n *NCCL) check(call, what string, r int) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, What: what, Code: r, Name: n.api.errString(r)}
}

// NCCLComm is rank Rank of a communicator over Size GPUs.
type NCCLComm struct {
	n          *NCCL
	h          uintptr
	Rank, Size int
	Device     int
}

// InitAll creates one communicator per device, rank i on devices[i]
// (ncclCommInitAll: all ranks in this process).
func (n *NCCL) InitAll(devices []int) ([]*NCCLComm, error) {
	if len(devices) == 0 {
		return nil, fmt.Errorf("nccl: no devices")
	}
	hs, r := n.api.commInitAll(devices)
	if err := n.check("ncclCommInitAll", fmt.Sprint(devices), r); err != nil {
		return nil, err
	}
	cs := make([]*NCCLComm, len(hs))
	for i, h := range hs {
		cs[i] = &NCCLComm{n: n, h: h, Rank: i, Size: len(hs), Device: devices[i]}
	}
	return cs, nil
}

// AllReduceSumF32 sums count fp32 values over the ranks (recv may be send),
// enqueued on s (a stream of this rank's device).
func (c *NCCLComm) AllReduceSumF32(s *Stream, send, recv DevicePtr, count int) error {
	if count < 0 {
		return fmt.Errorf("nccl: all-reduce of %d values", count)
	}
	return c.n.check("ncclAllReduce", fmt.Sprintf("rank %d", c.Rank), c.n.api.allReduceSumF32(send, recv, count, c.h, s.h))
}

// AllGatherF32 writes the ranks' count values each into recv, rank-major
// (recv holds Size·count values), enqueued on s.
func (c *NCCLComm) AllGatherF32(s *Stream, send, recv DevicePtr, count int) error {
	if count < 0 {
		return fmt.Errorf("nccl: all-gather of %d values", count)
	}
	return c.n.check("ncclAllGather", fmt.Sprintf("rank %d", c.Rank), c.n.api.allGatherF32(send, recv, count, c.h, s.h))
}

// Abort tears the communicator down at once, failing its pending operations.
func (c *NCCLComm) Abort() error {
	if c.h == 0 {
		return nil
	}
	h := c.h
	c.h = 0
	return c.n.check("ncclCommAbort", fmt.Sprintf("rank %d", c.Rank), c.n.api.commAbort(h))
}

// Close destroys the communicator.
func (c *NCCLComm) Close() error {
	if c.h == 0 {
		return nil
	}
	h := c.h
	c.h = 0
	return c.n.check("ncclCommDestroy", fmt.Sprintf("rank %d", c.Rank), c.n.api.commDestroy(h))
}
