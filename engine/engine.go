// Package engine serves generation requests on one model: a Scheduler picks
// each step's tokens (continuous batching, chunked prefill, preemption), the
// Runner runs the model and samples, and tokens stream back per request. One
// goroutine (Run) owns the model and its cache; everything else talks to it
// through Submit and Stream.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/kvcache"
	"golang.org/x/sync/errgroup"
)

// ErrQueueFull is returned by Submit when the waiting queue is at its bound.
var ErrQueueFull = errors.New("engine: request queue full")

// ErrStopped is returned by Submit after Run returned.
var ErrStopped = errors.New("engine: stopped")

// ForwardItem is one sequence's tokens for one forward pass; they continue the
// sequence at position Seq.Len().
type ForwardItem struct {
	Seq       *kvcache.Sequence
	Tokens    []int32
	AllLogits bool
	// Draw asks a DrawingModel for the next token drawn where the logits
	// are (see model.BatchItem.Draw).
	Draw *backend.Draw
	// DrawRows asks a verifying model for every row's greedy token drawn on
	// its device (model.BatchItem.DrawRows).
	DrawRows bool
}

// Model is what the engine needs from a model: a batched forward pass that
// returns, per item, the logits row of its last token (len Vocab) or, with
// AllLogits, all rows concatenated (len(Tokens)·Vocab).
type Model interface {
	Forward(items []ForwardItem) ([][]float32, error)
	FreeSequence(*kvcache.Sequence)
	Cache() *kvcache.Manager
	Vocab() int
}

// DrawingModel is a Model that can also draw tokens on its device: ForwardDraw
// returns, besides the logits (nil for a drawn item without AllLogits), the
// drawn token of every item with Draw set (-1 for the others; ids is nil
// when none was drawn). The engine uses it when CanDraw.
type DrawingModel interface {
	Model
	CanDraw() bool
	ForwardDraw(items []ForwardItem) (logits [][]float32, ids []int32, err error)
}

// Config sizes the engine.
type Config struct {
	MaxNumSeqs     int // running sequences (default 64)
	MaxBatchTokens int // tokens per step (default 512)
	MaxModelLen    int // context length (required)
	MaxQueue       int // waiting requests before ErrQueueFull (default 1024)
	// DeviceSampling draws the tokens of requests without logprobs,
	// penalties or logit bias on the model's device where it can
	// (DrawingModel); the others, and all without it, are sampled here.
	DeviceSampling bool
	// Speculative drafts tokens with the checkpoint's MTP block or DSpark
	// drafter and verifies them in the decode steps (SpecConfig.Enabled).
	Speculative SpecConfig
	// PrefixCaching reuses the cache of prompt prefixes computed before
	// (off where the model cannot: it is then cleared in Config()).
	PrefixCaching bool
	Logger        *slog.Logger
}

// Stats is a snapshot for metrics.
type Stats struct {
	Waiting, Running int
	CacheUsed        int64
	CacheCapacity    int64
	CacheCached      int64 // held only by the prefix cache, reclaimed on demand
	Preemptions      int
	Spec             SpecStats // with Config.Speculative
	// PrefixQueries and PrefixHits are prompt tokens looked up in the prefix
	// cache and found there.
	PrefixQueries, PrefixHits int64
}

// Engine is the serving loop around one model.
type Engine struct {
	cfg    Config
	model  Model
	sched  *Scheduler
	runner *Runner
	log    *slog.Logger

	mu      sync.Mutex
	inbox   []*Sequence
	cancels []*Stream
	queued  int // waiting in inbox + scheduler
	stats   Stats
	stopped bool
	nextID  int64
	wake    chan struct{}
	byID    map[int64]*Sequence // engine goroutine only
}

