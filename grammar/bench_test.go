package grammar

import (
	"math/bits"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"
)

// maskTimes generates outputs with random allowed tokens over v and returns FillMask's time
// per step. fresh compiles the grammar for every output (a request whose states are all new);
// otherwise one Grammar serves every output (its states and masks are reused).
func maskTimes(b *testing.B, compile func() (*Grammar, error), v *vocabulary, outputs int, fresh bool) (wall, cpu []time.Duration) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var g *Grammar
	mask := make([]uint32, v.table.MaskWords())
	for i := range outputs {
		if g == nil || fresh {
			var err error
			if g, err = compile(); err != nil {
				b.Fatal(err)
			}
		}
		m, err := NewMatcher(g, v.table)
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(i), 9))
		for step := 0; step < 400 && !m.IsTerminated(); step++ {
			t0, c0 := time.Now(), threadCPU()
			if err := m.FillMask(mask); err != nil {
				b.Fatal(err)
			}
			wall, cpu = append(wall, time.Since(t0)), append(cpu, threadCPU()-c0)
			// after 40 random steps, half the steps advance along the shortest completion, so
			// that outputs cover the whole schema instead of wandering inside one string
			if step >= 40 && rng.IntN(2) == 0 {
				comp, err := shortestCompletion(m.a, m.cur().state)
				if err != nil {
					b.Fatal(err)
				}
				tok := v.eos
				if len(comp) > 0 {
					tok = v.byByte[comp[0]]
				}
				if err := m.Accept(tok); err != nil {
					b.Fatal(err)
				}
				continue
			}
			n := 0
			for _, w := range mask {
				n += bits.OnesCount32(w)
			}
			if mask[v.eos>>5]>>(v.eos&31)&1 != 0 {
				n--
			}
			if n == 0 {
				if err := m.Accept(v.eos); err != nil {
					b.Fatal(err)
				}
				continue
			}
			k := rng.IntN(n)
			var tok int32
			for id := int32(0); ; id++ {
				if id == v.eos {
					continue
				}
				if mask[id>>5]>>(id&31)&1 != 0 {
					if k == 0 {
						tok = id
						break
					}
					k--
				}
			}
			if err := m.Accept(tok); err != nil {
				b.Fatal(err)
			}
		}
	}
	return wall, cpu
}

// reportPercentiles reports wall-clock and thread-CPU percentiles (the CPU clock ticks in
// scheduler quanta on some kernels: its small values are coarse, its tail is not).
func reportPercentiles(b *testing.B, wall, cpu []time.Duration) {
	for _, x := range []struct {
		name  string
		times []time.Duration
	}{{"wall", wall}, {"cpu", cpu}} {
		slices.Sort(x.times)
		p := func(q float64) float64 { return float64(x.times[int(q*float64(len(x.times)-1))].Nanoseconds()) / 1e3 }
		b.ReportMetric(p(0.5), x.name+"-p50-us/token")
		b.ReportMetric(p(0.99), x.name+"-p99-us/token")
		b.ReportMetric(p(1), x.name+"-max-us/token")
	}
	b.ReportMetric(float64(len(wall)), "steps")
}

// BenchmarkMask: FillMask per token over the DeepSeek-V3 tokenizer's 129,280 tokens (the V4
// vocabulary size), on the 20-field schema and on free JSON (json_object). "cold" compiles the
// grammar per output (every state new at first), "warm" reuses it (states and masks cached).
func BenchmarkMask(b *testing.B) {
	v := deepseekVocab(b)
	schema, err := os.ReadFile("testdata/schemas/twenty_fields.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, gc := range []struct {
		name    string
		compile func() (*Grammar, error)
	}{
		{"schema20", func() (*Grammar, error) { return CompileJSONSchema(schema) }},
		{"json_object", func() (*Grammar, error) { return CompileJSON(true) }},
	} {
		for _, fresh := range []bool{true, false} {
			name := gc.name + "/warm"
			if fresh {
				name = gc.name + "/cold"
			}
			b.Run(name, func(b *testing.B) {
				var wall, cpu []time.Duration
				for b.Loop() {
					w, c := maskTimes(b, gc.compile, v, 8, fresh)
					wall, cpu = append(wall, w...), append(cpu, c...)
				}
				reportPercentiles(b, wall, cpu)
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
