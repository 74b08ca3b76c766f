package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// StreamDecoder turns a stream of token ids into text for streaming responses.
// It emits text only once it is complete UTF-8 (a single token may hold part of
// a multi-byte character), holds back any tail that could still grow into one
// of the stop strings, and reports when a stop string appears; the text before
// the stop is emitted, the stop string and everything after it are not.
type StreamDecoder struct {
	tok     *Tokenizer
	stops   []string
	pending []byte // decoded bytes not yet emitted
	stopped bool
}

// NewStreamDecoder starts a stream; empty stop strings are ignored.
func NewStreamDecoder(tok *Tokenizer, stops []string) *StreamDecoder {
	d := &StreamDecoder{tok: tok}
	for _, s := range stops {
		if s != "" {
			d.stops = append(d.stops, s)
		}
	}
	return d
}

// Push adds one token and returns the text that is now safe to emit and whether
// a stop string was hit (after which Push returns nothing).
func (d *StreamDecoder) Push(id int) (string, bool) {
	if d.stopped {
		return "", true
	}
	d.pending = d.tok.appendToken(d.pending, id)
	if text, ok := d.cut(); ok {
		d.stopped = true
		return text, true
	}
	n := completeUTF8(d.pending)
	n = min(n, len(d.pending)-d.heldForStop(d.pending[:n]))
	out := string(d.pending[:n])
	d.pending = append(d.pending[:0], d.pending[n:]...)
	return out, false
}

// Flush returns whatever is still held back (at the end of generation). Bytes
// that never formed complete UTF-8 are emitted as U+FFFD, like HF's decoder.
func (d *StreamDecoder) Flush() string {
	if d.stopped {
		return ""
	}
	out := strings.ToValidUTF8(string(d.pending), "\uFFFD")
	d.pending = d.pending[:0]
	return out
}

// cut finds the earliest stop string in pending and returns the text before it.
func (d *StreamDecoder) cut() (string, bool) {
	best := -1
	for _, s := range d.stops {
		if i := strings.Index(string(d.pending), s); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	if best < 0 {
		return "", false
	}
	return strings.ToValidUTF8(string(d.pending[:best]), "\uFFFD"), true
}

// heldForStop is the length of the longest suffix of b that is a proper prefix
// of some stop string.
func (d *StreamDecoder) heldForStop(b []byte) int {
	held := 0
	for _, s := range d.stops {
		for k := min(len(s)-1, len(b)); k > held; k-- {
			if string(b[len(b)-k:]) == s[:k] {
				held = k
				break
			}
		}
	}
	return held
}

// completeUTF8 is the length of the longest prefix of b that does not end in
// the middle of a multi-byte character (invalid bytes count as complete).
func completeUTF8(b []byte) int {
	for back := 1; back <= utf8.UTFMax && back <= len(b); back++ {
		c := b[len(b)-back]
		if c < 0x80 {
			return len(b)
		}
		if c >= 0xC0 { // a leading byte: is its sequence complete?
			need := 2
			switch {
			case c >= 0xF0:
				need = 4
			case c >= 0xE0:
				need = 3
			}
			if back >= need {
				return len(b)
			}
			return len(b) - back
		}
	}
	return len(b)
}
