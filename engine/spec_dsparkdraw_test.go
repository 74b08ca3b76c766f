package engine

import (
	"fmt"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/model"
)

// drawingCPU is the CPU backend with a device sampler (the sample kernel's
// CPU twin), so the model takes its device draw paths as on a GPU; it
// counts the Markov chains drawn.
type drawingCPU struct {
	*cpu.Backend
	chains int
}

func (b *drawingCPU) SampleDraw(logits backend.Tensor, d []backend.Draw, ids []int32) error {
	vocab := logits.Cols()
	x := make([]float32, logits.Rows()*vocab)
	if err := b.Download(logits, x); err != nil {
		return err
	}
	for i := range d {
		ids[i] = drawOne(x[i*vocab:(i+1)*vocab], d[i])
	}
	return nil
}

func (b *drawingCPU) MarkovDraw(base backend.Tensor, tokens []int32, k int, w1 backend.Embedding, w2 backend.Linear, ids backend.Tensor) error {
	b.chains++
	return b.Backend.MarkovDraw(base, tokens, k, w1, w2, ids)
}

// TestSpecDSparkDeviceDraw: with DeviceSampling on a backend that draws,
// greedy requests take DSpark's device path (captured features kept on the
// device, drafts drawn through the Markov head there, verifications drawn)
// and their outputs are plain decoding's, token for token, beside a sampled
// request (host drafts), for the full block and a shorter one; the cache is
// empty afterwards.
func TestSpecDSparkDeviceDraw(t *testing.T) {
	w := loadDSpark(t)
	cfg := Config{MaxModelLen: 512, MaxBatchTokens: 64}
	reqs := dsparkRequests(w.Config.Vocab, 9, 30, 70, 30)
	want, _ := runEngine(t, dsparkModel(t, w, 0, 64<<20), cfg, reqs)
	sampled := &Request{Prompt: []int32{5, 99, 7, 8}, MaxTokens: 10, Params: SamplingParams{Temperature: 0.8, Seed: seed(1)}}
	for _, rows := range []int{0, 2} {
		t.Run(fmt.Sprintf("rows=%d", rows), func(t *testing.T) {
			if testing.Short() && rows == 2 {
				t.Skip("the full block covers the paths")
			}
			be := &drawingCPU{Backend: cpu.New(cpu.Options{Threads: 2})}
			mm, err := model.New(w, be, model.Options{Numerics: "exact", CacheBytes: 64 << 20, DSparkRows: rows, Drafts: -1})
			if err != nil {
				t.Fatal(err)
			}
			m := FromModel(mm).(Speculator)
			c := cfg
			c.DeviceSampling = true
			c.Speculative = SpecConfig{Method: "dspark", NumTokens: rows}
			got, e := runEngine(t, m, c, append(reqs[:len(reqs):len(reqs)], sampled))
			equalOutputs(t, want, got[:len(reqs)])
			s := e.Stats().Spec
			t.Logf("%d drafted, %d accepted, %d chains drawn on the device", s.Drafted, s.Accepted, be.chains)
			if be.chains == 0 || s.Drafted == 0 {
				t.Errorf("%d chains drawn, %d drafts: want the device path", be.chains, s.Drafted)
			}
			if u := m.Cache().UsedBytes(); u != 0 {
				t.Errorf("cache holds %d bytes after all finished", u)
			}
		})
	}
}
