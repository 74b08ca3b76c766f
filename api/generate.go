package api

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/tokenizer"
)

// delta is newly generated text, split into reasoning and answer, with the
// generated tokens it completes (their logprobs go into the same chunk).
type delta struct {
	reasoning, content string
	tokens             []engine.Token
	accepted           bool // the choice's sequence was queued (nothing else is set)
	keepAlive          bool // the choice still waits for its first token (nothing else is set)
}

// queueWait is a stream's wait for its n choices to be queued.
type queueWait struct{ n, accepted int }

// event handles d's queue events and reports whether d was one: the
// response starts once every choice is queued (a 429 is still possible
// before), and keep-alive comments go out only after it started.
func (q *queueWait) event(d delta, started bool, start func() error, w *sse) (bool, error) {
	switch {
	case d.accepted:
		if q.accepted++; q.accepted < q.n {
			return true, nil
		}
		return true, start()
	case d.keepAlive:
		if !started {
			return true, nil
		}
		return true, w.comment("keep-alive")
	}
	return false, nil
}

// result is a finished generation.
type result struct {
	text, reasoning string
	finish          string
	completion      int
	cached          int            // prompt tokens found in the prefix cache
	first, last     time.Time      // when the first and the latest generated tokens were produced
	tokens          []engine.Token // generated tokens (stop tokens excluded), with logprobs when asked
	prompt          []engine.Token // prompt logprobs, when asked
}

// choice is the spec of choice i of an n > 1 request: with a seed, choice i
// samples with seed+i (as vLLM does), so choices differ yet stay reproducible.
func (g *genSpec) choice(i int) *genSpec {
	c := *g
	if i > 0 {
		c.promptTop = nil // the prompt's logprobs are the same for every choice
	}
	if g.params.Seed != nil {
		seed := *g.params.Seed + uint64(i)
		c.params.Seed = &seed
	}
	return &c
}

// withSlot is g with its choices counted in slot.
func (g *genSpec) withSlot(slot *queueSlot) *genSpec {
	c := *g
	c.slot = slot
	return &c
}

// fanOut runs the g.n choices of g concurrently, each as its own engine
// sequence. Calls of emit and done (a choice finished) are serialized, since
// all choices share one response writer. The first failure cancels the other
// choices and is returned.
func (s *Server) fanOut(ctx context.Context, g *genSpec, emit func(int, delta) error, done func(int, *result) error) ([]*result, error) {
	slot, err := s.takeSlot(ctx, g.n)
	if err != nil {
		return nil, err
	}
	defer slot.release()
	g = g.withSlot(slot)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	results := make([]*result, g.n)
	for i := range g.n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.generate(ctx, g.choice(i), func(d delta) error {
				mu.Lock()
				defer mu.Unlock()
				if first != nil {
					return first
				}
				return emit(i, d)
			})
			mu.Lock()
			defer mu.Unlock()
			if err == nil && first == nil && done != nil {
				err = done(i, res)
			}
			if err != nil {
				if first == nil {
					first = err
					cancel()
				}
				return
			}
			results[i] = res
		}()
	}
	wg.Wait()
	return results, first
}

