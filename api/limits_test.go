package api

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestStalledStreamClient checks a streaming client that stops reading is
// dropped once a write has waited the write-idle timeout: the server closes
// the connection while the client still has not read. (Without the timeout
// the write blocks until the test's -timeout.)
func TestStalledStreamClient(t *testing.T) {
	closed := make(chan struct{})
	var once sync.Once
	srv, _ := startServerWith(t, Config{WriteIdleTimeout: 200 * time.Millisecond}, 0, func(hs *http.Server) {
		hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetWriteBuffer(4096) // small buffers: the stream fills them soon
			}
			return ctx
		}
		hs.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed {
				once.Do(func() { close(closed) })
			}
		}
	})
	conn, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	body := `{"stream":true,"max_tokens":1000,"ignore_eos":true,"temperature":0,"messages":[{"role":"user","content":"go on"}]}`
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-t.Context().Done():
	}
}
