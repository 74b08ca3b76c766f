package api

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/models"
	"github.com/megamoe/megamoe/tokenizer"
)

// failingModel fails every forward pass with an error naming internal ids.
type failingModel struct {
	cache *kvcache.Manager
	vocab int
}

var errInternal = errors.New("kv store: block 4711 of sequence 4242 beyond 3 reserved blocks")

func (m failingModel) Forward([]engine.ForwardItem) ([][]float32, error) { return nil, errInternal }
func (m failingModel) FreeSequence(s *kvcache.Sequence)                  { m.cache.Free(s) }
func (m failingModel) Cache() *kvcache.Manager                           { return m.cache }
func (m failingModel) Vocab() int                                        { return m.vocab }

// A generation the engine fails is a 500 (or a stream's error event) whose
// body names none of the engine's internals.
func TestGenerationFailureHidesInternals(t *testing.T) {
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	tok, err := tokenizer.LoadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	m := failingModel{cache: kvcache.NewManager(kvcache.Layout{BlockTokens: 256, StateBytes: 10, BlockBytes: 10}, 1<<20), vocab: tok.VocabSize()}
	eng, err := engine.New(m, engine.Config{MaxModelLen: 1024})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = eng.Run(ctx); close(done) }()
	gin.SetMode(gin.TestMode)
	srv := httptest.NewServer(New(eng, tok, Config{}))
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"json", `{"messages":[{"role":"user","content":"Hi"}]}`, 500},
		{"stream", `{"stream":true,"messages":[{"role":"user","content":"Hi"}]}`, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, srv, "/v1/chat/completions", tc.body, nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if !strings.Contains(string(body), "generation failed") {
				t.Errorf("body does not report the failure: %s", body)
			}
			for _, internal := range []string{"4711", "4242", "kv store", "block"} {
				if strings.Contains(string(body), internal) {
					t.Errorf("body names %q: %s", internal, body)
				}
			}
		})
	}
}
