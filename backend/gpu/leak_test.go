package gpu

import (
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

// TestStepsReturnPoolMemory: a sequence's prefill chunks and decode steps
// (eager, the path every prefill takes) hand all their device memory back to
// the pool: after the first round warms the pool up, every later round ends
// with the same bytes in use. model's TestForwardFreesTemporaries checks the
// model's own tensors on the CPU; this one also covers the backend's scratch.
func TestStepsReturnPoolMemory(t *testing.T) {
	for _, side := range []bool{false, true} {
		t.Run(map[bool]string{false: "main stream", true: "side stream"}[side], func(t *testing.T) {
			stepsReturnPoolMemory(t, openGPU(t, Options{NoSideStream: !side}))
		})
	}
}

// stepsReturnPoolMemory: with the side stream, forks hold the blocks freed
// meanwhile until their join, which must release them all.
func stepsReturnPoolMemory(t *testing.T, g *Backend) {
	c := checkpoint.SmallConfig()
	m, err := model.New(genWeights(t, c, 1), g, model.Options{CacheBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	round := func(seed uint64) int64 {
		s := m.Cache().NewSequence()
		defer m.FreeSequence(s)
		toks := make([]int32, 40)
		for i := range toks {
			toks[i] = int32((seed*7919 + uint64(i)*104729) % uint64(c.Vocab))
		}
		for i := 0; i < len(toks); i += 16 { // chunks of 16, 16, 8
			if _, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks[i:min(i+16, len(toks))]}}}); err != nil {
				t.Fatal(err)
			}
		}
		for k := range 3 {
			if _, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks[k : k+1]}}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := g.Sync(); err != nil {
			t.Fatal(err)
		}
		return g.Context().Pool().Stats().InUse
	}
	warm := round(1)
	for r := uint64(2); r <= 3; r++ {
		if got := round(r); got != warm {
			t.Errorf("round %d ends with %d pool bytes in use, the first %d", r, got, warm)
		}
	}
}
