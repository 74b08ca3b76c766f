package api

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/megamoe/megamoe/internal/testctx"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestOpenAIClient drives the server with the official openai-go client:
// non-streaming, streaming, an API error, and 64 concurrent streams (16 with
// -short) that must all finish with correct usage and leave no goroutines or
// cache behind.
func TestOpenAIClient(t *testing.T) {
	srv, eng := startServer(t, Config{ModelName: "m"}, 0)
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := testctx.New(t)
	params := func(content string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{
			Model:       "m",
			Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)},
			MaxTokens:   openai.Int(4),
			Temperature: openai.Float(0),
		}
	}
	res, err := client.Chat.Completions.New(ctx, params("Hello"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 1 || res.Usage.CompletionTokens < 1 || res.Usage.TotalTokens != res.Usage.PromptTokens+res.Usage.CompletionTokens {
		t.Fatalf("response %+v", res)
	}

	bad := params("x")
	bad.Model = "no-such-model"
	_, err = client.Chat.Completions.New(ctx, bad)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Fatalf("unknown model: %v", err)
	}

	streams := 64
	if testing.Short() {
		streams = 16
	}
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := params("Tell me a story")
			p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			st := client.Chat.Completions.NewStreaming(ctx, p)
			var acc openai.ChatCompletionAccumulator
			for st.Next() {
				acc.AddChunk(st.Current())
			}
			if err := st.Err(); err != nil {
				errs <- err
				return
			}
			if acc.Usage.CompletionTokens < 1 || acc.Usage.CompletionTokens > 4 || acc.Usage.PromptTokens < 1 {
				errs <- errors.New("bad usage in stream")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for {
		st := eng.Stats()
		if st.Running == 0 && st.Waiting == 0 && eng.Cache().UsedBytes() == 0 && runtime.NumGoroutine() <= before+4 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("after the streams: %+v, cache used %d, goroutines %d (before %d)", st, eng.Cache().UsedBytes(), runtime.NumGoroutine(), before)
		}
		time.Sleep(50 * time.Millisecond) // nothing signals the last goroutine's exit
	}
}