// generate runs g, calling emit with each new piece of text (stop strings and
// partial UTF-8 held back, cut at token boundaries), and returns the whole
// output. ctx ending cancels the sequence.
func (s *Server) generate(ctx context.Context, g *genSpec, emit func(delta) error) (*result, error) {
	req := &engine.Request{Prompt: g.prompt, Params: g.params, MaxTokens: g.maxTokens, MinTokens: g.minTokens, StopTokens: g.stopIDs,
		Constraint: g.constraint, CacheSalt: g.cacheSalt, ReuseAt: g.reuseAt}
	if g.promptTop != nil {
		req.PromptLogprobs, req.PromptTopLogprobs = true, *g.promptTop
	}
	st, err := s.eng.Submit(req)
	switch {
	case errors.Is(err, engine.ErrQueueFull):
		return nil, errorf(http.StatusTooManyRequests, "", "queue_full", "the server is busy; retry later")
	case errors.Is(err, engine.ErrStopped):
		return nil, errorf(http.StatusServiceUnavailable, "", "shutting_down", "the server is shutting down")
	case err != nil:
		return nil, errorf(http.StatusBadRequest, "", "", "%v", err)
	}
	defer st.Cancel() // no-op once finished
	if err := emit(delta{accepted: true}); err != nil {
		return nil, err
	}
	var keepAlive <-chan time.Time
	if s.cfg.KeepAlive > 0 {
		tick := time.NewTicker(s.cfg.KeepAlive)
		defer tick.Stop()
		keepAlive = tick.C
	}
	start := time.Now()
	dec := tokenizer.NewStreamDecoder(s.tok, g.stops)
	dec.MinTokens(g.minTokens)
	split := thinkSplit{thinking: g.thinking, reasoning: g.thinking}
	if g.thinking {
		dec.Hold(tokenizer.ThinkClose)
	}
	if g.withStop {
		dec.IncludeStop()
	}
	if !g.special {
		var keep []int
		for _, k := range g.keep {
			if id, ok := s.tok.TokenID(k); ok {
				keep = append(keep, id)
			}
		}
		dec.SkipSpecial(keep...)
	}
	var text, reasoning strings.Builder
	sentT := 0     // tokens already emitted
	began := false // a token (or the end) came: the choice no longer waits
	res := &result{}
	defer s.met.finish(start, len(g.prompt), res)
	// send emits piece, the decoder's newly released text (all tokens ride
	// along when final).
	send := func(piece string, final bool) error {
		r, c := split.add(piece, final)
		reasoning.WriteString(r)
		text.WriteString(c)
		res.reasoning, res.text = reasoning.String(), text.String()
		d := delta{reasoning: r, content: c}
		n := len(res.tokens)
		if !final {
			n = dec.Emitted()
		}
		if n > sentT {
			d.tokens = res.tokens[sentT:n:n]
			sentT = n
		}
		if d.reasoning == "" && d.content == "" && len(d.tokens) == 0 {
			return nil
		}
		return emit(d)
	}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-keepAlive:
			if res.completion == 0 {
				if err := emit(delta{keepAlive: true}); err != nil {
					return nil, err
				}
			}
			continue
		case <-st.Ready():
		}
		for {
			ev, ok := st.Next()
			if !ok {
				break
			}
			res.cached = st.CachedTokens() // set at admission, before any event
			if !began && (len(ev.Tokens) > 0 || ev.Finish != engine.FinishNone) {
				began = true
				g.slot.started()
			}
			res.prompt = append(res.prompt, ev.Prompt...)
			s.met.steps(res, ev.Steps)
			var piece strings.Builder
			stopped := false
			for _, t := range ev.Tokens {
				res.completion++
				if !slices.Contains(g.stopIDs, t.ID) {
					res.tokens = append(res.tokens, t)
					p, hit := dec.Push(int(t.ID))
					piece.WriteString(p)
					stopped = stopped || hit
				}
			}
			if stopped {
				st.Cancel()
				res.finish = "stop"
				return res, send(piece.String(), true)
			}
			switch ev.Finish {
			case engine.FinishNone:
				if err := send(piece.String(), false); err != nil {
					return nil, err
				}
				continue
			case engine.FinishStop, engine.FinishLength:
				rest, hit := dec.Finish()
				res.finish = string(ev.Finish)
				if hit {
					res.finish = "stop"
				}
				return res, send(piece.String()+rest, true)
			case engine.FinishError:
				// The cause names engine internals: the log has it, the client a summary.
				s.log.Error("generation failed", "err", ev.Err, "prompt_tokens", len(g.prompt), "generated", res.completion)
				return nil, errorf(http.StatusInternalServerError, "", "", "generation failed after %d tokens; the server log has the cause", res.completion)
			default:
				return nil, errorf(http.StatusInternalServerError, "", "", "generation %s", ev.Finish)
			}
		}
	}
}

// thinkSplit splits streamed text at </think> into reasoning and answer,
// holding back a tail that may be the marker's start; the answer's leading
// newlines are dropped.
type thinkSplit struct {
	thinking  bool   // the request thinks: text starts as reasoning
	reasoning bool   // still before </think>
	held      string // a possible start of </think>
	trimmed   bool   // the answer's leading newlines are gone
}

func (t *thinkSplit) add(s string, final bool) (reasoning, content string) {
	if t.reasoning {
		s = t.held + s
		t.held = ""
		i := strings.Index(s, tokenizer.ThinkClose)
		if i < 0 {
			if k := heldPrefix(s, tokenizer.ThinkClose); !final && k > 0 {
				s, t.held = s[:len(s)-k], s[len(s)-k:]
			}
			return s, ""
		}
		t.reasoning = false
		reasoning, s = s[:i], s[i+len(tokenizer.ThinkClose):]
	}
	if t.thinking && !t.trimmed {
		s = strings.TrimLeft(s, "\n")
		t.trimmed = s != ""
	}
	return reasoning, s
}

// heldPrefix is the length of the longest suffix of s that is a proper prefix of marker.
func heldPrefix(s, marker string) int {
	for k := min(len(marker)-1, len(s)); k > 0; k-- {
		if s[len(s)-k:] == marker[:k] {
			return k
		}
	}
	return 0
}

// shutdownError is the cause of a request context ended by Config.Shutdown.
type shutdownError struct{}

func (shutdownError) Error() string { return "the server is shutting down" }

// requestContext is c's request context, also ended (with cause
// shutdownError) when Config.Shutdown is.
func (s *Server) requestContext(c *gin.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(c.Request.Context())
	if s.cfg.Shutdown == nil {
		return ctx, func() { cancel(nil) }
	}
	stop := context.AfterFunc(s.cfg.Shutdown, func() { cancel(shutdownError{}) })
	return ctx, func() { stop(); cancel(nil) }
}

// failure is what to tell the client about err, a failure of a request
// running under ctx: nil when the client went away (no one to tell).
func failure(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if errors.As(context.Cause(ctx), new(shutdownError)) {
		return errorf(http.StatusServiceUnavailable, "", "shutting_down", "the server is shutting down")
	}
	return nil
}
