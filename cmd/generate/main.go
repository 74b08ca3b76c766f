// Command generate runs the DeepSeek-V4 forward pass on the CPU reference
// backend: a prompt (token ids, or text once a tokenizer is available), chunked
// prefill, greedy decode steps, and an optional safetensors dump of every
// logits row.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/engine"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/safetensors"
)

type flags struct {
	model, prompt, tokens, dump, numerics, device string
	steps, chunk, threads                         int
	trace, graphs                                 bool
	ppl                                           pplFlags
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func parseTokens(s string) ([]int32, error) {
	var out []int32
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--tokens: %q is not a token id", f)
		}
		out = append(out, int32(v))
	}
	if len(out) == 0 {
		return nil, errors.New("--tokens: no token ids")
	}
	return out, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	var f flags
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.model, "model", "", "checkpoint directory (default: the embedded small checkpoint), or synth:small, synth:flash:N or synth:pro:N (N layers of random weights, in memory)")
	fs.StringVar(&f.prompt, "prompt", "", "prompt text (needs tokenizer.json in the model directory)")
	fs.StringVar(&f.tokens, "tokens", "", "prompt as comma-separated token ids, e.g. 0,17,42")
	fs.IntVar(&f.steps, "steps", 16, "greedy decode steps")
	fs.StringVar(&f.dump, "dump-logits", "", "write logits [positions, vocab] F32 and tokens I64 to this safetensors file")
	fs.IntVar(&f.chunk, "chunk", 0, "feed the prompt in chunks of N tokens (0 = all at once)")
	fs.StringVar(&f.numerics, "numerics", "faithful", "faithful | exact")
	fs.BoolVar(&f.trace, "trace-nonfinite", false, "check every sub-layer for NaN/Inf and report the first one")
	fs.BoolVar(&f.graphs, "cuda-graphs", true, "record decode steps as CUDA graphs and replay them (--device cuda)")
	fs.IntVar(&f.threads, "threads", 0, "CPU worker threads (0 = GOMAXPROCS)")
	fs.StringVar(&f.device, "device", "cpu", "cpu | cuda")
	fs.StringVar(&f.ppl.file, "perplexity", "", "print the perplexity of this file (uint16 token ids if it ends in .bin, else text) instead of generating")
	fs.IntVar(&f.ppl.window, "ppl-window", 256, "with --perplexity: tokens per evaluated window")
	fs.IntVar(&f.ppl.tokens, "ppl-tokens", 200000, "with --perplexity: evaluate at most this many tokens (0 = all)")
	var spec engine.SpecConfig
	fs.Func("speculative-config", `decode through the engine with drafts, e.g. {"method":"mtp","num_speculative_tokens":2} or {"method":"dspark"}`, func(v string) (err error) {
		spec, err = engine.ParseSpecConfig(v)
		return err
	})
	numSpec := fs.Int("num-speculative-tokens", 0, "draft this many tokens per step with the MTP block (--speculative-config with method mtp)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := spec.WithNumTokens(*numSpec); err != nil {
		return err
	}
	if spec.Enabled() && (f.dump != "" || f.chunk != 0) {
		return errors.New("--dump-logits and --chunk do not combine with speculative decoding")
	}
	if f.steps < 0 || f.chunk < 0 {
		return errors.New("--steps and --chunk must be >= 0")
	}
	w, tok, err := loadModel(f.model)
	if err != nil {
		return err
	}
	if err := spec.CheckCheckpoint(w.Config); err != nil {
		return err
	}
	var prompt []int32
	switch {
	case f.tokens != "" && f.prompt != "":
		return errors.New("use either --prompt or --tokens")
	case f.tokens != "":
		if prompt, err = parseTokens(f.tokens); err != nil {
			return err
		}
	case f.prompt != "":
		if tok == nil {
			return errors.New("--prompt needs a tokenizer, which this build/model does not have; use --tokens")
		}
		if prompt, err = tok(f.prompt); err != nil {
			return err
		}
	default:
		prompt = []int32{int32(w.Config.BOS)}
	}
	t0 := time.Now()
	var be backend.Backend
	switch f.device {
	case "cpu":
	case "cuda":
		g, err := gpu.New(gpu.Options{Graphs: f.graphs})
		if err != nil {
			return fmt.Errorf("--device cuda: %w", err)
		}
		defer g.Close()
		be = g
	default:
		return fmt.Errorf("--device %q, want cpu or cuda", f.device)
	}
	m, err := model.New(w, be, model.Options{Numerics: f.numerics, Threads: f.threads, TraceNonFinite: f.trace, DSparkRows: spec.DSparkRows(), Drafts: spec.Drafts()})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "model ready in %v (%d layers, dim %d, vocab %d)\n", time.Since(t0).Round(time.Millisecond), w.Config.Layers, w.Config.Dim, w.Config.Vocab)
	if spec.Enabled() {
		return generateSpec(m, prompt, f.steps, spec, stdout, stderr)
	}
	if f.ppl.file != "" {
		ids, err := loadPPLTokens(f.ppl.file, int32(w.Config.BOS), tok)
		if err != nil {
			return fmt.Errorf("--perplexity: %w", err)
		}
		return perplexity(m, ids, f.ppl, stdout)
	}
	seq := m.Cache().NewSequence()
	defer m.FreeSequence(seq)
	var rows [][]float32
	var rowTokens []int32
	t1 := time.Now()
	chunk := f.chunk
	if chunk == 0 {
		chunk = len(prompt)
	}
	for i := 0; i < len(prompt); i += chunk {
		part := prompt[i:min(i+chunk, len(prompt))]
		out, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: seq, Tokens: part, AllLogits: true}}})
		if err != nil {
			return fmt.Errorf("prefill at position %d: %w", i, err)
		}
		rows = append(rows, out.Rows(0)...)
		rowTokens = append(rowTokens, part...)
	}
	prefill := time.Since(t1)
	t2 := time.Now()
	var gen []int32
	for range f.steps {
		next := engine.Argmax(rows[len(rows)-1])
		gen = append(gen, next)
		out, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: seq, Tokens: []int32{next}}}})
		if err != nil {
			return fmt.Errorf("decode at position %d: %w", seq.Len(), err)
		}
		rows = append(rows, out.Last(0))
		rowTokens = append(rowTokens, next)
	}
	decode := time.Since(t2)
	ids := make([]string, len(gen))
	for i, g := range gen {
		ids[i] = strconv.Itoa(int(g))
	}
	fmt.Fprintln(stdout, strings.Join(ids, ","))
	fmt.Fprintf(stderr, "prefill %d tokens in %v (%.1f tok/s), decode %d tokens in %v (%.1f tok/s)\n",
		len(prompt), prefill.Round(time.Millisecond), float64(len(prompt))/prefill.Seconds(),
		f.steps, decode.Round(time.Millisecond), float64(f.steps)/math.Max(decode.Seconds(), 1e-9))
	if f.dump != "" {
		if err := dump(f.dump, rows, rowTokens); err != nil {
			return err
		}
	}
	return nil
}

func dump(path string, rows [][]float32, toks []int32) error {
	vocab := len(rows[0])
	flat := make([]float32, 0, len(rows)*vocab)
	for _, r := range rows {
		flat = append(flat, r...)
	}
	lb := make([]byte, 4*len(flat))
	num.EncodeF32(flat, lb)
	tb := make([]byte, 8*len(toks))
	for i, t := range toks {
		binary.LittleEndian.PutUint64(tb[8*i:], uint64(int64(t)))
	}
	w := safetensors.NewWriter()
	if err := w.Add("logits", safetensors.F32, []int{len(rows), vocab}, lb); err != nil {
		return err
	}
	if err := w.Add("tokens", safetensors.I64, []int{len(toks)}, tb); err != nil {
		return err
	}
	if err := w.WriteFile(path, map[string]string{"producer": "megamoe cmd/generate"}); err != nil {
		return fmt.Errorf("dump logits: %w", err)
	}
	return nil
}
