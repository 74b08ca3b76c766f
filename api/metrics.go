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
}

func newMetrics(eng *engine.Engine) *metrics {
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
		gauge("megamoe_preemptions", "Preemptions so far.", func(s engine.Stats) float64 { return float64(s.Preemptions) }),
	)
	return m
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
	m.prompt.Add(float64(prompt))
	m.generated.Add(float64(r.completion))
	if r.completion == 0 {
		return
	}
	m.ttft.Observe(r.first.Sub(start).Seconds())
	if r.completion > 1 {
		m.tpot.Observe(time.Since(r.first).Seconds() / float64(r.completion-1))
	}
}

func (m *metrics) handler() gin.HandlerFunc {
	return gin.WrapH(promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
}
