package api

import (
	"testing"

	"github.com/megamoe/megamoe/internal/testctx"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestChoices drives n > 1 through openai-go: greedy choices agree, seeded
// choices follow vLLM's seed+index, streamed chunks are indexed per choice,
// and usage counts the prompt once and the completions of every choice.
func TestChoices(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := testctx.New(t)
	chat := func(n int, temp float64, seed int64) openai.ChatCompletionNewParams {
		p := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Once upon")},
			MaxTokens: openai.Int(4), Temperature: openai.Float(temp), N: openai.Int(int64(n))}
		if seed >= 0 {
			p.Seed = openai.Int(seed)
		}
		return p
	}

	one, err := client.Chat.Completions.New(ctx, chat(1, 0, -1))
	if err != nil {
		t.Fatal(err)
	}
	three, err := client.Chat.Completions.New(ctx, chat(3, 0, -1))
	if err != nil {
		t.Fatal(err)
	}
	if len(three.Choices) != 3 {
		t.Fatalf("n=3: %d choices", len(three.Choices))
	}
	for i, c := range three.Choices {
		if c.Index != int64(i) || c.Message.Content != one.Choices[0].Message.Content || c.FinishReason != one.Choices[0].FinishReason {
			t.Errorf("greedy choice %d: index %d %q (%s), n=1 gave %q (%s)", i, c.Index, c.Message.Content, c.FinishReason,
				one.Choices[0].Message.Content, one.Choices[0].FinishReason)
		}
	}
	if u := three.Usage; u.PromptTokens != one.Usage.PromptTokens || u.CompletionTokens != 3*one.Usage.CompletionTokens ||
		u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("n=3 usage %+v, n=1 usage %+v", u, one.Usage)
	}

	t.Run("seed offsets", func(t *testing.T) {
		two, err := client.Chat.Completions.New(ctx, chat(2, 1, 41))
		if err != nil {
			t.Fatal(err)
		}
		if two.Choices[0].Message.Content == two.Choices[1].Message.Content {
			t.Errorf("seeded choices agree (%q): each should sample with its own seed", two.Choices[0].Message.Content)
		}
		for i, seed := range []int64{41, 42} {
			alone, err := client.Chat.Completions.New(ctx, chat(1, 1, seed))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := two.Choices[i].Message.Content, alone.Choices[0].Message.Content; got != want {
				t.Errorf("n=2 seed 41 choice %d: %q; n=1 seed %d: %q", i, got, seed, want)
			}
		}
	})

	t.Run("chat stream", func(t *testing.T) {
		p := chat(3, 0, -1)
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := client.Chat.Completions.NewStreaming(ctx, p)
		text, finishes := make([]string, 3), make([]int, 3)
		var usage openai.CompletionUsage
		for st.Next() {
			ch := st.Current()
			if ch.Usage.TotalTokens > 0 {
				usage = ch.Usage
			}
			for _, c := range ch.Choices {
				if c.Index < 0 || c.Index >= 3 {
					t.Fatalf("chunk index %d", c.Index)
				}
				text[c.Index] += c.Delta.Content
				if c.FinishReason != "" {
					finishes[c.Index]++
				}
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if text[i] != one.Choices[0].Message.Content || finishes[i] != 1 {
				t.Errorf("choice %d: streamed %q with %d finish chunks, want %q and 1", i, text[i], finishes[i], one.Choices[0].Message.Content)
			}
		}
		if usage.PromptTokens != one.Usage.PromptTokens || usage.CompletionTokens != 3*one.Usage.CompletionTokens {
			t.Errorf("stream usage %+v, n=1 usage %+v", usage, one.Usage)
		}
	})

	t.Run("completions", func(t *testing.T) {
		p := openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("The fox")},
			MaxTokens: openai.Int(3), Temperature: openai.Float(0), N: openai.Int(2)}
		res, err := client.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Choices) != 2 || res.Choices[0].Text != res.Choices[1].Text || res.Choices[1].Index != 1 || res.Choices[0].Text == "" {
			t.Fatalf("n=2 greedy completions: %+v", res.Choices)
		}
		if res.Usage.CompletionTokens%2 != 0 || res.Usage.TotalTokens != res.Usage.PromptTokens+res.Usage.CompletionTokens {
			t.Errorf("usage %+v", res.Usage)
		}
		st := client.Completions.NewStreaming(ctx, p)
		text := make([]string, 2)
		for st.Next() {
			for _, c := range st.Current().Choices {
				if c.Index < 0 || c.Index >= 2 {
					t.Fatalf("chunk index %d", c.Index)
				}
				text[c.Index] += c.Text
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if text[i] != res.Choices[i].Text {
				t.Errorf("streamed choice %d %q, non-streamed %q", i, text[i], res.Choices[i].Text)
			}
		}
	})
}
