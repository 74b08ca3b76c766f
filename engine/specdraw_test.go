package engine

import (
	"fmt"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/model"
)

// drawingToySpec is toySpec whose greedy drafts and verifications are drawn
// with the sample kernel's CPU twin, as model.Model does on a GPU.
type drawingToySpec struct {
	*toySpec
	drawnRows, drawnDrafts int
}

func (m *drawingToySpec) ForwardMTPDraw(items []model.MTPItem) ([][]float32, [][]float32, []int32, error) {
	logits, hidden, err := m.ForwardMTP(items)
	if err != nil {
		return nil, nil, nil, err
	}
	ids := make([]int32, len(items))
	for i, it := range items {
		ids[i] = -1
		if it.Draw != nil {
			ids[i], logits[i] = drawOne(logits[i], *it.Draw), nil
			m.drawnDrafts++
		}
	}
	return logits, hidden, ids, nil
}

func (m *drawingToySpec) CanDraw() bool { return true }

func (m *drawingToySpec) ForwardVerify(items []ForwardItem) ([][]float32, [][]float32, [][]int32, error) {
	all := make([]ForwardItem, len(items))
	for i, it := range items {
		all[i] = it
		all[i].AllLogits = it.AllLogits || it.DrawRows
	}
	logits, hidden, err := m.ForwardHidden(all)
	if err != nil {
		return nil, nil, nil, err
	}
	var rows [][]int32
	for i, it := range items {
		if !it.DrawRows {
			continue
		}
		if rows == nil {
			rows = make([][]int32, len(items))
		}
		for r := range it.Tokens {
			rows[i] = append(rows[i], drawOne(logits[i][r*m.vocab:(r+1)*m.vocab], backend.Draw{}))
		}
		m.drawnRows += len(it.Tokens)
		if !it.AllLogits {
			logits[i] = nil
		}
	}
	return logits, hidden, rows, nil
}

// TestSpecDeviceDraws: with DeviceSampling, greedy drafts are drawn on the
// device, greedy verifications take the rows' tokens drawn there, and the
// outputs are plain decoding's, with stop tokens and max_tokens inside a
// step; requests the host must sample (logprobs, penalties) verify on the
// host beside them; sampled requests draft and verify on the host.
func TestSpecDeviceDraws(t *testing.T) {
	for _, tc := range []struct {
		name         string
		params       func(i int) SamplingParams
		rows, drafts bool // some drawn on the device
	}{
		{"greedy", func(int) SamplingParams { return SamplingParams{} }, true, true},
		{"mixed", func(i int) SamplingParams {
			switch i % 3 {
			case 1:
				return SamplingParams{Logprobs: true}
			case 2:
				return SamplingParams{FrequencyPenalty: 0.5}
			}
			return SamplingParams{}
		}, true, true},
		{"logprobs only", func(int) SamplingParams { return SamplingParams{Logprobs: true} }, false, true},
		{"sampled", func(i int) SamplingParams { seed := uint64(i); return SamplingParams{Temperature: 0.8, Seed: &seed} }, false, false},
	} {
		for _, missOf := range []uint32{0, 3} {
			t.Run(fmt.Sprintf("%s miss=%d", tc.name, missOf), func(t *testing.T) {
				reqs := toyRequests(6, 20, tc.params)
				plain, _ := runEngine(t, newToy(t, 1<<20), Config{MaxModelLen: 4096, MaxBatchTokens: 16}, reqs)
				reqs = toyRequests(6, 20, tc.params)
				reqs[2].StopTokens = []int32{plain[2][5]}
				reqs[3].MaxTokens = 7
				want, _ := runEngine(t, newToy(t, 1<<20), Config{MaxModelLen: 4096, MaxBatchTokens: 16}, reqs)
				cfg := Config{MaxModelLen: 4096, MaxBatchTokens: 16, Speculative: SpecConfig{Method: "mtp", NumTokens: 3}}
				host, _ := runEngine(t, newToySpec(newToy(t, 1<<20), missOf), cfg, reqs)
				m := &drawingToySpec{toySpec: newToySpec(newToy(t, 1<<20), missOf)}
				cfg.DeviceSampling = true
				got, e := runEngine(t, m, cfg, reqs)
				equalOutputs(t, host, got) // seeded sampling with drafts differs from plain sampling
				if tc.drafts {             // greedy: plain decoding's tokens
					equalOutputs(t, want, got)
				}
				if st := e.Stats().Spec; st.Accepted == 0 {
					t.Errorf("no draft accepted: %+v", st)
				}
				if (m.drawnRows > 0) != tc.rows || (m.drawnDrafts > 0) != tc.drafts {
					t.Errorf("%d rows and %d drafts drawn on the device, want some: %v and %v", m.drawnRows, m.drawnDrafts, tc.rows, tc.drafts)
				}
			})
		}
	}
}
