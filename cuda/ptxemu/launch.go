package ptxemu

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Dim is a grid or block shape.
type Dim struct{ X, Y, Z uint32 }

func (d Dim) n() int { return int(d.X) * int(d.Y) * int(d.Z) }

// LaunchError is a failed kernel: the first thread fault, deadlock or step
// limit, with the kernel, block and thread it happened in.
type LaunchError struct {
	Kernel   string
	Block    [3]uint32
	Thread   [3]uint32
	PC       int
	Inst     string
	Err      error
	Illegal  bool // a memory fault (CUDA_ERROR_ILLEGAL_ADDRESS)
	Deadlock bool
}

func (e *LaunchError) Error() string {
	return fmt.Sprintf("ptxemu: %s block %v thread %v pc %d (%s): %v", e.Kernel, e.Block, e.Thread, e.PC, e.Inst, e.Err)
}

func (e *LaunchError) Unwrap() error { return e.Err }

// Launch runs f to completion. params holds the kernel parameters laid out
// as the PTX declares them (the CUDA driver's kernelParams, packed).
func (d *Device) Launch(f *Function, grid, block Dim, dynSmem int, params []byte) error {
	if !f.Entry {
		return fmt.Errorf("ptxemu: %s is not an entry", f.Name)
	}
	if grid.n() == 0 || block.n() == 0 || block.n() > 1024 || dynSmem < 0 {
		return fmt.Errorf("ptxemu: %s: bad launch shape grid %v block %v dynamic shared %d", f.Name, grid, block, dynSmem)
	}
	if f.maxThreads > 0 && block.n() > f.maxThreads {
		return fmt.Errorf("ptxemu: %s: block of %d threads over .maxntid %d", f.Name, block.n(), f.maxThreads)
	}
	if len(params) < f.inSize {
		return fmt.Errorf("ptxemu: %s: %d parameter bytes, kernel takes %d", f.Name, len(params), f.inSize)
	}
	par := d.Parallel
	if par < 1 {
		par = 1
	}
	sem := make(chan struct{}, par)
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		stop     atomic.Bool // set on the first failure: running blocks abort, no new block starts
	)
	cd := f.cluster
	if cd.n() == 0 {
		cd = Dim{1, 1, 1}
	}
	if cd.n() > maxCluster {
		return fmt.Errorf("ptxemu: %s: cluster %v over %d blocks", f.Name, cd, maxCluster)
	}
	if grid.X%cd.X != 0 || grid.Y%cd.Y != 0 || grid.Z%cd.Z != 0 {
		return fmt.Errorf("ptxemu: %s: grid %v is not a multiple of the cluster %v", f.Name, grid, cd)
	}
	for z := uint32(0); z < grid.Z; z += cd.Z {
		for y := uint32(0); y < grid.Y; y += cd.Y {
			for x := uint32(0); x < grid.X; x += cd.X {
				if stop.Load() {
					break
				}
				var ids [][3]uint32 // the cluster's blocks, rank order (x fastest)
				for k := uint32(0); k < cd.Z; k++ {
					for j := uint32(0); j < cd.Y; j++ {
						for i := uint32(0); i < cd.X; i++ {
							ids = append(ids, [3]uint32{x + i, y + j, z + k})
						}
					}
				}
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-sem; wg.Done() }()
					if err := d.runCluster(f, grid, block, ids, dynSmem, params, &stop); err != nil && err != errAbort {
						errOnce.Do(func() { firstErr = err })
						stop.Store(true)
					}
				}()
			}
		}
	}
	wg.Wait()
	return firstErr
}

// maxCluster is the largest cluster the hardware allows (16 blocks, non-portable).
const maxCluster = 16

type blockState struct {
	mu      sync.Mutex
	cl      *clusterState // nil unless the kernel runs in clusters
	rank    int           // this block in its cluster
	stop    *atomic.Bool  // the launch's failure flag
	dev     *Device
	f       *Function
	shared  []byte
	params  []byte
	dynSmem int
	grid    Dim
	dim     Dim
	ctaid   [3]uint32
	alive   int
	running int
	warps   []*warpState
	bars    [16]barrier
	err     error
	async   asyncState // mbarriers, tensor memory (sm_90/sm_100)
}

