package api

import (
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/megamoe/megamoe/engine"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the server's Prometheus series, on a registry of their own.
type metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	prompt     prometheus.Counter
	generated  prometheus.Counter
	ttft, tpot prometheus.Histogram
	vllm       vllmMetrics
}

// vllmMetrics are the series under the names vLLM documents, so that its
// dashboards work unchanged.
type vllmMetrics struct {
	prompt, generated             prometheus.Counter
	ttft, tpot, itl, reqTPOT, e2e prometheus.Histogram
	success                       *prometheus.CounterVec
}

func newMetrics(eng *engine.Engine, model string) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "megamoe_requests_total", Help: "HTTP requests by route and status."}, []string{"route", "status"}),
		prompt:    prometheus.NewCounter(prometheus.CounterOpts{Name: "megamoe_prompt_tokens_total", Help: "Prompt tokens of finished requests."}),
		generated: prometheus.NewCounter(prometheus.CounterOpts{Name: "megamoe_generation_tokens_total", Help: "Generated tokens."}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "megamoe_time_to_first_token_seconds",
			Help: "Time from submission to the first generated token.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		tpot: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "megamoe_time_per_output_token_seconds",
			Help: "Mean time between generated tokens of a request.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
	gauge := func(name, help string, f func(engine.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(eng.Stats()) })
	}
	m.reg.MustRegister(m.requests, m.prompt, m.generated, m.ttft, m.tpot,
		gauge("megamoe_queue_depth", "Requests waiting for admission.", func(s engine.Stats) float64 { return float64(s.Waiting) }),
		gauge("megamoe_running_sequences", "Sequences being computed.", func(s engine.Stats) float64 { return float64(s.Running) }),
		gauge("megamoe_kv_cache_used_bytes", "KV cache bytes in use.", func(s engine.Stats) float64 { return float64(s.CacheUsed) }),
		gauge("megamoe_kv_cache_capacity_bytes", "KV cache capacity.", func(s engine.Stats) float64 { return float64(s.CacheCapacity) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "megamoe_preemptions_total", Help: "Sequences preempted (KV cache full) so far."},
			func() float64 { return float64(eng.Stats().Preemptions) }),
		gauge("megamoe_kv_cache_cached_bytes", "KV cache bytes held only by the prefix cache (reclaimed on demand).",
			func(s engine.Stats) float64 { return float64(s.CacheCached) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "megamoe_prefix_cache_queries_total", Help: "Prompt tokens looked up in the prefix cache."},
			func() float64 { return float64(eng.Stats().PrefixQueries) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "megamoe_prefix_cache_hits_total", Help: "Prompt tokens found in the prefix cache."},
			func() float64 { return float64(eng.Stats().PrefixHits) }),
		gauge("megamoe_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache over those looked up, since start.", hitRate),
	)
	m.registerVLLM(eng, model)
	m.reg.MustRegister(specCollectors(eng, model)...)
	return m
}

func (m *metrics) registerVLLM(eng *engine.Engine, model string) {
	labels := prometheus.Labels{"model_name": model}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
	}
	gauge := func(name, help string, f func(engine.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return f(eng.Stats()) })
	}
	lat := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	tok := []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	e2e := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	v := &m.vllm
	v.prompt = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	v.generated = counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
	v.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lat)
	// vLLM observes both per gap between a request's token-producing steps;
	// the first name is its deprecated alias of the second.
	v.tpot = hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", tok)
	v.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tok)
	v.reqTPOT = hist("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", tok)
	v.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", e2e)
	v.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests.", ConstLabels: labels}, []string{"finished_reason"})
	m.reg.MustRegister(v.prompt, v.generated, v.ttft, v.tpot, v.itl, v.reqTPOT, v.e2e, v.success,
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func(s engine.Stats) float64 { return float64(s.Running) }),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(s engine.Stats) float64 { return float64(s.Waiting) }),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(s engine.Stats) float64 {
			if s.CacheCapacity == 0 {
				return 0
			}
			return float64(s.CacheUsed) / float64(s.CacheCapacity)
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vllm:num_preemptions_total", Help: "Cumulative number of preemption from the engine.", ConstLabels: labels},
			func() float64 { return float64(eng.Stats().Preemptions) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total", Help: "Prefix cache queries, in terms of number of queried tokens.", ConstLabels: labels},
			func() float64 { return float64(eng.Stats().PrefixQueries) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total", Help: "Prefix cache hits, in terms of number of cached tokens.", ConstLabels: labels},
			func() float64 { return float64(eng.Stats().PrefixHits) }),
	)
}

// hitRate is the share of queried prompt tokens found in the prefix cache.
func hitRate(s engine.Stats) float64 {
	if s.PrefixQueries == 0 {
		return 0
	}
	return float64(s.PrefixHits) / float64(s.PrefixQueries)
}

// count is middleware counting every answered request.
func (m *metrics) count(c *gin.Context) {
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	m.requests.WithLabelValues(route, strconv.Itoa(c.Writer.Status())).Inc()
}

// finish records the token counts and latencies of one generation.
func (m *metrics) finish(start time.Time, prompt int, r *result) {
	v := &m.vllm
	m.prompt.Add(float64(prompt))
	m.generated.Add(float64(r.completion))
	v.prompt.Add(float64(prompt))
	v.generated.Add(float64(r.completion))
	if r.finish != "" {
		v.success.WithLabelValues(r.finish).Inc()
		v.e2e.Observe(time.Since(start).Seconds())
	}
	if r.completion == 0 || r.first.IsZero() {
		return
	}
	m.ttft.Observe(r.first.Sub(start).Seconds())
	v.ttft.Observe(r.first.Sub(start).Seconds())
	if r.completion > 1 {
		per := r.last.Sub(r.first).Seconds() / float64(r.completion-1)
		m.tpot.Observe(per)
		v.reqTPOT.Observe(per)
	}
}

// steps records when a request's engine steps produced tokens (one time per
// step): the first sets the time to first token, each later one observes
// the gap since the step before.
func (m *metrics) steps(r *result, at []time.Time) {
	for _, t := range at {
		if r.first.IsZero() {
			r.first = t
		} else {
			gap := t.Sub(r.last).Seconds()
			m.vllm.itl.Observe(gap)
			m.vllm.tpot.Observe(gap)
		}
		r.last = t
	}
}

func (m *metrics) handler() gin.HandlerFunc {
	return gin.WrapH(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
}
