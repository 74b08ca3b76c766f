package ptxemu

import (
	"errors"
	"sync"
	"time"
)

// clusterState is a thread block cluster (sm_90): its blocks run together,
// share a split barrier (barrier.cluster.arrive / .wait) and read each
// other's shared memory through shared::cluster addresses from mapa.
type clusterState struct {
	mu       sync.Mutex
	cond     *sync.Cond
	blocks   []*blockState
	alive    int // live threads of all the blocks
	arrived  int
	gen      uint64
	progress time.Time
	err      error
}

// clusterStall is how long a cluster barrier may see no arrival before the
// launch fails as deadlocked (the blocks' own deadlock check cannot see
// threads of other blocks).
const clusterStall = 30 * time.Second

func newCluster(blocks []*blockState) *clusterState {
	c := &clusterState{blocks: blocks, progress: time.Now()}
	c.cond = sync.NewCond(&c.mu)
	for i, b := range blocks {
		b.cl, b.rank = c, i
		c.alive += b.alive
	}
	return c
}

// arrive is barrier.cluster.arrive: count t in the current phase.
func (c *clusterState) arrive(t *thread) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t.clPhase = c.gen
	t.clArrived = true
	c.arrived++
	c.progress = time.Now()
	c.maybeRelease()
}

func (c *clusterState) maybeRelease() {
	if c.arrived > 0 && c.arrived >= c.alive {
		c.arrived = 0
		c.gen++
		c.cond.Broadcast()
	}
}

// wait is barrier.cluster.wait: block until the phase t arrived in is over.
func (c *clusterState) wait(t *thread) {
	if !t.clArrived {
		t.panicf("barrier.cluster.wait without a prior arrive")
	}
	t.clArrived = false
	c.mu.Lock()
	if c.gen != t.clPhase {
		c.mu.Unlock()
		return
	}
	done := make(chan struct{})
	go func() { // wake the waiters now and then to look at the clock
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				c.mu.Lock()
				c.cond.Broadcast()
				c.mu.Unlock()
			}
		}
	}()
	defer close(done)
	for c.gen == t.clPhase && c.err == nil && !t.b.stop.Load() {
		if time.Since(c.progress) > clusterStall {
			c.err = t.fault(errors.New("deadlock: a cluster barrier saw no arrival for 30 s"), false, true)
			c.cond.Broadcast()
			break
		}
		c.cond.Wait()
	}
	err := c.err
	c.mu.Unlock()
	if err != nil || t.b.stop.Load() {
		if err == nil {
			err = errAbort // another block failed; b.fail(nil) would leave this block's waiters asleep
		}
		b := t.b
		b.mu.Lock()
		b.fail(err)
		b.alive--
		b.running--
		b.mu.Unlock()
		panic(errAbort)
	}
}

// exitThread retires one thread from the cluster barrier's count.
func (c *clusterState) exitThread() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.alive--
	c.progress = time.Now()
	c.maybeRelease()
}

// Shared::cluster addresses: (rank+1) << 24 | offset; an address without
// the rank bits is the thread's own block.
const clusterShift = 24

func (t *thread) clusterShared(addr uint64, n int) []byte {
	b := t.b
	if r := addr >> clusterShift; r != 0 {
		if b.cl == nil || int(r-1) >= len(b.cl.blocks) {
			t.illegal(errors.New("shared::cluster address of a block outside the cluster"))
		}
		b = b.cl.blocks[r-1]
		addr &= 1<<clusterShift - 1
	}
	if addr+uint64(n) > uint64(len(b.shared)) {
		t.illegal(errors.New("shared::cluster access past the block's shared memory"))
	}
	return b.shared[addr : addr+uint64(n)]
}

func decMapa(f *Function, in *inst) error {
	f.usesCluster = true
	if in.typ != "u32" || !in.has("shared::cluster") {
		return unsupported("mapa form %s", in.text)
	}
	in.exec = func(t *thread, in *inst) {
		a, r := t.get(&in.args[1]), t.get(&in.args[2])
		if t.b.cl == nil || int(r) >= len(t.b.cl.blocks) {
			t.panicf("mapa to rank %d outside the cluster", r)
		}
		t.set(&in.args[0], (r+1)<<clusterShift|a&(1<<clusterShift-1))
	}
	return nil
}

func decBarrierCluster(in *inst) {
	wait := in.has("wait")
	in.exec = func(t *thread, in *inst) {
		c := t.b.cl
		if c == nil {
			return // a launch without clusters: a cluster of one block
		}
		if wait {
			c.wait(t)
		} else {
			c.arrive(t)
		}
	}
}