type barrier struct {
	arrived, waiting, expected int
	gen                        uint64
	cond                       *sync.Cond
}

type warpState struct {
	alive  uint32     // lanes that have not exited
	groups []*collGrp // one per member mask in use
}

// collGrp is the collective exchange of the lanes that name one member
// mask. Disjoint groups of a warp (two half-warps shuffling apart) proceed
// independently. Double buffering lets a lane read generation g's values
// while the others write g+1; g+2 cannot start before every member has
// arrived at g+1, so has finished reading g.
type collGrp struct {
	cond    *sync.Cond // on the block's mutex: wakes this group's lanes only
	mask    uint32
	arrived uint32
	waiting int
	gen     uint64
	bufs    [2]collBuf
}

// collBuf is one generation of a collective: each lane's words, and the
// lanes alive when it completed (lanes of mask outside alive have exited
// and left no words).
type collBuf struct {
	vals  [32][8]uint64
	alive uint32
}

var errAbort = errors.New("aborted: another thread failed")

// runCluster runs the blocks of one cluster (one block without clusters)
// together and returns the first block error.
func (d *Device) runCluster(f *Function, grid, dim Dim, ids [][3]uint32, dynSmem int, params []byte, stop *atomic.Bool) error {
	blocks := make([]*blockState, len(ids))
	for i, id := range ids {
		blocks[i] = d.newBlock(f, grid, dim, id, dynSmem, params, stop)
	}
	if f.usesCluster {
		newCluster(blocks)
	}
	var wg sync.WaitGroup
	for _, b := range blocks {
		b.start(&wg)
	}
	wg.Wait()
	for _, b := range blocks {
		if b.err != nil && b.err != errAbort {
			return b.err
		}
	}
	for _, b := range blocks {
		if b.err != nil {
			return b.err
		}
	}
	return nil
}

func (d *Device) newBlock(f *Function, grid, dim Dim, ctaid [3]uint32, dynSmem int, params []byte, stop *atomic.Bool) *blockState {
	b := &blockState{dev: d, f: f, grid: grid, dim: dim, ctaid: ctaid, params: params, dynSmem: dynSmem, stop: stop,
		shared: make([]byte, f.dynBase+dynSmem)}
	for i := range b.bars {
		b.bars[i].cond = sync.NewCond(&b.mu)
	}
	n := dim.n()
	b.alive, b.running = n, n
	b.warps = make([]*warpState, (n+31)/32)
	for i := range b.warps {
		lanes := min(32, n-32*i)
		b.warps[i] = &warpState{alive: uint32(1<<lanes - 1)}
	}
	return b
}

// start runs the block's threads, each a goroutine counted in wg.
func (b *blockState) start(wg *sync.WaitGroup) {
	n, dim := b.dim.n(), b.dim
	wg.Add(n)
	for i := 0; i < n; i++ {
		t := &thread{b: b, w: b.warps[i/32], lane: i % 32, flat: i, fn: b.f}
		t.tid = [3]uint32{uint32(i) % dim.X, uint32(i) / dim.X % dim.Y, uint32(i) / (dim.X * dim.Y)}
		go func() {
			defer wg.Done()
			t.run()
		}()
	}
}

// fail records the block's first error and wakes every waiter. Call with
// b.mu held.
func (b *blockState) fail(err error) {
	if b.err == nil {
		b.err = err
		b.stop.Store(true)
	}
	for i := range b.bars {
		b.bars[i].cond.Broadcast()
	}
	for _, w := range b.warps {
		for _, grp := range w.groups {
			grp.cond.Broadcast()
		}
	}
	if b.async.cond != nil {
		b.async.cond.Broadcast()
	}
}

