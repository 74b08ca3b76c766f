// Package api serves the engine over an OpenAI-compatible HTTP API (chat
// completions, completions, models, health) with gin.
package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/tokenizer"
	"github.com/prometheus/client_golang/prometheus"
)

// MaxBodyBytes bounds a request body (413 beyond).
const MaxBodyBytes = 4 << 20

// Config configures the server.
type Config struct {
	ModelName string // served model id (default "megamoe")
	// Aliases are further ids the model answers to (vLLM's several
	// --served-model-name values); responses name ModelName.
	Aliases []string
	// AllowedOrigins are the CORS origins allowed to call the API ("*": any);
	// none sends no CORS headers.
	AllowedOrigins []string
	APIKey         string  // when set, /v1/* require "Authorization: Bearer <key>"
	Version        string  // reported by /version
	StopTokens     []int32 // ids that end generation (default: the tokenizer's end-of-sentence)
	// WriteIdleTimeout bounds each write of a completion response (0: none).
	// A stream's deadline moves on with every event, so a long stream lives
	// on while a client that stops reading is dropped.
	WriteIdleTimeout time.Duration
	// MaxQueuedPerConn bounds the requests of one client connection (an
	// HTTP/2 connection carries many) that wait for their first token, queued
	// or in prefill; over it a 429 (0: no bound). It needs ConnContext as the
	// http.Server's ConnContext.
	MaxQueuedPerConn int
	// KeepAlive is how often a stream waiting for its first token (queued or
	// prefilling) gets an SSE comment line (0: never).
	KeepAlive time.Duration
	// Shutdown ending ends the requests in flight at once: streams with an
	// error event, others with a 503.
	Shutdown context.Context
	Logger   *slog.Logger
	// Collectors are further series on /metrics (the GPUs' gauges).
	Collectors []prometheus.Collector
}

// Server holds the handlers' shared state.
type Server struct {
	eng     *engine.Engine
	tok     *tokenizer.Tokenizer
	cfg     Config
	maxLen  int
	created int64
	log     *slog.Logger
	met     *metrics
	quoter  *strings.Replacer // quotes special-token strings in user text
	// grammars compiles structured-output constraints (cached) and holds the token table.
	grammars *grammars
}

// New returns the HTTP handler serving eng with tok.
func New(eng *engine.Engine, tok *tokenizer.Tokenizer, cfg Config) http.Handler {
	if cfg.ModelName == "" {
		cfg.ModelName = "megamoe"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.StopTokens) == 0 {
		if id, ok := tok.TokenID(tokenizer.EOS); ok {
			cfg.StopTokens = []int32{int32(id)}
		}
	}
	s := &Server{eng: eng, tok: tok, cfg: cfg, maxLen: eng.Config().MaxModelLen, created: time.Now().Unix(), log: cfg.Logger, met: newMetrics(eng, cfg.ModelName)}
	s.met.reg.MustRegister(cfg.Collectors...)
	s.quoter = newQuoter(tok)
	s.grammars = newGrammars(tok, eng.Vocab(), cfg.StopTokens)
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.NoRoute(func(c *gin.Context) {
		writeError(c, errorf(http.StatusNotFound, "", "not_found", "no route %s %s", c.Request.Method, c.Request.URL.Path))
	})
	r.NoMethod(func(c *gin.Context) {
		writeError(c, errorf(http.StatusMethodNotAllowed, "", "method_not_allowed", "%s is not allowed on %s", c.Request.Method, c.Request.URL.Path))
	})
	r.Use(requestID, clearWriteDeadline, gin.Recovery(), s.cors, s.accessLog, s.met.count)
	page, err := chatPage()
	if err != nil {
		panic(err) // the embedded page is fixed at build time; TestChatPage covers it
	}
	r.GET("/", page)
	r.HEAD("/", page)
	r.GET("/health", s.health)
	r.GET("/metrics", s.met.handler())
	r.GET("/version", s.version)
	r.POST("/tokenize", s.auth, s.tokenize)
	r.POST("/detokenize", s.auth, s.detokenize)
	v1 := r.Group("/v1", s.auth)
	v1.GET("/models", s.models)
	v1.GET("/models/*id", s.model)
	v1.POST("/chat/completions", s.chat)
	v1.POST("/completions", s.completions)
	return r
}

