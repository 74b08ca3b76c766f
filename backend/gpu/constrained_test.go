package gpu

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/grammar"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

// maskCounter is the GPU backend counting the rows it draws under a mask.
type maskCounter struct {
	*Backend
	masked int
}

func (b *maskCounter) SampleDraw(logits backend.Tensor, d []backend.Draw, ids []int32) error {
	for _, p := range d {
		if p.Mask != nil {
			b.masked++
		}
	}
	return b.Backend.SampleDraw(logits, d, ids)
}

// TestConstrainedOnGPU: the engine over the embedded model on the GPU (CUDA
// graphs on) draws constrained tokens on the device with the grammar's mask,
// with jump-forward, and every output matches its grammar.
func TestConstrainedOnGPU(t *testing.T) {
	g := &maskCounter{Backend: openGPU(t, Options{Graphs: true})}
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Fatal(err)
	}
	w, st, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(w, g, model.Options{CacheBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	vocab := make([][]byte, w.Config.Vocab)
	for id := range min(len(vocab), tok.VocabSize()) {
		if !tok.IsAdded(id) {
			vocab[id] = []byte(tok.Decode([]int{id}))
		}
	}
	eos, ok := tok.TokenID(tokenizer.EOS)
	if !ok {
		t.Fatal("no EOS token")
	}
	table, err := grammar.NewTokenTable(vocab, []int32{int32(eos)})
	if err != nil {
		t.Fatal(err)
	}
	head := func(b []byte) []int32 {
		ids, _ := tok.EncodeHead(string(b))
		out := make([]int32, len(ids))
		for i, id := range ids {
			out[i] = int32(id)
		}
		return out
	}
	// Bounded grammars: the random weights cannot run on.
	schema := `{"type":"object","properties":{"a_rather_long_key_name":{"type":"integer","minimum":0,"maximum":99},
		"flag":{"type":"boolean"},"kind":{"enum":["alpha","beta"]}},"required":["a_rather_long_key_name","flag","kind"],
		"additionalProperties":false}`
	jsonG, err := grammar.CompileJSONSchema([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	const pattern = `[0-9]{3}-(ab|cd)`
	reG, err := grammar.CompileRegex(pattern)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^(?:` + pattern + `)$`)
	validJSON := func(s string) error {
		var v struct {
			A    *int `json:"a_rather_long_key_name"`
			Flag *bool
			Kind *string
		}
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			return err
		}
		if v.A == nil || *v.A < 0 || *v.A > 99 || v.Flag == nil || v.Kind == nil || (*v.Kind != "alpha" && *v.Kind != "beta") {
			return fmt.Errorf("%+v", v)
		}
		return nil
	}
	e, err := engine.New(engine.FromModel(m), engine.Config{MaxModelLen: 1024, DeviceSampling: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	type run struct {
		st    *engine.Stream
		check func(string) error
	}
	var runs []run
	for i := range 6 {
		seed := uint64(i)
		p := engine.SamplingParams{Temperature: 1, Seed: &seed}
		if i%3 == 0 {
			p = engine.SamplingParams{} // greedy
		}
		c, check := &engine.Constraint{Grammar: jsonG, Table: table, Head: head}, validJSON
		if i%2 == 1 {
			c, check = &engine.Constraint{Grammar: reG, Table: table, Head: head}, func(s string) error {
				if !re.MatchString(s) {
					return fmt.Errorf("does not match %s", pattern)
				}
				return nil
			}
		}
		st, err := e.Submit(&engine.Request{Prompt: encode(tok, fmt.Sprintf("Answer %d:", i)), MaxTokens: 100,
			StopTokens: []int32{int32(eos)}, Params: p, Constraint: c})
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run{st, check})
	}
	for i, r := range runs {
		var ids []int
		fin := engine.FinishNone
		for fin == engine.FinishNone {
			select {
			case <-r.st.Ready():
			case <-t.Context().Done():
				t.Fatal("stream unfinished")
			}
			for ev, ok := r.st.Next(); ok; ev, ok = r.st.Next() {
				for _, tk := range ev.Tokens {
					ids = append(ids, int(tk.ID))
				}
				if ev.Finish != engine.FinishNone {
					fin = ev.Finish
					if ev.Err != nil {
						t.Errorf("request %d: %v", i, ev.Err)
					}
				}
			}
		}
		if fin != engine.FinishStop || len(ids) == 0 || ids[len(ids)-1] != eos {
			t.Errorf("request %d: finish %q, tokens %v", i, fin, ids)
			continue
		}
		text := tok.Decode(ids[:len(ids)-1])
		if err := r.check(text); err != nil {
			t.Errorf("request %d: %q: %v", i, text, err)
		}
	}
	if g.masked == 0 {
		t.Error("no token was drawn on the device under a mask")
	}
}