// wait sleeps until *gen moves past g. The releaser counts woken threads
// back into running, so running == 0 at sleep time means deadlock.
func (b *blockState) wait(t *thread, cond *sync.Cond, gen *uint64, g uint64) {
	b.running--
	if b.running == 0 && *gen == g {
		b.fail(t.fault(errors.New("deadlock: every live thread of the block is waiting"), false, true))
	}
	for *gen == g && b.err == nil {
		cond.Wait()
	}
	if b.err != nil {
		b.mu.Unlock()
		panic(errAbort)
	}
}

// collective exchanges up to 8 words with the lanes of mask and returns all
// lanes' words. Lanes that have exited are not waited for.
func (t *thread) collective(mask uint32, words ...uint64) *collBuf {
	b, w := t.b, t.w
	b.mu.Lock()
	var grp *collGrp
	for _, x := range w.groups {
		if x.mask == mask {
			grp = x
			break
		}
	}
	if grp == nil {
		grp = &collGrp{mask: mask, cond: sync.NewCond(&b.mu)}
		w.groups = append(w.groups, grp)
	}
	g := grp.gen
	buf := &grp.bufs[g&1]
	copy(buf.vals[t.lane][:], words)
	grp.arrived |= 1 << t.lane
	if grp.complete(w.alive) {
		b.releaseGroup(grp, w.alive)
	} else {
		grp.waiting++
		b.wait(t, grp.cond, &grp.gen, g)
	}
	b.mu.Unlock()
	return buf
}

// complete reports whether every live lane of the group's mask has arrived.
func (grp *collGrp) complete(alive uint32) bool {
	return grp.arrived != 0 && grp.mask&alive&^grp.arrived == 0
}

func (b *blockState) releaseGroup(grp *collGrp, alive uint32) {
	grp.bufs[grp.gen&1].alive = alive
	b.running += grp.waiting
	grp.waiting, grp.arrived = 0, 0
	grp.gen++
	grp.cond.Broadcast()
}

// barSync is bar.sync / bar.arrive on barrier id for count threads (0: all).
func (t *thread) barSync(id, count int, arriveOnly bool) {
	b := t.b
	if id < 0 || id >= len(b.bars) {
		t.panicf("barrier %d out of range", id)
	}
	b.mu.Lock()
	bar := &b.bars[id]
	g := bar.gen
	bar.arrived++
	if count > 0 {
		bar.expected = count
	} else {
		bar.expected = 0
	}
	if b.barDone(bar) {
		b.releaseBar(bar)
	} else if !arriveOnly {
		bar.waiting++
		b.wait(t, bar.cond, &bar.gen, g)
	}
	b.mu.Unlock()
}

func (b *blockState) barDone(bar *barrier) bool {
	if bar.arrived == 0 {
		return false
	}
	if bar.expected > 0 {
		return bar.arrived >= bar.expected
	}
	return bar.arrived >= b.alive
}

func (b *blockState) releaseBar(bar *barrier) {
	b.running += bar.waiting
	bar.waiting, bar.arrived = 0, 0
	bar.gen++
	bar.cond.Broadcast()
}

// exit retires t; collectives and barriers that waited only on it complete.
func (t *thread) exit() {
	b, w := t.b, t.w
	b.mu.Lock()
	defer b.mu.Unlock()
	b.alive--
	b.running--
	w.alive &^= 1 << t.lane
	if b.cl != nil {
		b.cl.exitThread()
	}
	for _, grp := range w.groups {
		if grp.complete(w.alive) {
			b.releaseGroup(grp, w.alive)
		}
	}
	for i := range b.bars {
		if bar := &b.bars[i]; bar.expected == 0 && b.barDone(bar) {
			b.releaseBar(bar)
		}
	}
	if b.running == 0 && b.alive > 0 && b.err == nil {
		b.fail(t.fault(errors.New("deadlock: the remaining threads wait on a barrier or collective that cannot complete"), false, true))
	}
	if b.alive == 0 && b.err == nil {
		if err := b.async.leftover(); err != nil {
			b.fail(t.fault(err, false, false))
		}
	}
}
