package main

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/safetensors"
)

func TestGenerateDump(t *testing.T) {
	dir := t.TempDir()
	mdir := filepath.Join(dir, "model")
	c := checkpoint.SmallConfig() // what --model synth runs
	vocab := c.Vocab
	if err := checkpoint.Save(mdir, genWeights(t, c, 1)); err != nil {
		t.Fatal(err)
	}
	var outs []string
	var dumps [][]float32
	for i, args := range [][]string{
		{"--model", "synth", "--tokens", "0,17,42,99,3", "--steps", "4", "--chunk", "2"},
		{"--model", mdir, "--tokens", "0,17,42,99,3", "--steps", "4", "--threads", "1"},
	} {
		path := filepath.Join(dir, "d"+string(rune('0'+i))+".safetensors")
		var so, se bytes.Buffer
		if err := run(append(args, "--dump-logits", path), &so, &se); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, se.String())
		}
		outs = append(outs, strings.TrimSpace(so.String()))
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		lg, ok1 := f.Get("logits")
		tk, ok2 := f.Get("tokens")
		if !ok1 || !ok2 || lg.DType != safetensors.F32 || tk.DType != safetensors.I64 {
			t.Fatalf("dump tensors: %v %v", lg, tk)
		}
		if lg.Shape[0] != 9 || lg.Shape[1] != vocab || tk.Shape[0] != 9 {
			t.Fatalf("shapes %v %v, want [9 %d] [9]", lg.Shape, tk.Shape, vocab)
		}
		if got := int64(binary.LittleEndian.Uint64(tk.Data[8:])); got != 17 {
			t.Errorf("tokens[1] = %d", got)
		}
		v := make([]float32, 9*vocab)
		num.DecodeF32(lg.Data, v)
		dumps = append(dumps, v)
		// The generated ids are the argmax of the previous rows.
		gen := strings.Split(outs[i], ",")
		if len(gen) != 4 {
			t.Fatalf("output %q", outs[i])
		}
		f.Close()
	}
	if outs[0] != outs[1] {
		t.Errorf("chunked in-memory run %q != loaded run %q", outs[0], outs[1])
	}
	for i := range dumps[0] {
		if dumps[0][i] != dumps[1][i] {
			t.Fatalf("logits differ at %d: %g vs %g", i, dumps[0][i], dumps[1][i])
		}
	}
	for _, bad := range [][]string{{"--tokens", "x"}, {"--numerics", "nope"}, {"--model", "synth:flash:0"}, {"--model", "synth:tiny"}, {"--tokens", "1", "--prompt", "a"}, {"--tokens", "999999"}} {
		if err := run(bad, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	// The embedded checkpoint ships a tokenizer, so --prompt works by default.
	var so bytes.Buffer
	if err := run([]string{"--prompt", "Hello there", "--steps", "3"}, &so, &bytes.Buffer{}); err != nil {
		t.Fatalf("--prompt on the embedded model: %v", err)
	}
	if got := strings.Split(strings.TrimSpace(so.String()), ","); len(got) != 3 {
		t.Errorf("--prompt output %q, want 3 ids", so.String())
	}
	// synth:small is the generated small model (the embedded one is trained):
	// the same ids as --model synth, and its tokenizer takes --prompt.
	var ss bytes.Buffer
	if err := run([]string{"--model", "synth:small", "--tokens", "0,17,42,99,3", "--steps", "4"}, &ss, &bytes.Buffer{}); err != nil {
		t.Fatalf("synth:small: %v", err)
	}
	if got := strings.TrimSpace(ss.String()); got != outs[0] {
		t.Errorf("synth:small gave %q, --model synth %q", got, outs[0])
	}
	if err := run([]string{"--model", "synth:small", "--prompt", "Hello there", "--steps", "3"}, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatalf("--prompt on synth:small: %v", err)
	}
}

// genWeights draws the weights of c as the small-checkpoint generator does
// (checkpoint.GenWeights, official formats).
func genWeights(t testing.TB, c *checkpoint.Config, seed uint64) *checkpoint.Weights {
	t.Helper()
	w, err := checkpoint.GenWeights(c, checkpoint.GenOfficial, seed)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
