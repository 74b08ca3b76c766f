package grammar

import (
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"
)

// maskTimes generates outputs with random allowed tokens over v and returns FillMask's wall
// time per step. With g nil every output gets a freshly compiled grammar (a request whose
// states are all new); otherwise g serves every output (its states and masks are reused).
func maskTimes(b *testing.B, compile func() (*Grammar, error), g *Grammar, v *vocabulary, outputs int) []time.Duration {
	var times []time.Duration
	mask := make([]uint32, v.table.MaskWords())
	for i := range outputs {
		gi := g
		if gi == nil {
			var err error
			if gi, err = compile(); err != nil {
				b.Fatal(err)
			}
		}
		m, err := NewMatcher(gi, v.table)
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(i), 9))
		for step := 0; step < 400 && !m.IsTerminated(); step++ {
			t0 := time.Now()
			if err := m.FillMask(mask); err != nil {
				b.Fatal(err)
			}
			times = append(times, time.Since(t0))
			// after 40 random steps, half the steps advance along the shortest completion, so
			// that outputs cover the whole schema instead of wandering inside one string
			tok := v.eos
			if step >= 40 && rng.IntN(2) == 0 {
				comp, err := shortestCompletion(m.a, m.cur().state)
				if err != nil {
					b.Fatal(err)
				}
				if len(comp) > 0 {
					tok = v.byByte[comp[0]]
				}
			} else if ids := maskIDs(mask, v.eos); len(ids) > 0 {
				tok = ids[rng.IntN(len(ids))]
			}
			if err := m.Accept(tok); err != nil {
				b.Fatal(err)
			}
		}
	}
	return times
}

func maskIDs(mask []uint32, except int32) []int32 {
	var ids []int32
	for wi, w := range mask {
		for ; w != 0; w &= w - 1 {
			if id := int32(wi*32 + bits.TrailingZeros32(w)); id != except {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// BenchmarkMask: FillMask per token over the DeepSeek-V3 tokenizer's 129,280 tokens (the V4
// vocabulary size), on the 20-field schema and on free JSON (json_object). "cold" compiles the
// grammar per output (every state new to it; the TokenTable's cross-grammar local masks are
// filled by the first repetition, as in a server after its first JSON request), "warm" reuses
// one Grammar (as an engine that caches compiled schemas). The same outputs are generated `reps` times and each step keeps its
// fastest time, which removes most of the noise of a loaded machine (descheduling only adds).
func BenchmarkMask(b *testing.B) {
	v := deepseekVocab(b)
	schema, err := os.ReadFile("testdata/schemas/twenty_fields.json")
	if err != nil {
		b.Fatal(err)
	}
	const outputs, reps = 8, 5
	for _, gc := range []struct {
		name    string
		compile func() (*Grammar, error)
	}{
		{"schema20", func() (*Grammar, error) { return CompileJSONSchema(schema) }},
		{"json_object", func() (*Grammar, error) { return CompileJSON(true) }},
	} {
		for _, warm := range []bool{false, true} {
			name := gc.name + "/cold"
			if warm {
				name = gc.name + "/warm"
			}
			b.Run(name, func(b *testing.B) {
				var best []time.Duration
				for b.Loop() {
					var g *Grammar
					if warm {
						if g, err = gc.compile(); err != nil {
							b.Fatal(err)
						}
						maskTimes(b, gc.compile, g, v, outputs) // fill the caches
					}
					best = nil
					for range reps {
						times := maskTimes(b, gc.compile, g, v, outputs)
						if best == nil {
							best = times
						}
						for i, t := range times {
							best[i] = min(best[i], t)
						}
					}
				}
				slices.Sort(best)
				p := func(q float64) float64 { return float64(best[int(q*float64(len(best)-1))].Nanoseconds()) / 1e3 }
				b.ReportMetric(p(0.5), "p50-us/token")
				b.ReportMetric(p(0.99), "p99-us/token")
				b.ReportMetric(p(1), "max-us/token")
				b.ReportMetric(float64(len(best)), "steps")
			})
		}
	}
}

// BenchmarkCompile: compiling the 20-field schema (including the automaton's start state).
func BenchmarkCompile(b *testing.B) {
	schema, err := os.ReadFile("testdata/schemas/twenty_fields.json")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := CompileJSONSchema(schema); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTokenTable: building the trie of the 129,280-token vocabulary (once per tokenizer).
func BenchmarkTokenTable(b *testing.B) {
	v := deepseekVocab(b)
	for b.Loop() {
		if _, err := NewTokenTable(v.tokens, []int32{v.eos}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJumpForward: outputs of the 20-field schema (warm grammar, the walk of BenchmarkMask)
// where, before each sampled token, the forced bytes' head (ForcedBytes, the tokenizer's
// EncodeHead, Accept of each id) is appended as the engine's jump-forward does. It reports the
// share of output tokens that skip a decode step and the time of one jump-forward check, which
// runs on the engine's goroutine after every sampled token.
func BenchmarkJumpForward(b *testing.B) {
	v := deepseekVocab(b)
	schema, err := os.ReadFile("testdata/schemas/twenty_fields.json")
	if err != nil {
		b.Fatal(err)
	}
	g, err := CompileJSONSchema(schema)
	if err != nil {
		b.Fatal(err)
	}
	const outputs = 8
	mask := make([]uint32, v.table.MaskWords())
	var times []time.Duration
	forced, sampled := 0, 0
	for b.Loop() {
		times, forced, sampled = times[:0], 0, 0
		for i := range outputs {
			m, err := NewMatcher(g, v.table)
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(i), 9))
			for step := 0; step < 400 && !m.IsTerminated(); step++ {
				t0 := time.Now()
				fb, err := m.ForcedBytes()
				if err != nil {
					b.Fatal(err)
				}
				ids, _ := v.tok.EncodeHead(string(fb))
				for _, id := range ids {
					if m.Accept(int32(id)) != nil {
						break
					}
					forced++
				}
				times = append(times, time.Since(t0))
				if err := m.FillMask(mask); err != nil {
					b.Fatal(err)
				}
				tok := v.eos
				if step >= 40 && rng.IntN(2) == 0 {
					comp, err := shortestCompletion(m.a, m.cur().state)
					if err != nil {
						b.Fatal(err)
					}
					if len(comp) > 0 {
						tok = v.byByte[comp[0]]
					}
				} else if ids := maskIDs(mask, v.eos); len(ids) > 0 {
					tok = ids[rng.IntN(len(ids))]
				}
				if err := m.Accept(tok); err != nil {
					b.Fatal(err)
				}
				sampled++
			}
		}
	}
	slices.Sort(times)
	p := func(q float64) float64 { return float64(times[int(q*float64(len(times)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(p(0.5), "p50-us/check")
	b.ReportMetric(p(0.99), "p99-us/check")
	b.ReportMetric(100*float64(forced)/float64(forced+sampled), "forced-%")
}
