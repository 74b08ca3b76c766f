package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

func newSynth(t testing.TB, c *checkpoint.Config, numerics string) *Model {
	t.Helper()
	m, err := New(genWeights(t, c, 1), nil, Options{Numerics: numerics})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func prompt(n, vocab int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 7))
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(r.IntN(vocab))
	}
	return p
}

// run feeds tokens in chunks and returns the logits of every position.
func run(t testing.TB, m *Model, toks []int32, chunks []int) [][]float32 {
	t.Helper()
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	var out [][]float32
	i, k := 0, 0
	for i < len(toks) {
		c := len(toks) - i
		if len(chunks) > 0 {
			c = min(chunks[k%len(chunks)], c)
			k++
		}
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[i : i+c], AllLogits: true}}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o.Rows(0)...)
		i += c
	}
	return out
}

func maxRelDiff(a, b [][]float32) (float64, int) {
	worst, at := 0.0, -1
	for i := range a {
		var num, den float64
		for j := range a[i] {
			d := float64(a[i][j] - b[i][j])
			num = math.Max(num, math.Abs(d))
			den = math.Max(den, math.Abs(float64(a[i][j])))
		}
		if r := num / math.Max(den, 1e-30); r > worst || math.IsNaN(r) {
			worst, at = r, i
		}
	}
	return worst, at
}

func TestSmokeFinite(t *testing.T) {
	for _, mode := range []string{"faithful", "exact"} {
		m := newSynth(t, checkpoint.SmallConfig(), mode)
		lg := run(t, m, prompt(40, 512, 1), nil)
		for i, row := range lg {
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%s: non-finite logit at position %d", mode, i)
				}
			}
		}
		t.Logf("%s: logits[0][:4] = %v, last[:4] = %v", mode, lg[0][:4], lg[len(lg)-1][:4])
	}
}

// genWeights draws the weights of c as the small-checkpoint generator does
// (checkpoint.GenWeights, official formats).
func genWeights(t testing.TB, c *checkpoint.Config, seed uint64) *checkpoint.Weights {
	t.Helper()
	w, err := checkpoint.GenWeights(c, checkpoint.GenOfficial, seed)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