// apiError is an OpenAI-shaped error with its HTTP status.
type apiError struct {
	status  int
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func errorf(status int, param, code, format string, args ...any) *apiError {
	e := &apiError{status: status, Message: fmt.Sprintf(format, args...), Type: "invalid_request_error"}
	if status >= 500 {
		e.Type = "server_error"
	}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

func writeError(c *gin.Context, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = errorf(http.StatusInternalServerError, "", "", "%v", err)
	}
	if ae.status == http.StatusTooManyRequests {
		c.Header("Retry-After", "1") // the queue moves on within a step or so
	}
	c.AbortWithStatusJSON(ae.status, gin.H{"error": ae})
}

func (s *Server) auth(c *gin.Context) {
	if s.cfg.APIKey == "" {
		return
	}
	h := c.GetHeader("Authorization")
	const scheme = "bearer "
	ok := len(h) > len(scheme) && strings.EqualFold(h[:len(scheme)], scheme) &&
		subtle.ConstantTimeCompare([]byte(strings.TrimSpace(h[len(scheme):])), []byte(s.cfg.APIKey)) == 1
	if !ok {
		writeError(c, errorf(http.StatusUnauthorized, "", "invalid_api_key", "invalid or missing API key"))
	}
}

// requestID takes the client's X-Request-Id (or makes one), echoes it and
// keeps it for the log.
func requestID(c *gin.Context) {
	id := c.GetHeader("X-Request-Id")
	if id == "" || len(id) > 200 {
		id = newID("")
	}
	c.Set("request_id", id)
	c.Header("X-Request-Id", id)
}

// cors answers the allowed origins' requests and preflights.
func (s *Server) cors(c *gin.Context) {
	origin := c.GetHeader("Origin")
	if origin == "" || !slices.ContainsFunc(s.cfg.AllowedOrigins, func(o string) bool { return o == "*" || o == origin }) {
		return
	}
	h := c.Writer.Header()
	h.Set("Access-Control-Allow-Origin", origin)
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Expose-Headers", "X-Request-Id")
	if c.Request.Method == http.MethodOptions && c.GetHeader("Access-Control-Request-Method") != "" {
		h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id")
		h.Set("Access-Control-Max-Age", "600")
		c.AbortWithStatus(http.StatusNoContent)
	}
}

// clearWriteDeadline drops a deadline an earlier request on the connection
// left, so only the completion handlers' own writes are bounded.
func clearWriteDeadline(c *gin.Context) {
	_ = http.NewResponseController(c.Writer).SetWriteDeadline(time.Time{})
}

// writeDeadline gives the next write to c's client WriteIdleTimeout.
func writeDeadline(c *gin.Context, idle time.Duration) {
	if idle > 0 {
		_ = http.NewResponseController(c.Writer).SetWriteDeadline(time.Now().Add(idle))
	}
}

// accessLog logs each request once it is answered.
func (s *Server) accessLog(c *gin.Context) {
	t0 := time.Now()
	c.Next()
	attrs := []any{"id", c.GetString("request_id"), "method", c.Request.Method, "path", c.Request.URL.Path, "status", c.Writer.Status(),
		"dur", time.Since(t0).Round(time.Microsecond), "remote", c.ClientIP()}
	if n, ok := c.Get(cachedTokensKey); ok {
		attrs = append(attrs, cachedTokensKey, n)
	}
	s.log.Info("request", attrs...)
}

func (s *Server) health(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) }

func (s *Server) version(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"version": s.cfg.Version}) }

