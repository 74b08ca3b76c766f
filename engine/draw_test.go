package engine

import (
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda/cpuref"
)

// drawingToy is toyModel with the device draw done by the sample kernel's
// CPU twin, as model.Model does on a GPU.
type drawingToy struct {
	*toyModel
	draws, forwards int
}

func (m *drawingToy) CanDraw() bool { return true }

func (m *drawingToy) ForwardDraw(items []ForwardItem) ([][]float32, []int32, error) {
	m.forwards++
	logits, err := m.Forward(items)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]int32, len(items))
	for i, it := range items {
		ids[i] = -1
		if it.Draw == nil {
			continue
		}
		m.draws++
		row := logits[i][len(logits[i])-m.vocab:]
		ids[i] = drawOne(row, *it.Draw)
		if !it.AllLogits {
			logits[i] = nil
		}
	}
	return logits, ids, nil
}

// drawOne is the kernel's twin with d's mask (masked tokens as -inf).
func drawOne(row []float32, d backend.Draw) int32 {
	if d.Mask != nil {
		row = slices.Clone(row)
		cpuref.SampleMask(row, d.Mask)
	}
	return cpuref.SampleDraw(row, 1, len(row), []float32{d.Temp}, []int32{d.TopK}, []float32{d.TopP}, []float32{d.MinP}, []float32{d.U})[0]
}

// TestDeviceDraws: requests without logprobs, penalties or bias get the tokens
// the device rule draws with their sequence's uniforms under DeviceSampling;
// the others, and every request without it, the host sampler's.
func TestDeviceDraws(t *testing.T) {
	params := []SamplingParams{
		{},
		{Temperature: 5, Seed: seed(1)}, // the toy's logits need heat to leave their argmax
		{Temperature: 6, TopK: 12, TopP: 0.9, MinP: 0.01, Seed: seed(2)},
		{Temperature: 5, Seed: seed(3), Logprobs: true},
		{Temperature: 5, Seed: seed(4), PresencePenalty: 0.5},
	}
	var reqs []*Request
	for i, p := range params {
		prompt := []int32{int32(i + 1), 7, 3, int32(2 * i)}
		reqs = append(reqs, &Request{Prompt: prompt, MaxTokens: 9, Params: p})
	}
	toy := newToy(t, 1<<20)
	for _, host := range []bool{false, true} {
		m := &drawingToy{toyModel: newToy(t, 1<<20)}
		got, _ := runEngine(t, m, Config{MaxModelLen: 4096, MaxBatchTokens: 16, DeviceSampling: !host}, reqs)
		for i, r := range reqs {
			device := !host && i < 3
			if want := expectTokens(toy, r, device); !slices.Equal(got[i], want) {
				t.Errorf("host sampling %v, request %d: %v, want %v", host, i, got[i], want)
			}
		}
		if want := 0; host && m.draws != want {
			t.Errorf("without DeviceSampling: %d device draws", m.draws)
		}
		if !host && m.draws != 3*9 {
			t.Errorf("%d device draws, want %d (3 requests × 9 tokens)", m.draws, 3*9)
		}
	}
}

// expectTokens replays request r one token at a time on the toy's logits.
func expectTokens(toy *toyModel, r *Request, device bool) []int32 {
	s := NewSampler(r.Params, r.Prompt)
	seq := slices.Clone(r.Prompt)
	var out []int32
	for range r.MaxTokens {
		row := toy.logits(seq)
		id := int32(-1)
		if device {
			if d, ok := s.DeviceDraw(); ok {
				id = drawOne(row, d)
			}
		}
		if id < 0 {
			id = s.Sample(row).ID
		}
		s.Accept(id)
		seq, out = append(seq, id), append(out, id)
	}
	return out
}
