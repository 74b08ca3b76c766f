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

// perplexity prints the engine's perplexity over the first p.tokens ids in
// windows of p.window+1 (Model.Perplexity).
func perplexity(m *model.Model, ids []int32, p pplFlags, out io.Writer) error {
	if p.tokens > 0 && len(ids) > p.tokens {
		ids = ids[:p.tokens]
	}
	loss, n, err := m.Perplexity(ids, p.window)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "tokens %d, loss %.4f, perplexity %.3f\n", n, loss, math.Exp(loss))
	return nil
}