func (s *Server) modelObject(id string) gin.H {
	return gin.H{"id": id, "object": "model", "created": s.created, "owned_by": "megamoe", "root": s.cfg.ModelName, "max_model_len": s.maxLen}
}

func (s *Server) models(c *gin.Context) {
	data := []gin.H{s.modelObject(s.cfg.ModelName)}
	for _, a := range s.cfg.Aliases {
		data = append(data, s.modelObject(a))
	}
	c.JSON(http.StatusOK, gin.H{"object": "list", "data": data})
}

func (s *Server) model(c *gin.Context) {
	id := strings.TrimPrefix(c.Param("id"), "/")
	if err := s.checkModel(id); err != nil || id == "" {
		writeError(c, errorf(http.StatusNotFound, "model", "model_not_found", "the model %q does not exist", id))
		return
	}
	c.JSON(http.StatusOK, s.modelObject(id))
}

// readJSON reads the (bounded) body into v, mapping failures to 400/413.
// Field names match exactly (see strictFields); a body setting any of reject
// is a 400.
func readJSON(c *gin.Context, v any, reject []string) error {
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return errorf(http.StatusRequestEntityTooLarge, "", "request_too_large", "request body exceeds %d bytes", MaxBodyBytes)
		}
		return errorf(http.StatusBadRequest, "", "", "read body: %v", err)
	}
	clean, err := strictFields(body, reflect.TypeOf(v), "")
	if err != nil {
		return err
	}
	if err := checkUnsupported(body, reject); err != nil {
		return err
	}
	if err := json.Unmarshal(clean, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			te.Field = strings.TrimPrefix(te.Field, "commonParams.") // the embedded struct's name
			return errorf(http.StatusBadRequest, te.Field, "invalid_type", "%s: expected %s, got %s", te.Field, te.Type, te.Value)
		}
		return errorf(http.StatusBadRequest, "", "invalid_json", "invalid JSON body: %v", err)
	}
	return nil
}

