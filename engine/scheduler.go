package engine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/megamoe/megamoe/kvcache"
)

// Cache is the part of kvcache.Manager the scheduler needs.
type Cache interface {
	NewSequence() *kvcache.Sequence
	Reserve(s *kvcache.Sequence, newLen int) error
	CapacityBytes() int64
	BytesFor(tokens int) int64
	Layout() kvcache.Layout
	// Prefix caching (no-ops when off): Match gives a new sequence the cached
	// prefix of its tokens, Commit offers its computed blocks to the cache.
	PrefixCaching() bool
	Match(s *kvcache.Sequence, tokens []int32, salt string) int
	Commit(s *kvcache.Sequence, tokens []int32)
	// Keep hands an ending sequence's partial last block and state slot to
	// the cache (before it is freed), so that a prompt extending its tokens
	// hits up to their end; KeepCopy keeps copies of them while it goes on.
	Keep(s *kvcache.Sequence, tokens []int32)
	KeepCopy(s *kvcache.Sequence, tokens []int32)
}

// SchedulerConfig bounds one step.
type SchedulerConfig struct {
	MaxNumSeqs     int // running sequences at most
	MaxBatchTokens int // tokens per step (prefill chunks + decode tokens)
	MaxModelLen    int // context length: prompt + generated
}

// Item is one sequence's share of a step: Tokens[Start:Start+N].
type Item struct {
	Seq    *Sequence
	Start  int
	N      int
	Sample bool // the chunk reaches the last known token: sample the next one
	// AllLogits: every row's logits are needed (prompt logprobs).
	AllLogits bool
}

// Tokens returns the item's token slice.
func (it *Item) Tokens() []int32 { return it.Seq.Tokens[it.Start : it.Start+it.N] }

// Result is the runner's outcome for one item.
type Result struct {
	Sampled Sampled // valid when the item was sampled
	Prompt  []Token // prompt logprobs covered by this chunk
	Err     error   // the sequence cannot continue (its grammar failed)
	spec    *specResult
}

// Scheduler decides, step by step, which tokens of which sequences run. It is
// FCFS: running sequences go first (decode tokens and unfinished prefill
// chunks, oldest first), then waiting sequences are admitted while the token
// budget, the sequence limit and the cache allow. When the cache cannot hold a
// running sequence's next tokens, the newest running sequence is preempted: its
// cache is freed and it returns to the head of the queue to be recomputed.
type Scheduler struct {
	cfg     SchedulerConfig
	cache   Cache
	free    func(*kvcache.Sequence)
	waiting []*Sequence
	running []*Sequence // admission order: newest last
	// Preemptions counts preemptions since creation.
	Preemptions int
	// PrefixQueries and PrefixHits count prompt tokens looked up in the
	// prefix cache and found there, at each request's first admission.
	PrefixQueries, PrefixHits int64
}

// NewScheduler creates a scheduler over cache; free releases a sequence's cache
// (the model's FreeSequence, which also drops backend state).
func NewScheduler(cfg SchedulerConfig, cache Cache, free func(*kvcache.Sequence)) (*Scheduler, error) {
	if cfg.MaxNumSeqs <= 0 || cfg.MaxBatchTokens <= 0 || cfg.MaxModelLen <= 0 {
		return nil, fmt.Errorf("scheduler: invalid config %+v", cfg)
	}
	return &Scheduler{cfg: cfg, cache: cache, free: free}, nil
}

// Add queues a sequence at the tail (FCFS).
func (s *Scheduler) Add(seq *Sequence) {
	seq.Status = Waiting
	s.waiting = append(s.waiting, seq)
	if toks := s.jumpForward(seq); len(toks) > 0 { // an output that starts forced
		seq.stream.push(Event{Tokens: toks})
	}
}

// NumWaiting and NumRunning report queue sizes.
func (s *Scheduler) NumWaiting() int { return len(s.waiting) }

// NumRunning is the number of admitted sequences.
func (s *Scheduler) NumRunning() int { return len(s.running) }

// HasWork reports whether a step would do anything.
func (s *Scheduler) HasWork() bool { return len(s.waiting)+len(s.running) > 0 }

