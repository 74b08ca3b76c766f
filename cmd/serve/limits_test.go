package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// limitServer serves a handler that reads the whole body, with short
// configured limits, and returns its address.
func limitServer(t *testing.T) string {
	t.Helper()
	o, err := parseFlags([]string{"--read-timeout", "200ms", "--idle-timeout", "200ms", "--max-header-bytes", "4096"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, "body: "+err.Error(), http.StatusRequestTimeout)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(ln.Addr().String(), h, o)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// TestConnectionLimits checks with a raw socket that the server drops a client
// that stalls in its headers or body (slowloris) and an idle keep-alive
// connection, and answers 431 to oversized headers. Each case waits for the
// server to act (bounded by go test -timeout, not a wall-clock deadline).
func TestConnectionLimits(t *testing.T) {
	addr := limitServer(t)
	cases := []struct {
		name   string
		send   string
		status int // of the first response; 0: none expected
	}{
		{"slowloris headers", "POST / HTTP/1.1\r\nHost: x\r\nContent-Le", 0},
		{"slowloris body", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc", 0},
		{"idle keep-alive", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusOK},
		{"oversized headers", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			stop := context.AfterFunc(t.Context(), func() { conn.Close() })
			defer stop()
			if _, err := io.WriteString(conn, c.send); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			if c.status != 0 {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("response: %v", err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != c.status {
					t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
				}
			}
			// The client now stalls or idles: the server must close the connection.
			rest, err := io.ReadAll(br)
			if err != nil {
				t.Fatalf("connection not closed cleanly: %v", err)
			}
			if c.status == 0 && strings.HasPrefix(string(rest), "HTTP/1.1 200") {
				t.Errorf("a stalled request was answered 200: %q", rest)
			}
		})
	}
}

// TestConnectionLimitsHTTP2 checks the same limits hold on HTTP/2 without
// TLS: an idle connection (preface and settings sent, then nothing) is
// closed, and a request whose body stalls is ended rather than served.
func TestConnectionLimitsHTTP2(t *testing.T) {
	addr := limitServer(t)
	t.Run("idle connection", func(t *testing.T) {
		conn, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		stop := context.AfterFunc(t.Context(), func() { conn.Close() })
		defer stop()
		// The client preface, then an empty SETTINGS frame (length 0, type 4).
		if _, err := io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(conn); err != nil {
			t.Fatalf("connection not closed cleanly: %v", err)
		}
	})
	t.Run("stalled body", func(t *testing.T) {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		client := &http.Client{Transport: &http.Transport{Protocols: &p}}
		body, stall := io.Pipe()
		defer stall.Close()
		go func() { _, _ = io.WriteString(stall, "abc") }() // then nothing
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/", body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = 100
		resp, err := client.Do(req)
		if err == nil {
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Fatalf("a stalled body was answered 200: %q", data)
			}
		}
	})
}
