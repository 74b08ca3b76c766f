package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// sideMaxRows is the largest step whose forks run on the side stream: a
// decode step's kernels leave most of the device idle (latency-bound), a
// prefill chunk's fill it alone.
const sideMaxRows = 64

// sideStream runs forked ops (Backend.Fork) on a second stream. The
// fork and join are events, so a recorded step's graph gets two branches.
// While a fork is open the pool holds every freed block: a block freed on
// one stream must not be reused on the other before the join orders them.
type sideStream struct {
	on         bool // !Options.NoSideStream
	s          *cuda.Stream
	fork, done *cuda.Event
	open       bool
	inFn       bool       // issuing the fork's ops: a Join now (a sync inside an op) must not end it
	pool       *cuda.Pool // held while open
	forks      int        // forks run on the side stream (tests)
}

// Fork implements backend.Backend: fn's ops go to the side stream, which
// starts after everything issued so far; steps above sideMaxRows rows, or
// with the side stream off, run fn on the main stream.
func (b *Backend) Fork(rows int, bt *backend.Batch, fn func() error) error {
	sd := &b.side
	if !sd.on || sd.open || rows <= 0 || rows > sideMaxRows {
		return fn()
	}
	if bt != nil { // upload the layout on the main stream, before either branch uses it
		if _, err := b.deviceBatch(bt); err != nil {
			return fmt.Errorf("fork: %w", err)
		}
	}
	if err := b.openSide(); err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	main := b.s
	if err := sd.fork.Record(main); err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	if err := sd.s.WaitEvent(sd.fork); err != nil {
		return fmt.Errorf("fork: %w", err)
	}
	sd.s.SetPDL(main.PDL())
	sd.pool, sd.open = b.pool(), true
	sd.forks++
	sd.pool.Hold()
	b.s, sd.inFn = sd.s, true
	err := fn()
	b.s, sd.inFn = main, false
	if e := sd.done.Record(sd.s); err == nil && e != nil {
		err = fmt.Errorf("fork: %w", e)
	}
	if err != nil {
		if e := b.Join(); e != nil {
			return fmt.Errorf("%w (join: %v)", err, e)
		}
	}
	return err
}

// Join implements backend.Backend: the main stream waits for the side
// stream's work, and the blocks freed meanwhile go back to the pool.
func (b *Backend) Join() error {
	sd := &b.side
	if !sd.open || sd.inFn {
		return nil
	}
	sd.open = false
	err := b.s.WaitEvent(sd.done)
	sd.pool.Release()
	sd.pool = nil
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	return nil
}

// SetSideStream turns the side stream on or off for the steps that follow
// (Options.NoSideStream; tools comparing both in one process). Recorded steps
// keep what they captured: see DropGraphs.
func (b *Backend) SetSideStream(on bool) error {
	if err := b.Join(); err != nil {
		return err
	}
	b.side.on = on
	return nil
}

// openSide creates the side stream and its events on first use.
func (b *Backend) openSide() error {
	sd := &b.side
	if sd.s != nil {
		return nil
	}
	s, err := b.ctx.NewStream()
	if err != nil {
		return err
	}
	fork, err := b.ctx.NewSyncEvent()
	if err != nil {
		s.Close()
		return err
	}
	done, err := b.ctx.NewSyncEvent()
	if err != nil {
		fork.Close()
		s.Close()
		return err
	}
	sd.s, sd.fork, sd.done = s, fork, done
	return nil
}

// closeSide joins and releases the side stream (Close).
func (b *Backend) closeSide() error {
	sd := &b.side
	err := b.Join()
	if sd.s == nil {
		return err
	}
	for _, e := range []error{sd.s.Close(), sd.fork.Close(), sd.done.Close()} {
		if err == nil {
			err = e
		}
	}
	sd.s, sd.fork, sd.done = nil, nil, nil
	return err
}