// Schedule builds the next step's batch.
func (s *Scheduler) Schedule() []Item {
	budget := s.cfg.MaxBatchTokens
	var items []Item
	preempted := false
	for i := 0; i < len(s.running) && budget > 0; i++ {
		seq := s.running[i]
		n := s.chunk(seq, min(seq.Pending(), budget))
		if n <= 0 {
			continue
		}
		for s.cache.Reserve(seq.KV, seq.Computed+n) != nil {
			victim := s.running[len(s.running)-1]
			s.preempt(victim)
			preempted = true
			if victim == seq {
				n = 0
				break
			}
		}
		if n == 0 {
			break // seq itself was the newest: nothing after it is running
		}
		items = append(items, s.item(seq, n))
		budget -= n
	}
	for !preempted && budget > 0 && len(s.waiting) > 0 && len(s.running) < s.cfg.MaxNumSeqs {
		seq := s.waiting[0]
		kv := s.cache.NewSequence()
		hit := s.match(seq, kv)
		// Admit only when every known token fits, so a long prompt's later
		// chunks cannot run out of cache halfway through its prefill.
		if err := s.cache.Reserve(kv, len(seq.Tokens)); err != nil {
			s.free(kv)
			if len(s.running) == 0 {
				// Even an empty cache cannot hold it: fail instead of waiting forever.
				s.waiting = s.waiting[1:]
				s.finish(seq, FinishError, fmt.Errorf("sequence of %d tokens needs %d bytes of KV cache, capacity is %d: %w",
					len(seq.Tokens), s.cache.BytesFor(len(seq.Tokens)), s.cache.CapacityBytes(), err))
				continue
			}
			break
		}
		s.waiting = s.waiting[1:]
		seq.KV, seq.Computed, seq.Status = kv, hit, Running
		s.counted(seq, hit)
		s.running = append(s.running, seq)
		n := s.chunk(seq, min(seq.Pending(), budget))
		items = append(items, s.item(seq, n))
		budget -= n
	}
	return items
}

// match looks seq's tokens up in the prefix cache for its new cache
// sequence kv and returns the tokens kv now holds. Prompt logprobs need every
// prompt row computed: such a request takes no hit (its blocks still enter
// the cache).
func (s *Scheduler) match(seq *Sequence, kv *kvcache.Sequence) int {
	if !s.cache.PrefixCaching() {
		return 0
	}
	tokens := seq.Tokens
	if seq.Req.PromptLogprobs {
		tokens = nil
	}
	return s.cache.Match(kv, tokens, seq.Req.CacheSalt)
}

// counted records an admitted request's prefix cache lookup, once.
func (s *Scheduler) counted(seq *Sequence, hit int) {
	if seq.queried || !s.cache.PrefixCaching() {
		return
	}
	seq.queried = true
	s.PrefixQueries += int64(seq.NumPrompt)
	s.PrefixHits += int64(hit)
	seq.stream.setCached(hit)
}

// chunk trims a prefill chunk of n tokens so that it ends where the prefix
// cache keeps the state: on a block boundary, the first chunk of a
// sequence's first block at that block's end (so a short shared system
// prompt hits), later ones at the last boundary they cross; and at the
// request's reuse point (Request.ReuseAt). Decode steps (one token) reach
// every boundary anyway.
func (s *Scheduler) chunk(seq *Sequence, n int) int {
	if n <= 1 || !s.cache.PrefixCaching() {
		return n
	}
	bt := s.cache.Layout().BlockTokens
	start, end := seq.Computed, seq.Computed+n
	switch {
	case start < bt && end > bt:
		n = bt - start
	case end%bt == 0 || end/bt == start/bt: // ends on a boundary, or crosses none
	default:
		n = end/bt*bt - start
	}
	if r := seq.reuseAt(); start < r && r < start+n {
		n = r - start
	}
	return n
}

func (s *Scheduler) item(seq *Sequence, n int) Item {
	it := Item{Seq: seq, Start: seq.Computed, N: n, Sample: seq.Computed+n == len(seq.Tokens)}
	// Prompt logprobs are needed for rows predicting prompt tokens not yet sent.
	if seq.Req.PromptLogprobs && seq.promptLP < seq.NumPrompt-1 && it.Start < seq.NumPrompt-1 {
		it.AllLogits = true
	}
	return it
}

