package model

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/parallel"
)

// Parallel is one model split over ranks by checkpoint.Shard (tensor-parallel
// attention heads and head vocabulary, expert-parallel routed experts), each
// rank a Model on its own backend. Every step runs on all ranks at once, one
// goroutine per rank, in lockstep through the group's collectives. The caller
// sees rank 0's cache manager; the other ranks mirror each of its sequences
// (same lengths, so the same capacity decisions).
type Parallel struct {
	cfg    *checkpoint.Config // the whole model's
	ranks  []*Model
	group  *parallel.Local // nil with caller-made communicators
	mu     sync.Mutex
	mirror map[*kvcache.Sequence][]*kvcache.Sequence // rank 0 sequence -> ranks 1..n-1
	broken error                                     // ranks disagreed on a step's outcome
}

// NewParallel shards w over len(backends) ranks and prepares rank r on
// backends[r] (a CPU backend when nil), exchanging through host memory.
func NewParallel(w *checkpoint.Weights, backends []backend.Backend, opts Options) (*Parallel, error) {
	if w == nil || w.Config == nil {
		return nil, errors.New("model: nil weights")
	}
	group, comms, err := parallel.NewLocal(len(backends))
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	p, err := NewParallelComms(w, backends, comms, opts)
	if err != nil {
		return nil, err
	}
	p.group = group
	return p, nil
}

// NewParallelComms is NewParallel over caller-made communicators (comms[r]
// for rank r, e.g. NCCL between GPUs). After a failed step they cannot be
// reset, so the model refuses further steps.
func NewParallelComms(w *checkpoint.Weights, backends []backend.Backend, comms []parallel.Comm, opts Options) (*Parallel, error) {
	if w == nil || w.Config == nil {
		return nil, errors.New("model: nil weights")
	}
	n := len(backends)
	if opts.Comm != nil {
		return nil, errors.New("model: a parallel model takes its communicators per rank; leave Options.Comm nil")
	}
	if len(comms) != n || n == 0 {
		return nil, fmt.Errorf("model: %d communicators for %d backends", len(comms), n)
	}
	p := &Parallel{cfg: w.Config, mirror: map[*kvcache.Sequence][]*kvcache.Sequence{}}
	for r, be := range backends {
		shard, err := checkpoint.Shard(w, r, n)
		if err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
		o := opts
		o.Comm = comms[r]
		m, err := New(shard, be, o)
		if err != nil {
			return nil, fmt.Errorf("model rank %d of %d: %w", r, n, err)
		}
		p.ranks = append(p.ranks, m)
	}
	return p, nil
}

// Config returns the whole model's architecture.
func (p *Parallel) Config() *checkpoint.Config { return p.cfg }

// Ranks is the number of ranks.
func (p *Parallel) Ranks() int { return len(p.ranks) }

// Rank returns rank r's model (for inspection and tests).
func (p *Parallel) Rank(r int) *Model { return p.ranks[r] }

// Cache returns rank 0's KV cache manager: sequences are created there.
func (p *Parallel) Cache() *kvcache.Manager { return p.ranks[0].Cache() }

// FreeSequence releases s and its mirrors.
func (p *Parallel) FreeSequence(s *kvcache.Sequence) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for r, ms := range p.mirror[s] {
		p.ranks[r+1].FreeSequence(ms)
	}
	delete(p.mirror, s)
	p.ranks[0].FreeSequence(s)
}

// Forward runs one step on every rank and returns rank 0's output (the
// logits are complete on every rank after the head's all-gather).
func (p *Parallel) Forward(b *Batch) (*Output, error) {
	if b == nil {
		return nil, errors.New("model: nil batch")
	}
	return p.onRanks(len(b.Items), func(i int) *kvcache.Sequence { return b.Items[i].Seq },
		func(r int, m *Model, seqs []*kvcache.Sequence) (*Output, error) {
			if r == 0 {
				return m.Forward(b)
			}
			rb := &Batch{Items: slices.Clone(b.Items)}
			for i := range rb.Items {
				rb.Items[i].Seq = seqs[i]
			}
			return m.Forward(rb)
		})
}

// HasMTP reports whether the model has an MTP block.
func (p *Parallel) HasMTP() bool { return p.ranks[0].HasMTP() }

// ForwardMTP runs the MTP block on every rank (Model.ForwardMTP); the hidden
// streams of rank 0's Forward serve every rank (they are identical).
func (p *Parallel) ForwardMTP(items []MTPItem) (*Output, error) {
	return p.onRanks(len(items), func(i int) *kvcache.Sequence { return items[i].Seq },
		func(r int, m *Model, seqs []*kvcache.Sequence) (*Output, error) {
			if r == 0 {
				return m.ForwardMTP(items)
			}
			ri := slices.Clone(items)
			for i := range ri {
				ri[i].Seq = seqs[i]
			}
			return m.ForwardMTP(ri)
		})
}

// onRanks runs step on every rank at once with rank r's mirrors of the n
// items' sequences (seq(i) on rank 0), and sorts out the outcome: all ranks
// succeeded (rank 0's output), all failed before advancing (the group is
// reset), or some failed (the model is broken: the ranks are out of step).
func (p *Parallel) onRanks(n int, seq func(i int) *kvcache.Sequence, step func(r int, m *Model, seqs []*kvcache.Sequence) (*Output, error)) (*Output, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken != nil {
		return nil, p.broken
	}
	mirrors := make([][]*kvcache.Sequence, len(p.ranks)) // [rank][item]
	for r := 1; r < len(p.ranks); r++ {
		mirrors[r] = make([]*kvcache.Sequence, n)
	}
	for i := range n {
		s := seq(i)
		if s == nil {
			continue // the rank models report the missing sequence
		}
		ms, ok := p.mirror[s]
		if !ok {
			for r := 1; r < len(p.ranks); r++ {
				ms = append(ms, p.ranks[r].Cache().NewSequence())
			}
			p.mirror[s] = ms
		}
		for r := 1; r < len(p.ranks); r++ {
			mirrors[r][i] = ms[r-1]
		}
	}
	outs := make([]*Output, len(p.ranks))
	errs := make([]error, len(p.ranks))
	var wg sync.WaitGroup
	for r, m := range p.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[r], errs[r] = step(r, m, mirrors[r])
			if errs[r] != nil {
				m.opts.Comm.Abort(fmt.Errorf("rank %d: %w", r, errs[r]))
			}
		}()
	}
	wg.Wait()
	failed := 0
	var first error
	for r, err := range errs {
		if err != nil {
			failed++
			if first == nil || errors.Is(first, parallel.ErrAborted) {
				first = fmt.Errorf("rank %d: %w", r, err)
			}
		}
	}
	switch {
	case failed == 0:
		return outs[0], nil
	case failed == len(p.ranks) && p.group != nil:
		// Every rank stopped before advancing its sequences: still in step.
		p.group.Reset()
		return nil, first
	}
	p.broken = fmt.Errorf("model: ranks out of step after a failed forward (%d of %d failed): %w", failed, len(p.ranks), first)
	return nil, p.broken
}
