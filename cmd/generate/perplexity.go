package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/megamoe/megamoe/model"
)

// pplFlags select the perplexity evaluation (--perplexity).
type pplFlags struct {
	file           string
	window, tokens int
}

// loadPPLTokens reads the evaluation tokens: a .bin file of little-endian
// uint16 ids (train/prep's format), else text encoded after a BOS.
func loadPPLTokens(path string, bos int32, tok func(string) ([]int32, error)) ([]int32, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(path, ".bin") {
		if len(data)%2 != 0 {
			return nil, fmt.Errorf("%s: odd length for uint16 ids", path)
		}
		ids := make([]int32, len(data)/2)
		for i := range ids {
			ids[i] = int32(binary.LittleEndian.Uint16(data[2*i:]))
		}
		return ids, nil
	}
	if tok == nil {
		return nil, fmt.Errorf("%s: text needs a tokenizer, which this model does not have", path)
	}
	ids, err := tok(string(data))
	if err != nil {
		return nil, err
	}
	return append([]int32{bos}, ids...), nil
}

// perplexity is exp of the mean next-token loss over consecutive windows of
// p.window+1 tokens (each a fresh sequence from position 0), over the first
// p.tokens ids: the windows train/train.py's evaluate() uses.
func perplexity(m *model.Model, ids []int32, p pplFlags, vocab int, out io.Writer) error {
	if p.window < 1 {
		return fmt.Errorf("--ppl-window %d must be >= 1", p.window)
	}
	limit := len(ids)
	if p.tokens > 0 {
		limit = min(limit, p.tokens)
	}
	var nll float64
	n := 0
	for i := 0; i+p.window+1 < limit; i += p.window {
		win := ids[i : i+p.window+1]
		for _, t := range win {
			if t < 0 || int(t) >= vocab {
				return fmt.Errorf("token %d at %d outside the vocabulary (%d)", t, i, vocab)
			}
		}
		seq := m.Cache().NewSequence()
		res, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: seq, Tokens: win[:p.window], AllLogits: true}}})
		if err != nil {
			m.FreeSequence(seq)
			return fmt.Errorf("perplexity window at %d: %w", i, err)
		}
		for j, row := range res.Rows(0) {
			nll += logSumExp(row) - float64(row[win[j+1]])
		}
		m.FreeSequence(seq)
		n += p.window
	}
	if n == 0 {
		return fmt.Errorf("perplexity: fewer than %d tokens", p.window+2)
	}
	fmt.Fprintf(out, "tokens %d, loss %.4f, perplexity %.3f\n", n, nll/float64(n), math.Exp(nll/float64(n)))
	return nil
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
