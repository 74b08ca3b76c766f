package ptxemu

import (
	"fmt"
	"sort"
	"sync"
)

// Address windows. Global allocations live from globalBase up, each followed
// by an unmapped guard gap so that overruns fault instead of landing in a
// neighbour. Generic addresses of shared, local and param memory are offsets
// into their windows (cvta adds or removes the base).
const (
	globalBase  = 1 << 40
	guardGap    = 1 << 16
	sharedWin   = 0x7000_0000_0000
	localWin    = 0x6000_0000_0000
	paramWin    = 0x5000_0000_0000
	windowBytes = 1 << 32
)

// Device is the emulated GPU: its memory and its launch settings.
type Device struct {
	mu     sync.Mutex
	allocs []alloc // sorted by base
	next   uint64
	used   uint64
	// Limit caps allocated bytes (0: no cap), so out-of-memory paths run.
	Limit uint64
	// Parallel is how many blocks run at once (default 8).
	Parallel int
	// MaxSteps bounds the instructions one thread may execute (default 1<<28):
	// a kernel that spins forever fails instead of hanging.
	MaxSteps int64
	atomicMu sync.Mutex
}

type alloc struct {
	base uint64
	buf  []byte
}

// NewDevice returns an empty emulated device.
func NewDevice() *Device { return &Device{next: globalBase, Parallel: 8, MaxSteps: 1 << 28} }

// Alloc reserves n bytes of device memory, zeroed, 256-byte aligned.
func (d *Device) Alloc(n int) (uint64, error) {
	if n < 0 {
		return 0, fmt.Errorf("ptxemu: negative allocation %d", n)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.Limit > 0 && d.used+uint64(n) > d.Limit {
		return 0, ErrOutOfMemory
	}
	base := d.next
	d.allocs = append(d.allocs, alloc{base: base, buf: make([]byte, n)})
	d.next = (base + uint64(n) + guardGap + 255) &^ 255
	d.used += uint64(n)
	return base, nil
}

// ErrOutOfMemory is returned by Alloc past Device.Limit.
var ErrOutOfMemory = fmt.Errorf("ptxemu: out of memory")

// Free releases an allocation made by Alloc.
func (d *Device) Free(p uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := sort.Search(len(d.allocs), func(i int) bool { return d.allocs[i].base >= p })
	if i == len(d.allocs) || d.allocs[i].base != p {
		return fmt.Errorf("ptxemu: free of %#x, not an allocation", p)
	}
	d.used -= uint64(len(d.allocs[i].buf))
	d.allocs = append(d.allocs[:i], d.allocs[i+1:]...)
	return nil
}

// Used is the number of bytes allocated.
func (d *Device) Used() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// Bytes returns the n bytes of device memory at p, which must lie inside one
// allocation. The slice aliases device memory.
func (d *Device) Bytes(p uint64, n int) ([]byte, error) { return d.bytes(p, n) }

func (d *Device) bytes(p uint64, n int) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lookup(p, n)
}

func (d *Device) lookup(p uint64, n int) ([]byte, error) {
	a, err := d.lookupAlloc(p, n)
	if err != nil {
		return nil, err
	}
	off := p - a.base
	return a.buf[off : off+uint64(n)], nil
}

// lookupAlloc returns the allocation that holds the n bytes at p. Call with
// d.mu held.
func (d *Device) lookupAlloc(p uint64, n int) (alloc, error) {
	i := sort.Search(len(d.allocs), func(i int) bool { return d.allocs[i].base > p }) - 1
	if i >= 0 {
		a := d.allocs[i]
		if off := p - a.base; off+uint64(n) <= uint64(len(a.buf)) && n >= 0 {
			return a, nil
		}
	}
	return alloc{}, fmt.Errorf("illegal address %#x (+%d bytes)", p, n)
}
