package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/megamoe/megamoe/api"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/internal/testctx"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

// idleModel is an engine model that is never stepped: the engine is not
// run, so every request stays queued.
type idleModel struct {
	cache *kvcache.Manager
	vocab int
}

func (m idleModel) Forward([]engine.ForwardItem) ([][]float32, error) {
	panic("idleModel: not stepped")
}
func (m idleModel) FreeSequence(s *kvcache.Sequence) { m.cache.Free(s) }
func (m idleModel) Cache() *kvcache.Manager          { return m.cache }
func (m idleModel) Vocab() int                       { return m.vocab }

// TestQueuedPerConnFlag checks the server serves HTTP/2 without TLS and that
// --max-queued-per-conn bounds one connection's waiting requests: with the
// engine not stepping, the first stream on an HTTP/2 connection waits, the
// second gets a 429 with Retry-After, and another connection may still queue.
func TestQueuedPerConnFlag(t *testing.T) {
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--max-queued-per-conn", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cache := kvcache.NewManager(kvcache.Layout{BlockTokens: 8, StateBytes: 64, BlockBytes: 64}, 1<<20)
	eng, err := engine.New(idleModel{cache: cache, vocab: tok.VocabSize()}, engine.Config{MaxModelLen: 256})
	if err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.TestMode)
	h := api.New(eng, tok, apiConfig(o, "m", nil, slog.New(slog.DiscardHandler), context.Background()))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(ln.Addr().String(), h, o)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "http://" + ln.Addr().String() + "/v1/completions"

	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: &http.Transport{Protocols: &p}}
	ctx := testctx.New(t)
	post := func(client *http.Client) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"stream":true,"max_tokens":2,"prompt":"hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	cases := []struct {
		name   string
		client *http.Client
		status int
		proto  int
	}{
		{"first on the HTTP/2 connection waits", h2, http.StatusOK, 2},
		{"second on it is over the bound", h2, http.StatusTooManyRequests, 2},
		{"another connection waits", &http.Client{Transport: &http.Transport{}}, http.StatusOK, 1},
	}
	for _, c := range cases {
		resp := post(c.client)
		if resp.StatusCode != c.status || resp.ProtoMajor != c.proto {
			t.Fatalf("%s: status %d over HTTP/%d, want %d over HTTP/%d", c.name, resp.StatusCode, resp.ProtoMajor, c.status, c.proto)
		}
		if c.status == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: no Retry-After", c.name)
		}
	}
}
