package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

// specWords make the default prompts, the README's kind of chat question.
var specWords = []string{
	"lantern", "river", "harvest", "window", "bicycle", "whisper", "mountain", "candle", "library", "thunder",
	"garden", "mirror", "journey", "blanket", "orchestra", "pepper", "ladder", "compass", "meadow", "kettle",
}

// specFlags are the options of `bench spec`.
type specFlags struct {
	model, chats, device string
	draftCounts          []int
	temps                []float64
	maxTokens            int
	seed                 uint64
}

func parseSpec(args []string, stderr io.Writer) (*specFlags, error) {
	f := specFlags{}
	fs := flag.NewFlagSet("bench spec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.model, "model", "", "checkpoint directory (default: the embedded small checkpoint)")
	fs.StringVar(&f.chats, "chats", "", "JSON lines with a \"messages\" list each (train/data.py's chat-heldout.jsonl): the first user message of each is a prompt (default: 20 questions \"What does the word \\\"W\\\" mean?\")")
	fs.StringVar(&f.device, "device", "cpu", "cpu | cuda")
	counts := fs.String("num-speculative-tokens", "1,2,3", "draft counts N to measure, comma-separated")
	temps := fs.String("temperature", "0,1", "sampling temperatures, comma-separated")
	fs.IntVar(&f.maxTokens, "max-tokens", 64, "generated tokens per prompt at most (answers end at EOS)")
	fs.Uint64Var(&f.seed, "seed", 1, "sampling seed of the first prompt (prompt i uses seed+i)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, s := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > engine.MaxSpeculativeTokens {
			return nil, fmt.Errorf("--num-speculative-tokens %q: want integers in [1, %d]", s, engine.MaxSpeculativeTokens)
		}
		f.draftCounts = append(f.draftCounts, n)
	}
	for _, s := range strings.Split(*temps, ",") {
		t, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || t < 0 || t > 2 {
			return nil, fmt.Errorf("--temperature %q: want numbers in [0, 2]", s)
		}
		f.temps = append(f.temps, t)
	}
	switch {
	case f.maxTokens < 1:
		return nil, errors.New("--max-tokens must be >= 1")
	case f.device != "cpu" && f.device != "cuda":
		return nil, fmt.Errorf("--device %q, want cpu or cuda", f.device)
	}
	return &f, nil
}

// runSpec measures the MTP drafts' acceptance on a trained model: every
// prompt is answered through the engine with N drafts per step, at each
// temperature; at temperature 0 the answers are checked against plain
// decoding's.
func runSpec(args []string, stdout, stderr io.Writer) error {
	f, err := parseSpec(args, stderr)
	if err != nil {
		return err
	}
	dir := f.model
	if dir == "" {
		if dir, err = models.ExtractSmall(); err != nil {
			return err
		}
	}
	w, tok, _, err := models.Open(dir)
	if err != nil {
		return err
	}
	if tok == nil {
		return fmt.Errorf("--model %s: no tokenizer", dir)
	}
	questions := make([]string, len(specWords))
	for i, wd := range specWords {
		questions[i] = fmt.Sprintf("What does the word %q mean?", wd)
	}
	if f.chats != "" {
		if questions, err = readChats(f.chats); err != nil {
			return err
		}
	}
	prompts := make([][]int32, len(questions))
	for i, q := range questions {
		text, err := tokenizer.EncodeChat([]tokenizer.Message{{Role: "user", Content: q}}, nil, tokenizer.ChatOptions{})
		if err != nil {
			return fmt.Errorf("prompt %d: %w", i, err)
		}
		for _, id := range tok.Encode(text) {
			prompts[i] = append(prompts[i], int32(id))
		}
	}
	var be backend.Backend
	if f.device == "cuda" {
		g, err := gpu.New(gpu.Options{Graphs: true})
		if err != nil {
			return fmt.Errorf("--device cuda: %w", err)
		}
		defer g.Close()
		be = g
	}
	m, err := model.New(w, be, model.Options{Drafts: slices.Max(f.draftCounts)}) // the cache's slack for the most drafts measured
	if err != nil {
		return err
	}
	if !m.HasMTP() {
		return fmt.Errorf("--model %s: the checkpoint has no MTP block", dir)
	}
	fmt.Fprintf(stdout, "model %s  device %s  %d prompts  max_tokens %d (to EOS)\n", dir, f.device, len(prompts), f.maxTokens)
	for _, temp := range f.temps {
		plain, took, err := answer(m, prompts, w.Config.EOS, f, temp, engine.SpecConfig{})
		if err != nil {
			return fmt.Errorf("plain decoding at temperature %g: %w", temp, err)
		}
		fmt.Fprintf(stdout, "temperature %g  no drafts: %d tokens in %v\n", temp, count(plain), took.Round(time.Millisecond))
		for _, n := range f.draftCounts {
			sc := engine.SpecConfig{Method: "mtp", NumTokens: n}
			outs, took, st, err := answerSpec(m, prompts, w.Config.EOS, f, temp, sc)
			if err != nil {
				return fmt.Errorf("N=%d at temperature %g: %w", n, temp, err)
			}
			same := ""
			if temp == 0 {
				same = "  outputs identical to plain decoding: yes"
				if !slices.EqualFunc(outs, plain, slices.Equal) {
					same = "  outputs identical to plain decoding: NO"
				}
			}
			per := make([]string, len(st.PerPos))
			for j, a := range st.PerPos {
				per[j] = strconv.FormatFloat(float64(a)/float64(max(st.Steps, 1)), 'f', 3, 64)
			}
			fmt.Fprintf(stdout, "temperature %g  N=%d: %d tokens, %d verifications, mean acceptance length %.3f, acceptance per position %s, in %v%s\n",
				temp, n, count(outs), st.Steps, st.MeanAcceptance(), strings.Join(per, " "), took.Round(time.Millisecond), same)
		}
	}
	return nil
}

