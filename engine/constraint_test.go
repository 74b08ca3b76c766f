package engine

import (
	"regexp"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/grammar"
)

// toyTable is a token table for the toy model's 50 ids: digits, letters,
// EOS (id 36) and a few multi-byte tokens.
func toyTable(t *testing.T) (*grammar.TokenTable, [][]byte, int32) {
	t.Helper()
	vocab := make([][]byte, 50)
	for i := range 10 {
		vocab[i] = []byte{'0' + byte(i)}
	}
	for i := range 26 {
		vocab[10+i] = []byte{'a' + byte(i)}
	}
	const eos = 36
	for i, s := range []string{"ab", "bc", "c0", "01", "23", "45", "67", "89", "abc", "zz", "0a", "9c", "b9"} {
		vocab[37+i] = []byte(s)
	}
	table, err := grammar.NewTokenTable(vocab, []int32{eos})
	if err != nil {
		t.Fatal(err)
	}
	return table, vocab, eos
}

// Constrained outputs match the grammar and end with "stop", whether EOS is a
// stop token or the grammar's end finishes the sequence (ignore_eos), greedy
// or sampled; a deferred constraint leaves the tokens up to After free.
func TestConstraintOutputsMatch(t *testing.T) {
	table, vocab, eos := toyTable(t)
	const pattern = `(ab|c)[0-9]{2}x?`
	g, err := grammar.CompileRegex(pattern)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^(?:` + pattern + `)$`)
	cases := []struct {
		name     string
		temp     float64
		stop     []int32
		deferred bool
	}{
		{"greedy", 0, []int32{eos}, false},
		{"sampled", 1.5, []int32{eos}, false},
		{"no stop tokens", 1, nil, false},
		{"deferred", 1, []int32{eos}, true},
	}
	const after = 25 // 'p'
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var reqs []*Request
			for seed := range uint64(6) {
				sd := seed
				p := SamplingParams{Temperature: tc.temp, Seed: &sd}
				if tc.deferred {
					// The free part draws 'p' first; the grammar masks it afterwards.
					p.LogitBias = map[int32]float32{after: 100}
				}
				reqs = append(reqs, &Request{Prompt: []int32{1, 2, int32(3 + seed)}, MaxTokens: 40, StopTokens: tc.stop,
					Params:     p,
					Constraint: &Constraint{Grammar: g, Table: table, Deferred: tc.deferred, After: after}})
			}
			e, err := New(newToy(t, 10000), Config{MaxModelLen: 200})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			go e.Run(ctx)
			for i, r := range reqs {
				st, err := e.Submit(r)
				if err != nil {
					t.Fatal(err)
				}
				toks, fin := collect(t, st)
				if fin != FinishStop {
					t.Fatalf("request %d: finish %q after %v", i, fin, toks)
				}
				if toks[len(toks)-1] != eos {
					t.Fatalf("request %d: last token %d, want EOS", i, toks[len(toks)-1])
				}
				body := toks[:len(toks)-1]
				if tc.deferred {
					j := 0
					for j < len(body) && body[j] != after {
						j++
					}
					if j == len(body) {
						t.Fatalf("request %d: ended by EOS %v without the grammar started", i, toks)
					}
					body = body[j+1:]
				}
				var text []byte
				for _, id := range body {
					text = append(text, vocab[id]...)
				}
				if !re.Match(text) {
					t.Errorf("request %d: output %q does not match %s", i, text, pattern)
				}
			}
		})
	}
}

// A constraint whose table does not fit the model is refused at Submit.
func TestConstraintTableSize(t *testing.T) {
	g, err := grammar.CompileRegex(`a`)
	if err != nil {
		t.Fatal(err)
	}
	table, err := grammar.NewTokenTable([][]byte{[]byte("a"), nil}, []int32{1})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(newToy(t, 10000), Config{MaxModelLen: 100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Submit(&Request{Prompt: []int32{1}, MaxTokens: 4, Constraint: &Constraint{Grammar: g, Table: table}}); err == nil {
		t.Fatal("Submit accepted a 2-token table for a 50-token model")
	}
}

// With DeviceSampling, constrained requests are drawn on the device with
// their grammar's mask: every token is a device draw, the output matches the
// grammar, and it is the token-by-token replay of the device rule over the
// masked logits.
func TestConstraintDeviceDraws(t *testing.T) {
	table, vocab, eos := toyTable(t)
	const pattern = `(ab|c)[0-9]{2,4}x?`
	g, err := grammar.CompileRegex(pattern)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^(?:` + pattern + `)$`)
	params := []SamplingParams{{}, {Temperature: 5, Seed: seed(1)}, {Temperature: 6, TopK: 12, TopP: 0.9, Seed: seed(2)}}
	var reqs []*Request
	for i, p := range params {
		reqs = append(reqs, &Request{Prompt: []int32{int32(i + 1), 7, 3}, MaxTokens: 30, StopTokens: []int32{eos}, Params: p,
			Constraint: &Constraint{Grammar: g, Table: table}})
	}
	m := &drawingToy{toyModel: newToy(t, 1<<20)}
	got, _ := runEngine(t, m, Config{MaxModelLen: 4096, MaxBatchTokens: 16, DeviceSampling: true}, reqs)
	toy := newToy(t, 1<<20)
	draws := 0
	for i, r := range reqs {
		draws += len(got[i])
		if want := replayConstrained(t, toy, r); !slices.Equal(got[i], want) {
			t.Errorf("request %d: %v, want %v", i, got[i], want)
		}
		if n := len(got[i]); n == 0 || got[i][n-1] != eos {
			t.Fatalf("request %d: %v does not end with EOS", i, got[i])
		}
		var text []byte
		for _, id := range got[i][:len(got[i])-1] {
			text = append(text, vocab[id]...)
		}
		if !re.Match(text) {
			t.Errorf("request %d: output %q does not match %s", i, text, pattern)
		}
	}
	if m.draws != draws {
		t.Errorf("%d device draws for %d tokens", m.draws, draws)
	}
}

// replayConstrained replays r one token at a time: the grammar's mask, the
// sequence's device draw with it, until the grammar ends.
func replayConstrained(t *testing.T, toy *toyModel, r *Request) []int32 {
	t.Helper()
	cs, err := newConstraintState(r.Constraint, toy.vocab)
	if err != nil {
		t.Fatal(err)
	}
	s := NewSampler(r.Params, r.Prompt)
	seq := slices.Clone(r.Prompt)
	var out []int32
	for range r.MaxTokens {
		d, ok := s.DeviceDraw()
		if !ok {
			t.Fatalf("request %+v is not drawn on the device", r.Params)
		}
		if _, err := cs.fill(); err != nil {
			t.Fatal(err)
		}
		d.Mask = cs.mask
		id := drawOne(toy.logits(seq), d)
		s.Accept(id)
		seq, out = append(seq, id), append(out, id)
		if ended, err := cs.accept(id); err != nil || ended {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	return out
}
