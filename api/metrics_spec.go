package api

import (
	"strconv"

	"github.com/megamoe/megamoe/engine"
	"github.com/prometheus/client_golang/prometheus"
)

// specCollectors are the speculative-decoding series (vLLM's names, and the
// emitted tokens and mean acceptance length under ours), when drafts are on.
func specCollectors(eng *engine.Engine, model string) []prometheus.Collector {
	k := eng.Config().Speculative.NumTokens
	if k == 0 {
		return nil
	}
	labels := prometheus.Labels{"model_name": model}
	counter := func(name, help string, l prometheus.Labels, f func(engine.SpecStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l},
			func() float64 { return f(eng.Stats().Spec) })
	}
	cs := []prometheus.Collector{
		counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", labels,
			func(s engine.SpecStats) float64 { return float64(s.Steps) }),
		counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", labels,
			func(s engine.SpecStats) float64 { return float64(s.Drafted) }),
		counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", labels,
			func(s engine.SpecStats) float64 { return float64(s.Accepted) }),
		counter("megamoe_spec_decode_emitted_tokens_total", "Tokens emitted by verification steps (accepted drafts plus one each).", nil,
			func(s engine.SpecStats) float64 { return float64(s.Emitted) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "megamoe_spec_decode_mean_acceptance_length",
			Help: "Tokens emitted per verification step since start."}, func() float64 { return eng.Stats().Spec.MeanAcceptance() }),
	}
	for j := range k {
		l := prometheus.Labels{"model_name": model, "position": strconv.Itoa(j)}
		cs = append(cs, counter("vllm:spec_decode_num_accepted_tokens_per_pos_total", "Accepted tokens per draft position.", l,
			func(s engine.SpecStats) float64 {
				if j < len(s.PerPos) {
					return float64(s.PerPos[j])
				}
				return 0
			}))
	}
	return cs
}