// answer decodes every prompt through one engine (all in one batch) and
// returns the generated ids per prompt.
func answer(m *model.Model, prompts [][]int32, eos int, f *specFlags, temp float64, sc engine.SpecConfig) ([][]int32, time.Duration, error) {
	outs, took, _, err := answerSpec(m, prompts, eos, f, temp, sc)
	return outs, took, err
}

func answerSpec(m *model.Model, prompts [][]int32, eos int, f *specFlags, temp float64, sc engine.SpecConfig) ([][]int32, time.Duration, engine.SpecStats, error) {
	longest := 0
	for _, p := range prompts {
		longest = max(longest, len(p))
	}
	eng, err := engine.New(engine.FromModel(m), engine.Config{MaxNumSeqs: len(prompts), MaxModelLen: longest + f.maxTokens + 1,
		MaxBatchTokens: max(512, len(prompts)*(sc.NumTokens+1)), Speculative: sc})
	if err != nil {
		return nil, 0, engine.SpecStats{}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = eng.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	t0 := time.Now()
	streams := make([]*engine.Stream, len(prompts))
	for i, p := range prompts {
		seed := f.seed + uint64(i)
		streams[i], err = eng.Submit(&engine.Request{Prompt: p, MaxTokens: f.maxTokens, StopTokens: []int32{int32(eos)},
			Params: engine.SamplingParams{Temperature: temp, Seed: &seed}})
		if err != nil {
			return nil, 0, engine.SpecStats{}, fmt.Errorf("prompt %d: %w", i, err)
		}
	}
	outs := make([][]int32, len(prompts))
	for i, st := range streams {
		for fin := false; !fin; {
			<-st.Ready()
			ev, ok := st.Next()
			if !ok {
				continue
			}
			for _, t := range ev.Tokens {
				outs[i] = append(outs[i], t.ID)
			}
			if ev.Err != nil {
				return nil, 0, engine.SpecStats{}, fmt.Errorf("prompt %d: %w", i, ev.Err)
			}
			fin = ev.Finish != engine.FinishNone
		}
	}
	return outs, time.Since(t0), eng.Stats().Spec, nil
}

func count(outs [][]int32) int {
	n := 0
	for _, o := range outs {
		n += len(o)
	}
	return n
}

// readChats reads the first user message of every line of a chat JSON lines file.
func readChats(path string) ([]string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--chats: %w", err)
	}
	defer fh.Close()
	var qs []string
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		var c struct {
			Messages []struct{ Role, Content string } `json:"messages"`
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, fmt.Errorf("--chats %s:%d: %w", path, line, err)
		}
		i := slices.IndexFunc(c.Messages, func(m struct{ Role, Content string }) bool { return m.Role == "user" })
		if i < 0 {
			return nil, fmt.Errorf("--chats %s:%d: no user message", path, line)
		}
		qs = append(qs, c.Messages[i].Content)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--chats %s: %w", path, err)
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("--chats %s: no chats", path)
	}
	return qs, nil
}
