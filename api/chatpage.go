package api

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"
)

// chatPageHTML is the chat page served at /: one file, no external resources.
//
//go:embed web/index.html
var chatPageHTML []byte

// chatPage serves the embedded page with a Content-Security-Policy that
// allows only its own inline script and style (by hash) and fetches to this
// origin, so nothing injected into the page could run or load.
func chatPage() (gin.HandlerFunc, error) {
	script, err := inlineBlock(chatPageHTML, "script")
	if err != nil {
		return nil, err
	}
	style, err := inlineBlock(chatPageHTML, "style")
	if err != nil {
		return nil, err
	}
	csp := fmt.Sprintf("default-src 'none'; script-src '%s'; style-src '%s'; connect-src 'self'; "+
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'", cspHash(script), cspHash(style))
	return func(c *gin.Context) {
		h := c.Writer.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		c.Data(http.StatusOK, "text/html; charset=utf-8", chatPageHTML)
	}, nil
}

// inlineBlock returns the text between the page's only <tag> and </tag>.
func inlineBlock(page []byte, tag string) ([]byte, error) {
	open, end := []byte("<"+tag+">"), []byte("</"+tag+">")
	if bytes.Count(page, open) != 1 || bytes.Count(page, end) != 1 {
		return nil, fmt.Errorf("chat page: want exactly one <%s> block", tag)
	}
	i := bytes.Index(page, open) + len(open)
	j := bytes.Index(page, end)
	if j < i {
		return nil, fmt.Errorf("chat page: </%s> before <%s>", tag, tag)
	}
	return page[i:j], nil
}

func cspHash(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}