// New creates an engine; call Run to start it.
func New(m Model, cfg Config) (*Engine, error) {
	if cfg.MaxNumSeqs <= 0 {
		cfg.MaxNumSeqs = 64
	}
	if cfg.MaxBatchTokens <= 0 {
		cfg.MaxBatchTokens = 512
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.PrefixCaching {
		if err := m.Cache().EnablePrefixCaching(); err != nil {
			cfg.Logger.Warn("prefix caching off", "err", err)
			cfg.PrefixCaching = false
		}
	}
	sched, err := NewScheduler(SchedulerConfig{MaxNumSeqs: cfg.MaxNumSeqs, MaxBatchTokens: cfg.MaxBatchTokens,
		MaxModelLen: cfg.MaxModelLen}, m.Cache(), m.FreeSequence)
	if err != nil {
		return nil, err
	}
	// A sequence never outgrows MaxModelLen and the oldest running one is
	// never preempted, so a cache that holds one such sequence lets every
	// request finish: the others wait or are recomputed, none fails.
	if fit := m.Cache().MaxTokens(1); fit < cfg.MaxModelLen {
		return nil, fmt.Errorf("engine: a KV cache of %d bytes holds one sequence of at most %d tokens, less than the context length %d",
			m.Cache().CapacityBytes(), fit, cfg.MaxModelLen)
	}
	runner := newRunner(m, cfg.DeviceSampling)
	if cfg.Speculative.Enabled() {
		if runner.spec, err = newSpeculator(m, cfg.Speculative, cfg); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		runner.spec.drawer = newRowDrawer(runner.spec.m, cfg)
	}
	return &Engine{cfg: cfg, model: m, sched: sched, runner: runner, log: cfg.Logger,
		wake: make(chan struct{}, 1), byID: map[int64]*Sequence{},
		stats: Stats{CacheCapacity: m.Cache().CapacityBytes()}}, nil
}

// Config returns the effective configuration.
func (e *Engine) Config() Config { return e.cfg }

// Vocab is the model's vocabulary size.
func (e *Engine) Vocab() int { return e.model.Vocab() }

// Cache is the model's cache manager (read-only use: sizes, accounting).
func (e *Engine) Cache() *kvcache.Manager { return e.model.Cache() }

// Submit queues a request. The returned stream delivers its tokens.
func (e *Engine) Submit(req *Request) (*Stream, error) {
	if len(req.Prompt) == 0 {
		return nil, errors.New("engine: empty prompt")
	}
	if len(req.Prompt) >= e.cfg.MaxModelLen {
		return nil, fmt.Errorf("engine: prompt of %d tokens leaves no room in a context of %d", len(req.Prompt), e.cfg.MaxModelLen)
	}
	if req.MaxTokens <= 0 {
		return nil, fmt.Errorf("engine: max tokens %d must be positive", req.MaxTokens)
	}
	if req.MinTokens < 0 || req.MinTokens > req.MaxTokens {
		return nil, fmt.Errorf("engine: min tokens %d outside [0, max tokens %d]", req.MinTokens, req.MaxTokens)
	}
	if req.ReuseAt < 0 || req.ReuseAt > len(req.Prompt) {
		return nil, fmt.Errorf("engine: reuse point %d outside [0, prompt length %d]", req.ReuseAt, len(req.Prompt))
	}
	if req.PromptTopLogprobs < 0 || req.PromptTopLogprobs > MaxTopLogprobs {
		return nil, fmt.Errorf("engine: prompt top logprobs %d outside [0, %d]", req.PromptTopLogprobs, MaxTopLogprobs)
	}
	if err := req.Params.Validate(e.model.Vocab()); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	for _, t := range req.Prompt {
		if t < 0 || int(t) >= e.model.Vocab() {
			return nil, fmt.Errorf("engine: prompt token %d outside the vocabulary [0, %d)", t, e.model.Vocab())
		}
	}
	var cs *constraintState
	if req.Constraint != nil {
		var err error
		if cs, err = newConstraintState(req.Constraint, e.model.Vocab()); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return nil, ErrStopped
	}
	if e.queued >= e.cfg.MaxQueue {
		return nil, ErrQueueFull
	}
	e.nextID++
	st := newStream(e.nextID, e.cancel)
	seq := &Sequence{ID: e.nextID, Tokens: append([]int32(nil), req.Prompt...), NumPrompt: len(req.Prompt),
		Req: req, Sampler: NewSampler(req.Params, req.Prompt), stream: st, grammar: cs}
	seq.Sampler.holdStops(req.StopTokens, req.MinTokens)
	e.inbox = append(e.inbox, seq)
	e.queued++
	e.signal()
	return st, nil
}

func (e *Engine) cancel(st *Stream) {
	e.mu.Lock()
	e.cancels = append(e.cancels, st)
	e.mu.Unlock()
	e.signal()
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Stats returns the state after the last step.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.CacheUsed = e.model.Cache().UsedBytes()
	s.CacheCached = e.model.Cache().CachedBytes()
	return s
}

// Run is the engine goroutine: it steps while there is work and sleeps
// otherwise. When ctx ends it fails what is still queued or running and returns.
func (e *Engine) Run(ctx context.Context) error {
	defer func() {
		e.mu.Lock()
		e.stopped = true
		e.mu.Unlock()
		e.absorb()
		e.sched.Abort(errAborted)
		e.publish()
	}()
	for {
		e.absorb()
		e.publish()
		if !e.sched.HasWork() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-e.wake:
				continue
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		e.step()
	}
}

// step is one iteration: schedule, run the model and sample, record.
func (e *Engine) step() {
	batch := e.sched.Schedule()
	results, err := e.runner.Run(batch)
	e.sched.Postprocess(batch, results, err)
	if err != nil {
		e.log.Error("forward failed", "sequences", len(batch), "err", err)
	}
}

// absorb moves submitted requests into the scheduler and applies cancels.
func (e *Engine) absorb() {
	e.mu.Lock()
	inbox, cancels := e.inbox, e.cancels
	e.inbox, e.cancels = nil, nil
	e.mu.Unlock()
	for _, seq := range inbox {
		e.byID[seq.ID] = seq
		e.sched.Add(seq)
	}
	for _, st := range cancels {
		if seq := e.byID[st.ID]; seq != nil {
			e.sched.Cancel(seq, FinishCancelled, nil)
		}
	}
	for id, seq := range e.byID {
		if seq.Status == Finished {
			delete(e.byID, id)
		}
	}
}

// publish refreshes the counters Submit and Stats read.
func (e *Engine) publish() {
	e.mu.Lock()
	e.queued = len(e.inbox) + e.sched.NumWaiting()
	e.stats.Waiting = e.queued
	e.stats.Running = e.sched.NumRunning()
	e.stats.Preemptions = e.sched.Preemptions
	if sp := e.runner.spec; sp != nil {
		e.stats.Spec = sp.stats
		e.stats.Spec.PerPos = slices.Clone(sp.stats.PerPos)
	}
	e.stats.PrefixQueries, e.stats.PrefixHits = e.sched.PrefixQueries, e.sched.PrefixHits
	e.mu.Unlock()
}

// Runner runs one batch through the model and samples the sequences that
// reached their last known token: on the model's device where it can draw and
// the request needs no host-side processing (Sampler.DeviceDraw), else here.
type Runner struct {
	model  Model
	drawer DrawingModel // nil: sample on the host
	spec   *speculator  // nil: no drafts
}

func newRunner(m Model, draw bool) *Runner {
	r := &Runner{model: m}
	if d, ok := m.(DrawingModel); ok && draw && d.CanDraw() {
		r.drawer = d
	}
	return r
}

// Run executes the forward pass of items and samples.
func (r *Runner) Run(items []Item) ([]Result, error) {
	if len(items) == 0 {
		return nil, nil
	}
	if r.spec != nil {
		return r.spec.run(items)
	}
	fwd := make([]ForwardItem, len(items))
	drawing := false
	for i := range items {
		it := &items[i]
		fwd[i] = ForwardItem{Seq: it.Seq.KV, Tokens: it.Tokens(), AllLogits: it.AllLogits}
		if r.drawer != nil && it.Sample {
			if d, ok := deviceDraw(it.Seq); ok {
				fwd[i].Draw, drawing = &d, true
			}
		}
	}
	var (
		logits [][]float32
		drawn  []int32
		err    error
	)
	if drawing {
		logits, drawn, err = r.drawer.ForwardDraw(fwd)
	} else {
		logits, err = r.model.Forward(fwd)
	}
	if err != nil {
		return nil, err
	}
	if len(logits) != len(items) {
		return nil, fmt.Errorf("engine: model returned %d logits rows for %d items", len(logits), len(items))
	}
	if drawn != nil && len(drawn) != len(items) {
		return nil, fmt.Errorf("engine: model drew %d tokens for %d items", len(drawn), len(items))
	}
	vocab := r.model.Vocab()
	res := make([]Result, len(items))
	for i := range items {
		want := vocab
		if items[i].AllLogits {
			want = items[i].N * vocab
		}
		if fwd[i].Draw != nil {
			if drawn == nil || drawn[i] < 0 || int(drawn[i]) >= vocab {
				return nil, fmt.Errorf("engine: item %d: drawn token %v outside the vocabulary", i, drawnAt(drawn, i))
			}
			res[i].Sampled = Sampled{ID: drawn[i]}
			if !items[i].AllLogits {
				continue
			}
		}
		if len(logits[i]) != want {
			return nil, fmt.Errorf("engine: item %d: %d logits, want %d", i, len(logits[i]), want)
		}
	}
	// Each item is its own sequence with its own sampler and RNG: sampling
	// them in parallel gives the same tokens (the host sampler costs ~1-2 ms
	// a token over a 129k vocabulary, more than a GPU decode step's share).
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i := range items {
		it, rows := &items[i], logits[i]
		if !it.AllLogits && (!it.Sample || fwd[i].Draw != nil) {
			continue
		}
		g.Go(func() error {
			sampleHost(it, rows, vocab, fwd[i].Draw == nil, &res[i])
			return nil
		})
	}
	_ = g.Wait() // the workers return no errors
	return res, nil
}

// sampleHost scores the prompt rows of it and, with sample, draws its next
// token from the last row on the host.
func sampleHost(it *Item, rows []float32, vocab int, sample bool, res *Result) {
	if it.AllLogits {
		res.Prompt = promptLogprobs(it, rows, vocab)
	}
	if it.Sample && sample {
		masked, err := it.Seq.grammar.fill()
		if err != nil {
			res.Err = err
			return
		}
		var mask []uint32
		if masked {
			mask = it.Seq.grammar.mask
		}
		res.Sampled = it.Seq.Sampler.SampleMasked(rows[len(rows)-vocab:], mask)
	}
}

// promptLogprobs scores the prompt tokens that the chunk's rows predict and
// that were not sent before (a recomputed sequence does not resend them).
func promptLogprobs(it *Item, rows []float32, vocab int) []Token {
	seq := it.Seq
	k := seq.Req.PromptTopLogprobs
	var out []Token
	for j := range it.N {
		p := it.Start + j + 1 // the token row j predicts
		if p >= seq.NumPrompt {
			break
		}
		if p <= seq.promptLP {
			continue
		}
		row := rows[j*vocab : (j+1)*vocab]
		id := seq.Tokens[p]
		lse := logsumexp(row)
		tok := Token{ID: id, Logprob: logprobLSE(row, id, lse), Rank: rankOf(row, id)}
		if k > 0 {
			tok.Top = topLogprobsLSE(row, k, lse)
		}
		out = append(out, tok)
	}
	return out
}

// drawnAt is drawn[i], or "none" when the model drew nothing.
func drawnAt(drawn []int32, i int) any {
	if drawn == nil {
		return "none"
	}
	return drawn[i]
}
