package engine

import (
	"sync"
	"time"

	"github.com/megamoe/megamoe/kvcache"
)

// FinishReason says why a sequence stopped (OpenAI's finish_reason values).
type FinishReason string

const (
	FinishNone      FinishReason = ""
	FinishStop      FinishReason = "stop"   // a stop token (EOS)
	FinishLength    FinishReason = "length" // max_tokens or the context length
	FinishCancelled FinishReason = "cancelled"
	FinishError     FinishReason = "error"
)

// Request is one generation: a prompt and how to continue it.
type Request struct {
	Prompt     []int32
	Params     SamplingParams
	MaxTokens  int     // generated tokens at most (>0)
	StopTokens []int32 // ids that end the sequence (EOS); the stop token is reported but ends it
	// MinTokens masks StopTokens until this many tokens were generated
	// (vLLM's min_tokens; at most MaxTokens).
	MinTokens int
	// PromptLogprobs asks for the logprob and rank (and PromptTopLogprobs
	// alternatives) of every prompt token after the first.
	PromptLogprobs    bool
	PromptTopLogprobs int
	// Constraint, if set, restricts the output to a grammar.
	Constraint *Constraint
	// CacheSalt isolates the prefix cache: a request finds only blocks
	// computed by requests with the same salt.
	CacheSalt string
	// ReuseAt, when in (0, len(Prompt)), is where a follow-up request stops
	// repeating this one's tokens (a thinking chat's next turn renders the
	// generation prefix as history, differently): the prefix cache keeps the
	// state there, and not at the end, which no follow-up extends. 0: a
	// follow-up may extend all of the tokens.
	ReuseAt int
}

// Token is one generated (or, for prompt logprobs, one prompt) token.
type Token struct {
	ID      int32
	Logprob float32
	Top     []TokenLogprob
	Rank    int // prompt logprobs: 1 + the tokens more likely (ties count)
}

// Event is what a stream delivers: newly generated tokens, and at the end a
// finish reason (with Err for FinishError).
type Event struct {
	Prompt []Token // prompt logprobs (once, before the first generated token)
	Tokens []Token
	// Steps holds when each engine step that produced some of Tokens
	// delivered them (inter-token latency is measured per step).
	Steps  []time.Time
	Finish FinishReason
	Err    error
}

// Stream is the consumer side of one request. The engine never blocks on it:
// events queue in an unbounded mailbox until Next takes them.
type Stream struct {
	ID       int64
	Arrival  time.Time
	mu       sync.Mutex
	pending  []Event
	done     bool // final event queued
	signal   chan struct{}
	cancel   func(*Stream)
	canceled bool
	cached   int // prompt tokens found in the prefix cache
}

func newStream(id int64, cancel func(*Stream)) *Stream {
	return &Stream{ID: id, Arrival: time.Now(), signal: make(chan struct{}, 1), cancel: cancel}
}

// Ready is signalled when events may be waiting (use with Next).
func (st *Stream) Ready() <-chan struct{} { return st.signal }

// Next returns the queued events (merged), ok=false when none is queued yet.
func (st *Stream) Next() (ev Event, ok bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.pending) == 0 {
		return Event{}, false
	}
	for _, e := range st.pending {
		ev.Prompt = append(ev.Prompt, e.Prompt...)
		ev.Tokens = append(ev.Tokens, e.Tokens...)
		ev.Steps = append(ev.Steps, e.Steps...)
		if e.Finish != FinishNone {
			ev.Finish, ev.Err = e.Finish, e.Err
		}
	}
	st.pending = st.pending[:0]
	return ev, true
}

// CachedTokens is the number of prompt tokens taken from the prefix cache
// (set when the request is admitted, before its first event).
func (st *Stream) CachedTokens() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.cached
}

func (st *Stream) setCached(n int) {
	if st == nil {
		return
	}
	st.mu.Lock()
	st.cached = n
	st.mu.Unlock()
}

// Cancel asks the engine to stop the sequence and free its cache. Safe to call
// more than once and after the stream finished.
func (st *Stream) Cancel() {
	st.mu.Lock()
	if st.canceled || st.done {
		st.mu.Unlock()
		return
	}
	st.canceled = true
	st.mu.Unlock()
	st.cancel(st)
}

func (st *Stream) push(e Event) {
	st.mu.Lock()
	if st.done {
		st.mu.Unlock()
		return
	}
	if len(e.Tokens) > 0 && e.Steps == nil {
		e.Steps = []time.Time{time.Now()}
	}
	st.pending = append(st.pending, e)
	if e.Finish != FinishNone {
		st.done = true
	}
	st.mu.Unlock()
	select {
	case st.signal <- struct{}{}:
	default:
	}
}

// Status is where a sequence is in its life.
type Status int

const (
	Waiting Status = iota
	Running
	Finished
)

// Sequence is the engine's view of one request: all its tokens (prompt then
// generated), how many of them the cache holds, and its sampler.
type Sequence struct {
	ID        int64
	Status    Status
	Tokens    []int32 // prompt followed by generated tokens
	NumPrompt int
	Computed  int // tokens held by the cache
	KV        *kvcache.Sequence
	Req       *Request
	Sampler   *Sampler
	stream    *Stream
	promptLP  int // prompt positions whose logprobs were sent
	Preempted int // times it was preempted
	grammar   *constraintState
	spec      *specState // speculative decoding
	queried   bool       // counted in the prefix cache's queries
}

// Generated is the number of generated tokens.
func (s *Sequence) Generated() int { return len(s.Tokens) - s.NumPrompt }

// Pending is the number of tokens not yet in the cache.
func (s *Sequence) Pending() int { return len(s.Tokens) - s.Computed }

// reuseAt is Req.ReuseAt where it lies inside the prompt, else 0.
func (s *Sequence) reuseAt() int {
	if r := s.Req.ReuseAt; r > 0 && r < s.NumPrompt {
		return r
	}
	return 0
}
