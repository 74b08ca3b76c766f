package api

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/internal/testctx"
	"github.com/megamoe/megamoe/tokenizer"
)

// h2cClient speaks HTTP/2 without TLS (prior knowledge): all its requests to
// one server share one connection.
func h2cClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}

// openStream posts a streaming request with client and returns the response
// and a reader of its body (closed at the end of the test).
func openStream(t *testing.T, ctx context.Context, client *http.Client, url, body string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, bufio.NewReader(resp.Body)
}

// waitFor polls the engine's stats until ok holds.
func waitFor(t *testing.T, ctx context.Context, eng *engine.Engine, what string, ok func(engine.Stats) bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !ok(eng.Stats()) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v (stats %+v)", what, context.Cause(ctx), eng.Stats())
		}
	}
}

// TestQueuedPerConnection checks the bound on one connection's waiting
// requests over HTTP/2: with the engine's only slot busy, the bound's worth of
// streams queue, the next request on that connection gets a 429 with
// Retry-After while another connection's request still queues, and once the
// queue moved on the connection may queue again.
func TestQueuedPerConnection(t *testing.T) {
	const bound = 2
	srv, eng := startServerWith(t, Config{MaxQueuedPerConn: bound, KeepAlive: 20 * time.Millisecond}, 16, func(s *http.Server) {
		s.ConnContext = ConnContext
		s.Protocols = new(http.Protocols)
		s.Protocols.SetHTTP1(true)
		s.Protocols.SetUnencryptedHTTP2(true)
	})
	ctx := testctx.New(t)
	eos, _ := goldenTokenizer(t).TokenID(tokenizer.EOS)
	busyCtx, stopBusy := context.WithCancel(ctx)
	defer stopBusy()
	busy, _ := openStream(t, busyCtx, http.DefaultClient, srv.URL+"/v1/completions",
		`{"stream":true,"max_tokens":1000,"logit_bias":{"`+strconv.Itoa(eos)+`":-100},"prompt":"go on"}`)
	if busy.StatusCode != http.StatusOK {
		t.Fatalf("busy stream: status %d", busy.StatusCode)
	}
	waitFor(t, ctx, eng, "the busy stream to run", func(s engine.Stats) bool { return s.Running == 1 })

	h2 := h2cClient()
	const short = `{"stream":true,"max_tokens":2,"n":2,"prompt":"hi"}` // n counts once
	var queued []*bufio.Reader
	for i := range bound {
		resp, br := openStream(t, ctx, h2, srv.URL+"/v1/completions", short)
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
			t.Fatalf("queued stream %d: status %d over HTTP/%d", i, resp.StatusCode, resp.ProtoMajor)
		}
		queued = append(queued, br)
	}
	waitFor(t, ctx, eng, "the streams to queue", func(s engine.Stats) bool { return s.Waiting == 2*bound })

	resp, body := doPost(t, ctx, h2, srv.URL+"/v1/chat/completions", `{"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
	var e struct{ Error struct{ Code string } }
	_ = json.Unmarshal(body, &e)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || e.Error.Code != "too_many_queued_requests" {
		t.Fatalf("over the bound: status %d, Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	other, _ := openStream(t, ctx, &http.Client{Transport: &http.Transport{}}, srv.URL+"/v1/completions", short)
	if other.StatusCode != http.StatusOK {
		t.Fatalf("another connection: status %d", other.StatusCode)
	}

	stopBusy()
	for i, br := range queued {
		rest, err := io.ReadAll(br)
		if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
			t.Fatalf("queued stream %d ended %q (%v)", i, rest, err)
		}
	}
	if resp, body := doPost(t, ctx, h2, srv.URL+"/v1/completions", `{"max_tokens":1,"prompt":"hi"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the queue moved on: status %d: %s", resp.StatusCode, body)
	}
}

// doPost posts body with client and returns the response and its body.
func doPost(t *testing.T, ctx context.Context, client *http.Client, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}
