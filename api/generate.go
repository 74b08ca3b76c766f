package api

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/megamoe/megamoe/engine"
)

// delta is newly generated text, split into reasoning and answer, with the
// generated tokens it completes (their logprobs go into the same chunk).
type delta struct {
	reasoning, content string
	tokens             []engine.Token
}

// result is a finished generation.
type result struct {
	text, reasoning string
	finish          string
	completion      int
	first           time.Time      // arrival of the first generated token
	tokens          []engine.Token // generated tokens (stop tokens excluded), with logprobs when asked
}

// choice is the spec of choice i of an n > 1 request: with a seed, choice i
// samples with seed+i (as vLLM does), so choices differ yet stay reproducible.
func (g *genSpec) choice(i int) *genSpec {
	c := *g
	if g.params.Seed != nil {
		seed := *g.params.Seed + uint64(i)
		c.params.Seed = &seed
	}
	return &c
}

// fanOut runs the g.n choices of g concurrently, each as its own engine
// sequence. Calls of emit and done (a choice finished) are serialized, since
// all choices share one response writer. The first failure cancels the other
// choices and is returned.
func (s *Server) fanOut(ctx context.Context, g *genSpec, emit func(int, delta) error, done func(int, *result) error) ([]*result, error) {
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
	st, err := s.eng.Submit(&engine.Request{Prompt: g.prompt, Params: g.params, MaxTokens: g.maxTokens, StopTokens: s.cfg.StopTokens})
	switch {
	case errors.Is(err, engine.ErrQueueFull):
		return nil, errorf(http.StatusTooManyRequests, "", "queue_full", "the server is busy; retry later")
	case errors.Is(err, engine.ErrStopped):
		return nil, errorf(http.StatusServiceUnavailable, "", "shutting_down", "the server is shutting down")
	case err != nil:
		return nil, errorf(http.StatusBadRequest, "", "", "%v", err)
	}
	defer st.Cancel() // no-op once finished
	start := time.Now()
	hold := 0
	for _, stop := range g.stops {
		hold = max(hold, len(stop)-1)
	}
	if g.thinking {
		hold = max(hold, len(tokEndThink)-1)
	}
	var ids []int
	var ends []int       // byte end of each of res.tokens in the decoded text
	var sentR, sentC int // bytes of reasoning/content already emitted
	sentT := 0           // tokens already emitted
	res := &result{}
	defer s.met.finish(start, len(g.prompt), res)
	// flush emits what is safe of text (everything when final).
	flush := func(text string, final bool) error {
		safe := len(text)
		if !final {
			safe = safePrefix(text, ends, max(0, len(text)-hold))
		}
		reasoning, content := "", text[:safe]
		if g.thinking {
			if i := strings.Index(content, tokEndThink); i >= 0 {
				reasoning, content = content[:i], strings.TrimLeft(content[i+len(tokEndThink):], "\n")
			} else {
				reasoning, content = content, "" // still thinking (or never closed its thought)
			}
		}
		res.reasoning, res.text = reasoning, content
		d := delta{}
		if len(reasoning) > sentR {
			d.reasoning = reasoning[sentR:]
			sentR = len(reasoning)
		}
		if len(content) > sentC {
			d.content = content[sentC:]
			sentC = len(content)
		}
		n := len(res.tokens)
		if !final {
			n = sort.SearchInts(ends, safe+1) // the tokens ending within text[:safe]
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
		case <-st.Ready():
		}
		for {
			ev, ok := st.Next()
			if !ok {
				break
			}
			for _, t := range ev.Tokens {
				if res.completion == 0 {
					res.first = time.Now()
				}
				res.completion++
				if !s.isStop(t.ID) {
					res.tokens = append(res.tokens, t)
					ids = append(ids, int(t.ID))
					prev := 0
					if len(ends) > 0 {
						prev = ends[len(ends)-1]
					}
					ends = append(ends, prev+len(s.tok.Decode([]int{int(t.ID)}))) // Decode concatenates token bytes
				}
			}
			text := s.tok.Decode(ids)
			if i := indexStop(text, g.stops); i >= 0 {
				st.Cancel()
				res.finish = "stop"
				return res, flush(text[:i], true)
			}
			switch ev.Finish {
			case engine.FinishNone:
				if err := flush(text, false); err != nil {
					return nil, err
				}
				continue
			case engine.FinishStop, engine.FinishLength:
				res.finish = string(ev.Finish)
				return res, flush(text, true)
			case engine.FinishError:
				return nil, errorf(http.StatusInternalServerError, "", "", "generation failed: %v", ev.Err)
			default:
				return nil, errorf(http.StatusInternalServerError, "", "", "generation %s", ev.Finish)
			}
		}
	}
}

// safePrefix is the longest prefix of text, at most limit bytes, that ends on
// a token boundary (ends: the tokens' end offsets) and does not cut a
// multi-byte character. Cutting at token ends makes each streamed chunk the
// text of exactly the tokens whose logprobs it carries.
func safePrefix(text string, ends []int, limit int) int {
	safe := limit
	for {
		if k := sort.SearchInts(ends, safe+1); k > 0 {
			safe = ends[k-1]
		} else {
			safe = 0
		}
		cut := safe - incompleteTail(text[:safe])
		if cut == safe {
			return safe
		}
		safe = cut
	}
}

// incompleteTail is the length of a trailing multi-byte character that is
// still missing bytes (0 when s ends on a whole character or on invalid bytes,
// which no later byte can complete).
func incompleteTail(s string) int {
	for p := len(s) - 1; p >= max(0, len(s)-(utf8.UTFMax-1)); p-- {
		if utf8.RuneStart(s[p]) {
			if !utf8.FullRuneInString(s[p:]) {
				return len(s) - p
			}
			return 0
		}
	}
	return 0
}

func (s *Server) isStop(id int32) bool {
	for _, t := range s.cfg.StopTokens {
		if t == id {
			return true
		}
	}
	return false
}

// indexStop is the first position where any stop string occurs, or -1.
func indexStop(text string, stops []string) int {
	best := -1
	for _, st := range stops {
		if i := strings.Index(text, st); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	return best
}
