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

// TestStreamDecoderBytes checks bytes that never form UTF-8: they become one
// U+FFFD each (as encoding/json writes them), stop strings match that text,
// and every piece is the text of whole tokens.
func TestStreamDecoderBytes(t *testing.T) {
	tok, err := LoadFile("testdata/deepseek_v3_tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	b2u := bytesToUnicode()
	byteID := func(c byte) int {
		id, ok := tok.TokenID(string(b2u[c]))
		if !ok {
			t.Fatalf("no token for byte %#x", c)
		}
		return id
	}
	cases := []struct {
		name    string
		bytes   []byte
		stops   []string
		want    string
		stopped bool
	}{
		{"truncated character at the end", []byte{'a', 0xE4, 0xB8}, nil, "a\uFFFD\uFFFD", false},
		{"invalid byte mid-stream", []byte{0xE4, 'b', 'c'}, nil, "\uFFFDbc", false},
		{"split character", []byte{0xE4, 0xB8, 0x96, '!'}, nil, "世!", false},
		{"stop on U+FFFD mid-stream", []byte{'x', 0xFF, 'y'}, []string{"\uFFFD"}, "x", true},
		{"stop on U+FFFD at the end", []byte{'x', 0xE4}, []string{"x\uFFFD"}, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := NewStreamDecoder(tok, c.stops)
			var got strings.Builder
			stopped := false
			for i, b := range c.bytes {
				s, st := d.Push(byteID(b))
				got.WriteString(s)
				if st {
					stopped = true
					break
				}
				if n := d.Emitted(); n > i+1 {
					t.Fatalf("emitted %d tokens after pushing %d", n, i+1)
				}
			}
			rest, st := d.Finish()
			got.WriteString(rest)
			stopped = stopped || st
			if got.String() != c.want || stopped != c.stopped {
				t.Errorf("got %q stopped=%v, want %q stopped=%v", got.String(), stopped, c.want, c.stopped)
			}
			if d.Emitted() != len(c.bytes) && !stopped {
				t.Errorf("Emitted %d after Finish, want %d", d.Emitted(), len(c.bytes))
			}
		})
	}
}

// TestStreamDecoderTokenAligned checks each piece is exactly the text of the
// tokens Emitted reports, with a held marker never split.
func TestStreamDecoderTokenAligned(t *testing.T) {
	tok, err := LoadFile("testdata/deepseek_v3_tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	text := "thinking about 深度 and </think> the answer 🦀 is here"
	ids := tok.Encode(text)
	d := NewStreamDecoder(tok, []string{"zzz"})
	d.Hold("</think>")
	var got strings.Builder
	done := 0
	for _, id := range ids {
		s, _ := d.Push(id)
		if n := d.Emitted(); s != tok.Decode(ids[done:n]) {
			t.Fatalf("piece %q is not the text of tokens [%d, %d): %q", s, done, n, tok.Decode(ids[done:n]))
		} else {
			done = n
		}
		if strings.HasSuffix(s, "</") || strings.HasSuffix(s, "</think") {
			t.Errorf("piece %q ends inside the held marker", s)
		}
		got.WriteString(s)
	}
	got.WriteString(d.Flush())
	if got.String() != text {
		t.Errorf("got %q, want %q", got.String(), text)
	}
}

// TestStreamDecoderMinTokens checks that a stop string ending in the text of
// the first n tokens does not stop the stream, and one ending later does,
// even where it starts in the protected text.
func TestStreamDecoderMinTokens(t *testing.T) {
	tok, err := LoadFile("testdata/deepseek_v3_tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	const text = "stop here. stop there. stop" // "stop" " here" "." " stop" " there" "." " stop"
	cases := []struct {
		name    string
		stop    string
		min     int
		want    string
		stopped bool
	}{
		{"no min", "stop", 0, "", true},
		{"first token protected", "stop", 1, "stop here. ", true},
		{"four tokens protected", "stop", 4, "stop here. stop there. ", true},
		{"all protected", "stop", 7, text, false},
		{"stop straddles the floor", ". stop", 3, "stop here", true},
		{"first hit ends on the floor", "here.", 3, "stop here. stop t", true},
		{"only hit protected", "here.", 6, text, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := NewStreamDecoder(tok, []string{c.stop})
			d.MinTokens(c.min)
			var b strings.Builder
			stopped := false
			for _, id := range tok.Encode(text) {
				s, st := d.Push(id)
				b.WriteString(s)
				if stopped = st; st {
					break
				}
			}
			if !stopped {
				rest, hit := d.Finish()
				b.WriteString(rest)
				stopped = hit
			}
			if b.String() != c.want || stopped != c.stopped {
				t.Errorf("got %q stopped=%v, want %q stopped=%v", b.String(), stopped, c.want, c.stopped)
			}
		})
	}
}