// commonParams are the fields shared by chat and text completions.
type commonParams struct {
	Model               string          `json:"model"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	MinP                *float64        `json:"min_p"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	RepetitionPenalty   *float64        `json:"repetition_penalty"`
	SkipSpecialTokens   *bool           `json:"skip_special_tokens"`
	// vLLM's sampling extensions.
	IgnoreEOS              bool  `json:"ignore_eos"`
	MinTokens              *int  `json:"min_tokens"`
	StopTokenIDs           []int `json:"stop_token_ids"`
	IncludeStopStrInOutput bool  `json:"include_stop_str_in_output"`
	// Only slow (non-byte-level) tokenizers put spaces between special
	// tokens; with V4's byte-level BPE it changes nothing, as in vLLM.
	SpacesBetweenSpecialTokens *bool              `json:"spaces_between_special_tokens"`
	LogitBias                  map[string]float64 `json:"logit_bias"`
	PromptLogprobs             *int               `json:"prompt_logprobs"`
	N                          *int               `json:"n"`
	BestOf                     *int               `json:"best_of"`
	// Structured outputs, vLLM's spellings (at most one of them).
	GuidedJSON        json.RawMessage    `json:"guided_json"`
	GuidedRegex       *string            `json:"guided_regex"`
	GuidedChoice      []string           `json:"guided_choice"`
	GuidedGrammar     *string            `json:"guided_grammar"`
	StructuredOutputs *structuredOutputs `json:"structured_outputs"`
	// CacheSalt isolates this request's prefix cache hits (vLLM's field).
	CacheSalt *string `json:"cache_salt"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// MaxN bounds n, the choices of one request (each is a sequence of its own).
const MaxN = 16

// genSpec is a validated generation request.
type genSpec struct {
	prompt    []int32
	params    engine.SamplingParams
	maxTokens int
	minTokens int // stop tokens and strings cannot end the output before
	stops     []string
	thinking  bool     // split the output at </think>
	special   bool     // keep special tokens' text in the output
	stopIDs   []int32  // token ids that end generation (not in the text)
	withStop  bool     // include a matched stop string in the text
	keep      []string // special tokens whose text is kept anyway (parsed out later)
	n         int      // independent choices
	// promptTop asks for prompt logprobs with this many alternatives (nil: none).
	promptTop *int
	slot      *queueSlot // the request's place in its connection's bound (nil: none)
	// constraint restricts the output to a grammar (structured outputs).
	constraint *engine.Constraint
	cacheSalt  string
	reuseAt    int // engine Request.ReuseAt
}

func (s *Server) checkModel(name string) error {
	if name != "" && name != s.cfg.ModelName && !slices.Contains(s.cfg.Aliases, name) {
		return errorf(http.StatusNotFound, "model", "model_not_found", "the model %q does not exist", name)
	}
	return nil
}

func parseStop(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, errorf(http.StatusBadRequest, "stop", "invalid_type", "stop must be a string or an array of strings")
	}
	if len(many) > 4 {
		return nil, errorf(http.StatusBadRequest, "stop", "", "at most 4 stop sequences")
	}
	out := many[:0]
	for _, m := range many {
		if m != "" {
			out = append(out, m)
		}
	}
	return out, nil
}

// build validates p against the prompt and fills a genSpec.
func (s *Server) build(p *commonParams, prompt []int32, promptParam string) (*genSpec, error) {
	if err := s.checkModel(p.Model); err != nil {
		return nil, err
	}
	bad := func(param, format string, args ...any) error {
		return errorf(http.StatusBadRequest, param, "", format, args...)
	}
	g := &genSpec{prompt: prompt, n: 1, special: p.SkipSpecialTokens != nil && !*p.SkipSpecialTokens}
	if p.CacheSalt != nil {
		if *p.CacheSalt == "" {
			return nil, bad("cache_salt", "cache_salt must be a non-empty string if provided")
		}
		g.cacheSalt = *p.CacheSalt
	}
	if p.N != nil {
		if *p.N < 1 || *p.N > MaxN {
			return nil, bad("n", "n must be in [1, %d], got %d", MaxN, *p.N)
		}
		g.n = *p.N
	}
	if p.BestOf != nil && *p.BestOf != g.n {
		return nil, bad("best_of", "best_of %d differs from n %d: choosing the best of several samples is not supported", *p.BestOf, g.n)
	}
	g.withStop = p.IncludeStopStrInOutput
	if !p.IgnoreEOS {
		g.stopIDs = append(g.stopIDs, s.cfg.StopTokens...)
	}
	for _, id := range p.StopTokenIDs {
		if id < 0 || id >= s.eng.Vocab() {
			return nil, bad("stop_token_ids", "stop token id %d outside the vocabulary [0, %d)", id, s.eng.Vocab())
		}
		g.stopIDs = append(g.stopIDs, int32(id))
	}
	if p.StreamOptions != nil && !p.Stream {
		return nil, bad("stream_options", "stream_options is only allowed when stream is true")
	}
	if len(prompt) == 0 {
		return nil, bad(promptParam, "the prompt is empty")
	}
	if len(prompt) >= s.maxLen {
		return nil, errorf(http.StatusBadRequest, promptParam, "context_length_exceeded",
			"This model's maximum context length is %d tokens. However, your request has %d input tokens, which leaves no room for output. Please reduce the length of the input.", s.maxLen, len(prompt))
	}
	room := s.maxLen - len(prompt)
	g.maxTokens = room
	for _, mt := range []struct {
		name string
		v    *int
	}{{"max_tokens", p.MaxTokens}, {"max_completion_tokens", p.MaxCompletionTokens}} {
		if mt.v == nil {
			continue
		}
		if *mt.v < 1 {
			return nil, bad(mt.name, "%s must be at least 1, got %d", mt.name, *mt.v)
		}
		if *mt.v > room {
			return nil, errorf(http.StatusBadRequest, mt.name, "context_length_exceeded",
				"'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
				*mt.v, s.maxLen, len(prompt), *mt.v, s.maxLen, len(prompt))
		}
		g.maxTokens = *mt.v
	}
	if p.MinTokens != nil {
		if *p.MinTokens < 0 || *p.MinTokens > g.maxTokens {
			return nil, bad("min_tokens", "min_tokens must be in [0, max_tokens %d], got %d", g.maxTokens, *p.MinTokens)
		}
		g.minTokens = *p.MinTokens
	}
	if p.PromptLogprobs != nil {
		switch k := *p.PromptLogprobs; {
		case p.Stream:
			return nil, bad("prompt_logprobs", "prompt_logprobs is not available when stream is true")
		case k < 0 || k > engine.MaxTopLogprobs:
			return nil, bad("prompt_logprobs", "prompt_logprobs must be in [0, %d], got %d", engine.MaxTopLogprobs, k)
		}
		g.promptTop = p.PromptLogprobs
	}
	sp := &g.params
	if p.Temperature != nil {
		if t := *p.Temperature; math.IsNaN(t) || t < 0 || t > 2 {
			return nil, bad("temperature", "temperature must be in [0, 2], got %v", t)
		}
		sp.Temperature = *p.Temperature
	} else {
		sp.Temperature = 1 // OpenAI default
	}
	if p.TopP != nil {
		if v := *p.TopP; math.IsNaN(v) || v <= 0 || v > 1 {
			return nil, bad("top_p", "top_p must be in (0, 1], got %v", v)
		}
		sp.TopP = *p.TopP
	}
	if p.TopK != nil {
		if *p.TopK < -1 {
			return nil, bad("top_k", "top_k must be -1 (off) or >= 0, got %d", *p.TopK)
		}
		sp.TopK = *p.TopK
	}
	if p.MinP != nil {
		if v := *p.MinP; math.IsNaN(v) || v < 0 || v > 1 {
			return nil, bad("min_p", "min_p must be in [0, 1], got %v", v)
		}
		sp.MinP = *p.MinP
	}
	for _, pen := range []struct {
		name string
		v    *float64
		dst  *float64
	}{{"presence_penalty", p.PresencePenalty, &sp.PresencePenalty}, {"frequency_penalty", p.FrequencyPenalty, &sp.FrequencyPenalty}} {
		if pen.v == nil {
			continue
		}
		if math.IsNaN(*pen.v) || *pen.v < -2 || *pen.v > 2 {
			return nil, bad(pen.name, "%s must be in [-2, 2], got %v", pen.name, *pen.v)
		}
		*pen.dst = *pen.v
	}
	if p.RepetitionPenalty != nil {
		if v := *p.RepetitionPenalty; math.IsNaN(v) || v <= 0 {
			return nil, bad("repetition_penalty", "repetition_penalty must be > 0, got %v", v)
		}
		sp.RepetitionPenalty = *p.RepetitionPenalty
	}
	if p.Seed != nil {
		seed := uint64(*p.Seed)
		sp.Seed = &seed
	}
	if len(p.LogitBias) > 0 {
		sp.LogitBias = make(map[int32]float32, len(p.LogitBias))
		for k, v := range p.LogitBias {
			id, err := strconv.Atoi(k)
			if err != nil || id < 0 || id >= s.eng.Vocab() {
				return nil, bad("logit_bias", "logit_bias key %q is not a token id in [0, %d)", k, s.eng.Vocab())
			}
			if math.IsNaN(v) || v < -100 || v > 100 {
				return nil, bad("logit_bias", "logit_bias values must be in [-100, 100], got %v", v)
			}
			sp.LogitBias[int32(id)] = float32(v)
		}
	}
	var err error
	if g.stops, err = parseStop(p.Stop); err != nil {
		return nil, err
	}
	if err := sp.Validate(s.eng.Vocab()); err != nil {
		return nil, bad("", "%v", err)
	}
	return g, nil
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func mkUsage(prompt, completion int) *usage {
	return &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion,
		PromptTokensDetails: &promptDetails{}}
}

// usage is the usage of a finished request's choices: the prompt counts once,
// with the prompt tokens its first choice found in the prefix cache, which
// the access log reports too.
func (s *Server) usage(c *gin.Context, prompt int, results []*result) *usage {
	u := mkUsage(prompt, sumCompletion(results))
	if len(results) > 0 && results[0] != nil {
		u.PromptTokensDetails.CachedTokens = results[0].cached
	}
	c.Set(cachedTokensKey, u.PromptTokensDetails.CachedTokens)
	return u
}

// cachedTokensKey is the gin context key of a request's cached prompt tokens.
const cachedTokensKey = "cached_tokens"

// sse writes Server-Sent Events, each within the write-idle timeout.
type sse struct {
	c    *gin.Context
	idle time.Duration
}

func startSSE(c *gin.Context, idle time.Duration) sse {
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	c.Status(http.StatusOK)
	// The status goes out now: a stream that waits in the queue has been accepted.
	writeDeadline(c, idle)
	c.Writer.Flush()
	return sse{c, idle}
}

func (w sse) send(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	writeDeadline(w.c, w.idle)
	if _, err := w.c.Writer.Write(b.Bytes()); err != nil {
		return err
	}
	w.c.Writer.Flush()
	return nil
}

// comment writes an SSE comment line, which clients ignore; it keeps
// proxies and clients from timing out a stream that waits.
func (w sse) comment(text string) error {
	writeDeadline(w.c, w.idle)
	if _, err := w.c.Writer.WriteString(": " + text + "\n\n"); err != nil {
		return err
	}
	w.c.Writer.Flush()
	return nil
}

func (w sse) done() {
	writeDeadline(w.c, w.idle)
	_, _ = w.c.Writer.WriteString("data: [DONE]\n\n")
	w.c.Writer.Flush()
}

// fail reports an error that happened after the stream started.
func (w sse) fail(err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = errorf(http.StatusInternalServerError, "", "", "%v", err)
	}
	_ = w.send(gin.H{"error": ae})
	w.done()
}

// Quoting marks user-supplied text in a rendered chat prompt so that it is
// encoded as plain text even where it spells a special token: only the chat
// template emits control tokens. The marks are bytes that valid UTF-8 (all
// JSON strings decode to) never holds.
const (
	quoteOpen  = "\xff"
	quoteClose = "\xfe"
)

func newQuoter(tok *tokenizer.Tokenizer) *strings.Replacer {
	var pairs []string
	for _, a := range tok.AddedTokens() {
		pairs = append(pairs, a, quoteOpen+a+quoteClose)
	}
	if len(pairs) == 0 {
		return nil
	}
	return strings.NewReplacer(pairs...)
}

// quote marks each special-token string in text.
func (s *Server) quote(text string) string {
	if s.quoter == nil {
		return text
	}
	return s.quoter.Replace(text)
}

// encodeQuoted encodes a rendered prompt, the quoted parts as plain text.
func (s *Server) encodeQuoted(text string) []int32 {
	var out []int32
	for text != "" {
		i := strings.Index(text, quoteOpen)
		if i < 0 {
			return append(out, s.encode(text)...)
		}
		out = append(out, s.encode(text[:i])...)
		text = text[i+len(quoteOpen):]
		j := strings.Index(text, quoteClose)
		if j < 0 {
			j = len(text)
		}
		for _, id := range s.tok.EncodeOrdinary(text[:j]) {
			out = append(out, int32(id))
		}
		text = text[min(len(text), j+len(quoteClose)):]
	}
	return out
}

func (s *Server) encode(text string) []int32 {
	ids := s.tok.Encode(text)
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}
