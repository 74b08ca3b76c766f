package api

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/megamoe/megamoe/tokenizer"
)

// streamLines posts a streaming request and returns the response (status and
// headers in) and a reader of its lines.
func streamLines(t *testing.T, ctx context.Context, url, body string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, bufio.NewReader(resp.Body)
}

// TestQueuedStreamKeepAlive checks a streaming request waiting in the queue
// gets its 200 and SSE comment keep-alives before its first token, then its
// stream.
func TestQueuedStreamKeepAlive(t *testing.T) {
	srv, eng := startServerWith(t, Config{KeepAlive: 20 * time.Millisecond}, 4, nil) // one running sequence
	eos, _ := goldenTokenizer(t).TokenID(tokenizer.EOS)
	noEOS := strconv.Itoa(eos) // biased away: the busy stream runs until stopped
	busyCtx, stopBusy := context.WithCancel(t.Context())
	defer stopBusy()
	busyDone := make(chan struct{})
	go func() { // holds the only sequence slot until stopped
		defer close(busyDone)
		resp, br := streamLines(t, busyCtx, srv.URL+"/v1/chat/completions",
			`{"stream":true,"max_tokens":1000,"logit_bias":{"`+noEOS+`":-100},"messages":[{"role":"user","content":"go on"}]}`)
		_ = resp
		for {
			if _, err := br.ReadString('\n'); err != nil {
				return
			}
		}
	}()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for eng.Stats().Running == 0 {
		select {
		case <-tick.C:
		case <-t.Context().Done():
			return
		}
	}
	resp, br := streamLines(t, t.Context(), srv.URL+"/v1/completions", `{"stream":true,"max_tokens":2,"prompt":"hi"}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("queued stream: status %d, %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for eng.Stats().Waiting != 1 { // it waits behind the busy stream
		select {
		case <-tick.C:
		case <-t.Context().Done():
			return
		}
	}
	line, err := br.ReadString('\n')
	if err != nil || line != ": keep-alive\n" {
		t.Fatalf("first line %q (%v), want a keep-alive comment", line, err)
	}
	stopBusy()
	<-busyDone
	var last string
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			last = line
		}
		if err != nil {
			break
		}
	}
	if last != "data: [DONE]\n" {
		t.Errorf("stream ended with %q", last)
	}
}

// TestShutdownEndsStreams checks that when Config.Shutdown ends (the drain
// timed out), a running stream gets an error event and [DONE].
func TestShutdownEndsStreams(t *testing.T) {
	eos, _ := goldenTokenizer(t).TokenID(tokenizer.EOS)
	bias := `"logit_bias":{"` + strconv.Itoa(eos) + `":-100},`
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		t.Run(path, func(t *testing.T) {
			shutdown, abort := context.WithCancel(t.Context())
			defer abort()
			srv, _ := startServerWith(t, Config{Shutdown: shutdown}, 0, nil)
			body := `{"stream":true,"max_tokens":1000,` + bias + `"prompt":"go on"}`
			if strings.Contains(path, "chat") {
				body = `{"stream":true,"max_tokens":1000,` + bias + `"messages":[{"role":"user","content":"go on"}]}`
			}
			resp, br := streamLines(t, t.Context(), srv.URL+path, body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			abort()
			var events []string
			for {
				line, err := br.ReadString('\n')
				if strings.HasPrefix(line, "data: ") {
					events = append(events, strings.TrimSpace(strings.TrimPrefix(line, "data: ")))
				}
				if err != nil {
					break
				}
			}
			n := len(events)
			if n < 2 || events[n-1] != "[DONE]" || !strings.Contains(events[n-2], `"code":"shutting_down"`) {
				t.Errorf("stream ended %q, want an error event and [DONE]", events[max(0, n-2):])
			}
		})
	}
}