// preempt frees seq's cache and puts it at the head of the queue.
func (s *Scheduler) preempt(seq *Sequence) {
	s.running = slices.DeleteFunc(s.running, func(x *Sequence) bool { return x == seq })
	s.cache.Keep(seq.KV, seq.Tokens[:seq.Computed]) // its readmission hits up to here
	s.free(seq.KV)
	seq.KV, seq.Computed, seq.Status = nil, 0, Waiting
	seq.Preempted++
	s.Preemptions++
	s.waiting = slices.Insert(s.waiting, 0, seq)
}

// Postprocess records a step's results: advances the cache counts, appends
// sampled tokens, streams them, and retires finished sequences. A non-nil err
// (the forward pass failed) fails every sequence of the batch.
func (s *Scheduler) Postprocess(items []Item, results []Result, err error) {
	for i := range items {
		it := &items[i]
		seq := it.Seq
		if seq.Status != Running {
			continue // finished or preempted meanwhile
		}
		if err != nil {
			s.free(seq.KV) // its state may be half written: not for the cache
			seq.KV = nil
			s.finish(seq, FinishError, err)
			continue
		}
		seq.Computed += it.N
		s.cache.Commit(seq.KV, seq.Tokens[:seq.Computed])
		if seq.Computed == seq.reuseAt() {
			s.cache.KeepCopy(seq.KV, seq.Tokens[:seq.Computed])
		}
		r := results[i]
		var ev Event
		if len(r.Prompt) > 0 {
			ev.Prompt = r.Prompt
			seq.promptLP += len(r.Prompt)
		}
		if r.Err != nil {
			if len(ev.Prompt) > 0 {
				seq.stream.push(ev)
			}
			s.finish(seq, FinishError, r.Err)
			continue
		}
		if !it.Sample {
			if len(ev.Prompt) > 0 {
				seq.stream.push(ev)
			}
			continue
		}
		if r.spec != nil {
			s.postSpec(seq, r.spec, ev)
			continue
		}
		tok := r.Sampled
		seq.Tokens = append(seq.Tokens, tok.ID)
		seq.Sampler.Accept(tok.ID)
		ev.Tokens = []Token{{ID: tok.ID, Logprob: tok.Logprob, Top: tok.Top}}
		ended, gerr := seq.grammar.accept(tok.ID)
		switch {
		case gerr != nil:
			ev.Finish, ev.Err = FinishError, gerr
		case ended || slices.Contains(seq.Req.StopTokens, tok.ID):
			ev.Finish = FinishStop
		case seq.Generated() >= seq.Req.MaxTokens || len(seq.Tokens) >= s.cfg.MaxModelLen:
			ev.Finish = FinishLength
		default:
			ev.Tokens = append(ev.Tokens, s.jumpForward(seq)...) // grammar-forced tokens
		}
		if ev.Finish != FinishNone {
			s.retire(seq)
		}
		seq.stream.push(ev)
	}
}

// Cancel removes seq wherever it is and frees its cache.
func (s *Scheduler) Cancel(seq *Sequence, reason FinishReason, err error) {
	s.finish(seq, reason, err)
}

// Abort finishes every sequence (engine shutdown).
func (s *Scheduler) Abort(err error) {
	for len(s.running) > 0 {
		s.finish(s.running[0], FinishError, err)
	}
	for len(s.waiting) > 0 {
		s.finish(s.waiting[0], FinishError, err)
	}
}

func (s *Scheduler) finish(seq *Sequence, reason FinishReason, err error) {
	if seq.Status == Finished {
		return
	}
	s.retire(seq)
	seq.stream.push(Event{Finish: reason, Err: err})
}

// retire drops seq from both queues and frees its cache, whose end the
// prefix cache keeps unless it lies past the request's reuse point, where a
// follow-up stops repeating its tokens (that point was kept instead).
func (s *Scheduler) retire(seq *Sequence) {
	s.running = slices.DeleteFunc(s.running, func(x *Sequence) bool { return x == seq })
	s.waiting = slices.DeleteFunc(s.waiting, func(x *Sequence) bool { return x == seq })
	if seq.KV != nil {
		if r := seq.reuseAt(); r == 0 || seq.Computed <= r {
			s.cache.Keep(seq.KV, seq.Tokens[:seq.Computed])
		}
		s.free(seq.KV)
		seq.KV = nil
	}
	seq.Status = Finished
}

// errAborted is the error of sequences still queued at shutdown.
var errAborted = errors.New("engine stopped")
