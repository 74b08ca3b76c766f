package cuda

import (
	"fmt"
	"math/bits"
	"sync"
)

// Pool hands out device memory from per-size-class free lists over cuMemAlloc.
// Freed buffers go back to their class list and are reused; Trim returns the
// cached blocks to the driver. Size classes are 4 steps per power of two
// (at most 25% slack), with a 512-byte minimum that keeps blocks aligned.
type Pool struct {
	ctx *Context

	mu     sync.Mutex
	free   map[int][]DevicePtr // class size -> cached blocks
	inUse  int64
	cached int64
	allocs int64 // cuMemAlloc calls
	keep   bool  // never trim on its own: graphs hold the addresses of cached blocks
	holds  int   // open Holds: freed blocks wait in held
	held   []*Buffer
}

// Buffer is a block of device memory owned by a pool.
type Buffer struct {
	Ptr  DevicePtr
	Size int // requested bytes
	cls  int // class bytes actually reserved
	pool *Pool
}

// PoolStats are byte counts of a pool.
type PoolStats struct {
	InUse, Cached int64 // bytes handed out / bytes held in free lists
	Allocs        int64 // cuMemAlloc calls so far
}

const minClass = 512

// classSize rounds n up to its size class.
func classSize(n int) int {
	if n <= minClass {
		return minClass
	}
	// top = highest power of two <= n; steps of top/4 above it.
	top := 1 << (bits.Len(uint(n)) - 1)
	step := top / 4
	return (n + step - 1) / step * step
}

// ClassSize is the bytes a pool reserves for a request of n bytes.
func ClassSize(n int) int { return classSize(n) }

// Alloc returns a buffer of at least n bytes from the context's pool.
func (c *Context) Alloc(n int) (*Buffer, error) { return c.pool.Alloc(n) }

// NewPool returns a second pool on the context, whose blocks no other pool
// reuses (the scratch of recorded CUDA graphs): it keeps its cached blocks
// when the device runs out of memory. Trim it before the context closes.
func (c *Context) NewPool() *Pool { return &Pool{ctx: c, free: map[int][]DevicePtr{}, keep: true} }

// AllocExact returns a buffer of n bytes from the context's pool without a
// size class's slack: see Pool.AllocExact.
func (c *Context) AllocExact(n int) (*Buffer, error) { return c.pool.AllocExact(n) }

// Alloc returns a buffer of at least n bytes.
func (p *Pool) Alloc(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: Alloc(%d): size must be positive", n)
	}
	return p.alloc(n, classSize(n))
}

// AllocExact returns a buffer of n bytes rounded up to the 512-byte minimum
// only, for large long-lived buffers (the KV cache) where a size class's
// slack of up to 25% would be memory nothing uses. Freed, its block is
// reused only for a request of the same rounded size.
func (p *Pool) AllocExact(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: AllocExact(%d): size must be positive", n)
	}
	return p.alloc(n, (n+minClass-1)/minClass*minClass)
}

func (p *Pool) alloc(n, cls int) (*Buffer, error) {
	p.mu.Lock()
	if l := p.free[cls]; len(l) > 0 {
		ptr := l[len(l)-1]
		p.free[cls] = l[:len(l)-1]
		p.cached -= int64(cls)
		p.inUse += int64(cls)
		p.mu.Unlock()
		return &Buffer{Ptr: ptr, Size: n, cls: cls, pool: p}, nil
	}
	p.mu.Unlock()
	ptr, r := p.ctx.drv.api.memAlloc(p.ctx.h, cls)
	if r == errOutOfMemory && !p.keep {
		// Give the cache back and try once more.
		if err := p.Trim(); err != nil {
			return nil, err
		}
		ptr, r = p.ctx.drv.api.memAlloc(p.ctx.h, cls)
	}
	if err := p.ctx.check("cuMemAlloc", fmt.Sprint(cls), r); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.inUse += int64(cls)
	p.allocs++
	p.mu.Unlock()
	return &Buffer{Ptr: ptr, Size: n, cls: cls, pool: p}, nil
}

// Free returns the buffer to its pool. Work that uses it must be complete or
// ordered before the next user on the same stream.
func (b *Buffer) Free() {
	if b == nil || b.pool == nil {
		return
	}
	p := b.pool
	b.pool = nil
	p.mu.Lock()
	if p.holds > 0 {
		p.held = append(p.held, &Buffer{Ptr: b.Ptr, cls: b.cls})
		p.mu.Unlock()
		return
	}
	p.free[b.cls] = append(p.free[b.cls], b.Ptr)
	p.inUse -= int64(b.cls)
	p.cached += int64(b.cls)
	p.mu.Unlock()
}

// Hold keeps the blocks freed from now on out of reuse until the matching
// Release. Reuse is ordered by one stream; while work issued on a second
// stream may run beside it, a block either frees must not go to the other.
func (p *Pool) Hold() {
	p.mu.Lock()
	p.holds++
	p.mu.Unlock()
}

// Release ends a Hold; the last one returns the held blocks to the pool.
func (p *Pool) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holds == 0 {
		return
	}
	if p.holds--; p.holds > 0 {
		return
	}
	for _, b := range p.held {
		p.free[b.cls] = append(p.free[b.cls], b.Ptr)
		p.inUse -= int64(b.cls)
		p.cached += int64(b.cls)
	}
	p.held = nil
}

// Trim frees every cached block with cuMemFree.
func (p *Pool) Trim() error {
	p.mu.Lock()
	free := p.free
	p.free = map[int][]DevicePtr{}
	p.cached = 0
	p.mu.Unlock()
	var first error
	for _, l := range free {
		for _, ptr := range l {
			if err := p.ctx.check("cuMemFree", "", p.ctx.drv.api.memFree(p.ctx.h, ptr)); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{InUse: p.inUse, Cached: p.cached, Allocs: p.allocs}
}
