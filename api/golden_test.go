package api

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/internal/testctx"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.json")

// goldenPrompts are the CI regression prompts: chat and completion, thinking and
// non-thinking, and one long enough (> one HCA window of 128 tokens) to fill compressed entries.
var goldenPrompts = []struct {
	Name      string
	Chat      []tokenizer.Message
	Opts      tokenizer.ChatOptions
	Text      string
	MaxTokens int
}{
	{Name: "chat hello", Chat: []tokenizer.Message{{Role: "user", Content: "Hello"}}},
	{Name: "chat system", Chat: []tokenizer.Message{{Role: "system", Content: "You are a helpful assistant."}, {Role: "user", Content: "What is 2+2?"}}},
	{Name: "chat multi-turn", Chat: []tokenizer.Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello! How can I help?"}, {Role: "user", Content: "Tell me about the fox."}}},
	{Name: "thinking high", Chat: []tokenizer.Message{{Role: "user", Content: "Why is the sky blue?"}}, Opts: tokenizer.ChatOptions{Thinking: true}},
	{Name: "thinking max", Chat: []tokenizer.Message{{Role: "user", Content: "Prove it."}}, Opts: tokenizer.ChatOptions{Thinking: true, ReasoningEffort: "max"}},
	{Name: "chat cjk", Chat: []tokenizer.Message{{Role: "user", Content: "你好，世界。こんにちは"}}},
	{Name: "completion code", Text: "func main() {\n\tfmt.Println("},
	{Name: "completion prose", Text: "The quick brown fox"},
	{Name: "completion digits", Text: "1 2 3 4 5 6 7 8 9 10 11 12"},
	{Name: "completion long", Text: strings.Repeat("The engine reads the checkpoint, binds every tensor and runs the forward pass. ", 6)},
}

type golden struct {
	Name   string  `json:"name"`
	Prompt []int32 `json:"prompt"`
	Output []int32 `json:"output"`
}

// TestGolden serves the regression prompts with greedy decoding on the embedded
// model and compares the token ids with testdata/golden.json. After an
// intended change, regenerate with: go test ./api -run TestGolden -update
func TestGolden(t *testing.T) {
	_, eng := startServer(t, Config{}, 0)
	got := runGoldens(t, eng)
	if len(got[len(got)-1].Prompt) <= 128 {
		t.Fatalf("long prompt has only %d tokens, want > 128", len(got[len(got)-1].Prompt))
	}
	if *update {
		data, _ := json.MarshalIndent(got, "", " ")
		if err := os.WriteFile(goldenPath, append(data, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want := readGoldens(t)
	if len(want) != len(got) {
		t.Fatalf("%d goldens, %d prompts", len(want), len(got))
	}
	for i := range got {
		if !slices.Equal(got[i].Prompt, want[i].Prompt) || !slices.Equal(got[i].Output, want[i].Output) {
			t.Errorf("%s: prompt %v output %v, golden prompt %v output %v", got[i].Name, got[i].Prompt, got[i].Output, want[i].Prompt, want[i].Output)
		}
	}
}

const goldenPath = "testdata/golden.json"

// readGoldens reads testdata/golden.json.
func readGoldens(t *testing.T) []golden {
	t.Helper()
	data, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatalf("%v (regenerate with -update)", err)
	}
	var want []golden
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	return want
}

// runGoldens generates the regression prompts' greedy outputs on eng.
func runGoldens(t *testing.T, eng *engine.Engine) []golden {
	t.Helper()
	ctx := testctx.New(t)
	tok := goldenTokenizer(t)
	var got []golden
	for _, p := range goldenPrompts {
		text := p.Text
		if p.Chat != nil {
			var err error
			if text, err = tokenizer.EncodeChat(p.Chat, nil, p.Opts); err != nil {
				t.Fatal(err)
			}
		}
		var prompt []int32
		for _, id := range tok.Encode(text) {
			prompt = append(prompt, int32(id))
		}
		st, err := eng.Submit(&engine.Request{Prompt: prompt, Params: engine.SamplingParams{Temperature: 0}, MaxTokens: 12})
		if err != nil {
			t.Fatal(err)
		}
		var out []int32
	wait:
		for {
			select {
			case <-st.Ready():
			case <-ctx.Done():
				t.Fatalf("%s: no finish after %d tokens: %v", p.Name, len(out), context.Cause(ctx))
			}
			for ev, ok := st.Next(); ok; ev, ok = st.Next() {
				for _, tk := range ev.Tokens {
					out = append(out, tk.ID)
				}
				if ev.Err != nil {
					t.Fatalf("%s: %v", p.Name, ev.Err)
				}
				if ev.Finish != engine.FinishNone {
					break wait
				}
			}
		}
		got = append(got, golden{p.Name, prompt, out})
	}
	return got
}

func goldenTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
