package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/grammar"
)

// jsonToy is a token table of printable ASCII bytes, EOS and a few JSON and
// word pieces, with a longest-match tokenizer whose head drops the last token
// (the simple safe rule for jump-forward).
type jsonToy struct {
	vocab [][]byte
	table *grammar.TokenTable
	eos   int32
}

func newJSONToy(t *testing.T) *jsonToy {
	t.Helper()
	var vocab [][]byte
	for c := byte(' '); c <= '~'; c++ {
		vocab = append(vocab, []byte{c})
	}
	eos := int32(len(vocab))
	vocab = append(vocab, nil)
	for _, s := range []string{`{"`, `":`, `,"`, `"}`, `":"`, `_key`, `_name`, `long`, `very`, `first`, `second`, `third`, `true`, `false`, `alpha`, `beta`, `_value`} {
		vocab = append(vocab, []byte(s))
	}
	table, err := grammar.NewTokenTable(vocab, []int32{eos})
	if err != nil {
		t.Fatal(err)
	}
	return &jsonToy{vocab: vocab, table: table, eos: eos}
}

// head tokenizes b greedily by longest match and drops the last token.
func (j *jsonToy) head(b []byte) []int32 {
	var ids []int32
	for len(b) > 0 {
		best, n := int32(-1), 0
		for id, tok := range j.vocab {
			if len(tok) > n && bytes.HasPrefix(b, tok) {
				best, n = int32(id), len(tok)
			}
		}
		if best < 0 {
			break
		}
		ids, b = append(ids, best), b[n:]
	}
	if len(ids) > 0 {
		ids = ids[:len(ids)-1]
	}
	return ids
}

// countingModel counts forward passes.
type countingModel struct {
	*toyModel
	passes int
}

func (m *countingModel) Forward(items []ForwardItem) ([][]float32, error) {
	m.passes++
	return m.toyModel.Forward(items)
}

const longKeysSchema = `{"type":"object","properties":{
	"first_very_long_key_name":{"type":"integer","minimum":0,"maximum":999},
	"second_very_long_key_name":{"type":"boolean"},
	"third_long_key":{"enum":["alpha_value","beta_value"]}},
	"required":["first_very_long_key_name","second_very_long_key_name","third_long_key"],
	"additionalProperties":false}`

// validLongKeys checks an output against longKeysSchema by hand.
func validLongKeys(text string) error {
	var v struct {
		First  *int    `json:"first_very_long_key_name"`
		Second *bool   `json:"second_very_long_key_name"`
		Third  *string `json:"third_long_key"`
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("data after the object")
	}
	switch {
	case v.First == nil || *v.First < 0 || *v.First > 999:
		return fmt.Errorf("first %v", v.First)
	case v.Second == nil:
		return fmt.Errorf("second missing")
	case v.Third == nil || !slices.Contains([]string{"alpha_value", "beta_value"}, *v.Third):
		return fmt.Errorf("third %v", v.Third)
	}
	return nil
}

// Jump-forward on a schema with long literal keys: the outputs validate as
// without it, the forced tokens are the ones the tokenizer's head gives, and
// the model runs far fewer passes (the forced keys go in as chunks).
func TestJumpForward(t *testing.T) {
	j := newJSONToy(t)
	g, err := grammar.CompileJSONSchema([]byte(longKeysSchema))
	if err != nil {
		t.Fatal(err)
	}
	const seeds = 8
	passes := map[bool]int{}
	for _, jump := range []bool{false, true} {
		for s := range uint64(seeds) {
			c := &Constraint{Grammar: g, Table: j.table}
			if jump {
				c.Head = j.head
			}
			m := &countingModel{toyModel: newToy(t, 1<<20)}
			m.vocab = len(j.vocab)
			req := &Request{Prompt: []int32{1, 2, int32(3 + s)}, MaxTokens: 300, StopTokens: []int32{j.eos},
				Params: SamplingParams{Temperature: 1.5, Seed: seed(s)}, Constraint: c}
			got, _ := runEngine(t, m, Config{MaxModelLen: 4096}, []*Request{req})
			toks := got[0]
			if len(toks) == 0 || toks[len(toks)-1] != j.eos {
				t.Fatalf("jump %v seed %d: %v does not end with EOS", jump, s, toks)
			}
			var text []byte
			for _, id := range toks[:len(toks)-1] {
				text = append(text, j.vocab[id]...)
			}
			if err := validLongKeys(string(text)); err != nil {
				t.Errorf("jump %v seed %d: %q: %v", jump, s, text, err)
			}
			if jump && !bytes.HasPrefix(text, []byte(`{"first_very_long_key_name":`)) {
				t.Errorf("seed %d: %q does not start with the forced key", s, text)
			}
			passes[jump] += m.passes
		}
	}
	t.Logf("forward passes over %d outputs: %d without jump-forward, %d with", seeds, passes[false], passes[true])
	if passes[true]*2 > passes[false] {
		t.Errorf("jump-forward ran %d passes, without %d: want at most half", passes[true], passes[false])
	}
}
