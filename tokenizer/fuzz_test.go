package tokenizer

import (
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

var (
	fuzzTokOnce sync.Once
	fuzzTok     *Tokenizer
	fuzzTokErr  error
)

// FuzzEncodeDecode: decode(encode(s)) == s for valid UTF-8 that holds no added token.
func FuzzEncodeDecode(f *testing.F) {
	for _, s := range []string{"Hello, world!", "  \t\r\n 123456 深度求索 👨‍👩‍👧", "a\u200db", "x := []int{1}\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fuzzTokOnce.Do(func() { fuzzTok, fuzzTokErr = LoadFile("testdata/deepseek_v3_tokenizer.json.gz") })
		if fuzzTokErr != nil {
			t.Fatal(fuzzTokErr)
		}
		if !utf8.ValidString(s) || strings.Contains(s, "<｜") || strings.Contains(s, "<|EOT|>") {
			return
		}
		if got := fuzzTok.Decode(fuzzTok.Encode(s)); got != s {
			t.Fatalf("round trip %q -> %q", s, got)
		}
	})
}
