package tokenizer

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// StreamDecoder turns a stream of token ids into text for streaming responses,
// in time linear in the output. It emits text only at token boundaries and once
// it is complete UTF-8 (a single token may hold part of a multi-byte
// character), holds back any tail that could still grow into one of the stop
// strings or held markers, and reports when a stop string appears; the text
// before the stop is emitted, the stop string and everything after it are not.
//
// Bytes that can no longer form UTF-8 become U+FFFD, one per byte as
// encoding/json writes them, so stop strings match the text clients see.
type StreamDecoder struct {
	tok      *Tokenizer
	stops    []string
	holds    []string // held back like stop strings, without stopping
	skip     bool     // drop special tokens' text ...
	keep     []int    // ... except these tokens'
	maxStop  int
	raw      []byte // an incomplete UTF-8 tail not yet in text
	text     []byte // visible text not yet emitted
	scanned  int    // text[:scanned] was searched for stops
	ends     []int  // per unemitted token: its end in text, -1 while it ends in raw
	pushed   int
	emitted  int // tokens whose text has all been emitted
	stopped  bool
	withStop bool // a stop string hit is emitted too
	minStop  int  // stop strings must end in the text of a later token than this one
	floor    int  // text[:floor] is the first minStop tokens': no stop ends there
}

// NewStreamDecoder starts a stream; empty stop strings are ignored.
func NewStreamDecoder(tok *Tokenizer, stops []string) *StreamDecoder {
	d := &StreamDecoder{tok: tok}
	for _, s := range stops {
		if s != "" {
			d.stops = append(d.stops, s)
			d.maxStop = max(d.maxStop, len(s))
		}
	}
	return d
}

// Hold makes the decoder hold back any tail that could grow into one of
// markers, so a caller splitting the text at a marker sees it in one piece
// unless a token boundary falls inside it.
func (d *StreamDecoder) Hold(markers ...string) {
	for _, m := range markers {
		if m != "" {
			d.holds = append(d.holds, m)
		}
	}
}

// IncludeStop makes a hit stop string part of the emitted text
// (include_stop_str_in_output).
func (d *StreamDecoder) IncludeStop() { d.withStop = true }

// MinTokens makes stop strings count only where they end in the text of
// token n+1 or later (vLLM's min_tokens): earlier text never stops the stream.
func (d *StreamDecoder) MinTokens(n int) { d.minStop = n }

// SkipSpecial drops the text of special tokens (as skip_special_tokens does),
// except that of the tokens keep, which the caller needs to see (e.g. </think>
// to split reasoning from the answer).
func (d *StreamDecoder) SkipSpecial(keep ...int) {
	d.skip, d.keep = true, keep
}

// Push adds one token and returns the text that is now safe to emit and whether
// a stop string was hit (after which Push returns nothing).
func (d *StreamDecoder) Push(id int) (string, bool) {
	if d.stopped {
		return "", true
	}
	d.pushed++
	if !d.skip || !d.tok.IsSpecial(id) || slices.Contains(d.keep, id) {
		d.raw = d.tok.appendToken(d.raw, id)
	}
	n := completeUTF8(d.raw)
	d.text = appendVisible(d.text, d.raw[:n])
	d.raw = append(d.raw[:0], d.raw[n:]...)
	d.ends = append(d.ends, -1)
	if len(d.raw) == 0 { // every open token's bytes are now text
		for i := len(d.ends) - 1; i >= 0 && d.ends[i] < 0; i-- {
			d.ends[i] = len(d.text)
		}
	}
	if text, ok := d.cut(); ok {
		return text, true
	}
	limit := len(d.text) - d.held()
	k := 0
	for k < len(d.ends) && d.ends[k] >= 0 && d.ends[k] <= limit {
		k++
	}
	if k == 0 {
		return "", false
	}
	n = d.ends[k-1]
	out := string(d.text[:n])
	d.text = append(d.text[:0], d.text[n:]...)
	d.scanned -= n
	d.floor = max(0, d.floor-n)
	d.ends = append(d.ends[:0], d.ends[k:]...)
	for i := range d.ends {
		if d.ends[i] >= 0 {
			d.ends[i] -= n
		}
	}
	d.emitted += k
	return out, false
}

// Emitted is the number of pushed tokens whose text has all been emitted (all
// of them once a stop string was hit or the stream was finished).
func (d *StreamDecoder) Emitted() int { return d.emitted }

// Finish ends the stream: it returns whatever is still held back and whether a
// stop string appears in it (the text is then cut before the stop). A
// trailing incomplete character becomes U+FFFD, one per byte.
func (d *StreamDecoder) Finish() (string, bool) {
	if d.stopped {
		return "", true
	}
	d.text = appendVisible(d.text, d.raw)
	d.raw = d.raw[:0]
	if text, ok := d.cut(); ok {
		return text, true
	}
	out := string(d.text)
	d.text, d.ends, d.scanned, d.emitted = d.text[:0], d.ends[:0], 0, d.pushed
	return out, false
}

// Flush is Finish without the stop report.
func (d *StreamDecoder) Flush() string {
	s, _ := d.Finish()
	return s
}

// cut looks for a stop string in the text not yet searched (a stop that
// starts earlier would already have been found) and, on a hit, ends the
// stream with the text before it.
func (d *StreamDecoder) cut() (string, bool) {
	if d.pushed <= d.minStop {
		d.floor, d.scanned = len(d.text), len(d.text)
		return "", false
	}
	from := max(0, d.scanned-d.maxStop+1)
	d.scanned = len(d.text)
	best, end := -1, 0
	for _, s := range d.stops {
		// The first hit that ends past the floor.
		for at := from; at <= len(d.text); {
			i := strings.Index(string(d.text[at:]), s)
			if i < 0 {
				break
			}
			if at+i+len(s) > d.floor {
				if best < 0 || at+i < best {
					best, end = at+i, at+i+len(s)
				}
				break
			}
			at += i + 1
		}
	}
	if best < 0 {
		return "", false
	}
	d.stopped, d.emitted = true, d.pushed
	if d.withStop {
		return string(d.text[:end]), true
	}
	return string(d.text[:best]), true
}

// held is the length of the longest suffix of the text that is a proper prefix
// of some stop string or held marker.
func (d *StreamDecoder) held() int {
	h := 0
	for _, set := range [][]string{d.stops, d.holds} {
		for _, s := range set {
			if k := heldSuffix(d.text, s); k > h {
				h = k
			}
		}
	}
	return h
}

// heldSuffix is the length of the longest suffix of b that is a proper prefix of s.
func heldSuffix[B ~[]byte | ~string](b B, s string) int {
	for k := min(len(s)-1, len(b)); k > 0; k-- {
		if string(b[len(b)-k:]) == s[:k] {
			return k
		}
	}
	return 0
}

// appendVisible appends b with each byte that is not part of a valid UTF-8
// sequence replaced by U+FFFD, as encoding/json does.
func appendVisible(dst, b []byte) []byte {
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, "\uFFFD"...)
		} else {
			dst = append(dst, b[:size]...)
		}
		b = b[size:]
	}
	return dst
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
