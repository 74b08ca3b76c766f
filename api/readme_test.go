package api

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeExchange: the README's curl request, sent to the embedded model,
// gets the answer the README shows (content and finish_reason).
func TestReadmeExchange(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	body := regexp.MustCompile(`(?s)curl localhost:8000/v1/chat/completions .*?-d '([^']*)'`).FindSubmatch(readme)
	answer := regexp.MustCompile("(?s)which answers[^\n]*\n\n```\n(\\{[^\n]*\\})\n```").FindSubmatch(readme)
	if body == nil || answer == nil {
		t.Fatal("README: no curl request followed by its answer")
	}
	type reply struct {
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
	}
	var want, got reply
	if err := json.Unmarshal(answer[1], &want); err != nil || len(want.Choices) != 1 {
		t.Fatalf("README answer: %v", err)
	}
	srv, _ := startServer(t, Config{ModelName: "megamoe-small"}, 0)
	res, out := post(t, srv, "/v1/chat/completions", string(body[1]), nil)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, out)
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got.Choices) != 1 {
		t.Fatalf("reply %s: %v", out, err)
	}
	if g, w := got.Choices[0], want.Choices[0]; g.Message.Content != w.Message.Content || g.FinishReason != w.FinishReason {
		t.Errorf("answer %q (%s), README shows %q (%s)", g.Message.Content, g.FinishReason, w.Message.Content, w.FinishReason)
	}
	if strings.Contains(got.Choices[0].Message.Content, "<｜") {
		t.Error("a special token in the content")
	}
}
