package api

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// TestChatPage checks / serves the embedded page to anyone (the API key
// guards /v1 only) with a CSP that admits exactly its inline script and
// style.
func TestChatPage(t *testing.T) {
	srv, _ := startServer(t, Config{APIKey: "secret"}, 0)
	hash := func(re string) string {
		m := regexp.MustCompile(re).FindSubmatch(chatPageHTML)
		if m == nil {
			t.Fatalf("page has no match for %s", re)
		}
		sum := sha256.Sum256(m[1])
		return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	wantCSP := []string{
		"default-src 'none'",
		"script-src " + hash(`(?s)<script>(.*)</script>`),
		"style-src " + hash(`(?s)<style>(.*)</style>`),
		"connect-src 'self'",
		"base-uri 'none'",
		"form-action 'none'",
		"frame-ancestors 'none'",
	}
	for _, c := range []struct {
		method, path string
		status       int
		body         bool
	}{
		{http.MethodGet, "/", http.StatusOK, true},
		{http.MethodHead, "/", http.StatusOK, false},
		{http.MethodGet, "/?prompt=hi&autosend=1", http.StatusOK, true},
		{http.MethodPost, "/", http.StatusMethodNotAllowed, false},
		{http.MethodGet, "/index.html", http.StatusNotFound, false},
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			resp, body := do(t, srv, c.method, c.path, "", nil)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			if c.status != http.StatusOK {
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
			if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options %q", got)
			}
			csp := strings.Split(resp.Header.Get("Content-Security-Policy"), "; ")
			if strings.Join(csp, "\n") != strings.Join(wantCSP, "\n") {
				t.Errorf("Content-Security-Policy\n%s\nwant\n%s", strings.Join(csp, "\n"), strings.Join(wantCSP, "\n"))
			}
			if want := string(chatPageHTML); c.body && body != want || !c.body && body != "" {
				t.Errorf("body of %d bytes, want the page (%v)", len(body), c.body)
			}
		})
	}
}

// TestChatPageSource keeps the page free of HTML parsing sinks (model text is
// only ever set with textContent or append) and of external resources.
func TestChatPageSource(t *testing.T) {
	page := string(chatPageHTML)
	script, err := inlineBlock(chatPageHTML, "script")
	if err != nil {
		t.Fatal(err)
	}
	style, err := inlineBlock(chatPageHTML, "style")
	if err != nil {
		t.Fatal(err)
	}
	markup := strings.Replace(strings.Replace(page, string(script), "", 1), string(style), "", 1)
	for _, c := range []struct{ what, in, re string }{
		{"innerHTML/outerHTML", page, `(?i)\b(inner|outer)HTML\b`},
		{"insertAdjacentHTML", page, `(?i)insertAdjacentHTML`},
		{"document.write", page, `document\.write`},
		{"DOMParser or createContextualFragment", page, `DOMParser|createContextualFragment`},
		{"srcdoc", page, `(?i)srcdoc`},
		{"eval or Function constructor", page, `\beval\s*\(|\bnew\s+Function\b|\bFunction\s*\(`},
		{"string timers", page, `set(Timeout|Interval)\s*\(\s*["'\x60]`},
		{"event handler set by setAttribute", page, `setAttribute\(\s*["']on`},
		{"inline event handler attribute", markup, `(?i)<[^>]+\son[a-z]+\s*=`},
		{"external script, style, image or frame", markup, `(?i)<(script|link|img|iframe|object|embed)\b[^>]*\b(src|href)\s*=`},
		{"CSS import or url()", string(style), `(?i)@import|url\(`},
	} {
		if loc := regexp.MustCompile(c.re).FindStringIndex(c.in); loc != nil {
			t.Errorf("page uses %s: %q", c.what, c.in[max(0, loc[0]-40):min(len(c.in), loc[1]+40)])
		}
	}
}
