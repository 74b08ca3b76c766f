package tokenizer

import (
	"strings"
	"testing"
)

func TestStreamDecoder(t *testing.T) {
	tok, err := LoadFile("testdata/deepseek_v3_tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, text string
		stops      []string
		want       string
		stopped    bool
	}{
		{"plain", "Hello, world!", nil, "Hello, world!", false},
		{"multibyte emoji", "crab 🦀 and 👨‍👩‍👧 family 深度", nil, "crab 🦀 and 👨‍👩‍👧 family 深度", false},
		{"stop string across tokens", "The answer is 42. END of text", []string{"END"}, "The answer is 42. ", true},
		{"earliest stop wins", "one two three", []string{"three", "two"}, "one ", true},
		{"partial stop released at end", "a b STO", []string{"STOP"}, "a b STO", false},
		{"stop inside multibyte text", "你好世界再见", []string{"世界"}, "你好", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := NewStreamDecoder(tok, c.stops)
			var b strings.Builder
			stopped := false
			for _, id := range tok.Encode(c.text) {
				s, st := d.Push(id)
				if !strings.HasPrefix(c.want, b.String()+s) && !st {
					t.Fatalf("emitted %q beyond the expected %q", b.String()+s, c.want)
				}
				for _, r := range s {
					if r == '\uFFFD' {
						t.Fatalf("emitted an incomplete character in %q", s)
					}
				}
				for _, stop := range c.stops {
					if strings.Contains(b.String()+s, stop) {
						t.Fatalf("stop string %q leaked", stop)
					}
				}
				b.WriteString(s)
				if st {
					stopped = true
					break
				}
			}
			b.WriteString(d.Flush())
			if b.String() != c.want || stopped != c.stopped {
				t.Errorf("got %q stopped=%v, want %q stopped=%v", b.String(), stopped, c.want, c.stopped)
			}
		})
	}
}
