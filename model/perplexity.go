package model

import (
	"fmt"
	"math"
)

// Perplexity is the mean next-token loss (nats) over consecutive windows of
// window+1 ids, each run as a fresh sequence from position 0 (the windows of
// train/train.py's evaluation), and the number of tokens scored.
func (m *Model) Perplexity(ids []int32, window int) (float64, int, error) {
	if window < 1 {
		return 0, 0, fmt.Errorf("perplexity: window %d must be >= 1", window)
	}
	for i, t := range ids {
		if t < 0 || int(t) >= m.cfg.Vocab {
			return 0, 0, fmt.Errorf("perplexity: token %d at %d outside the vocabulary (%d)", t, i, m.cfg.Vocab)
		}
	}
	var nll float64
	n := 0
	for i := 0; i+window+1 < len(ids); i += window {
		win := ids[i : i+window+1]
		seq := m.Cache().NewSequence()
		res, err := m.Forward(&Batch{Items: []BatchItem{{Seq: seq, Tokens: win[:window], AllLogits: true}}})
		if err != nil {
			m.FreeSequence(seq)
			return 0, 0, fmt.Errorf("perplexity window at %d: %w", i, err)
		}
		for j, row := range res.Rows(0) {
			nll += logSumExp(row) - float64(row[win[j+1]])
		}
		m.FreeSequence(seq)
		n += window
	}
	if n == 0 {
		return 0, 0, fmt.Errorf("perplexity: %d ids, fewer than a window of %d plus 2", len(ids), window)
	}
	return nll / float64(n), n, nil
}

func logSumExp(row []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range row {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range row {
		s += math.Exp(float64(v) - mx)
	}
	return mx + math.Log(s)
}
