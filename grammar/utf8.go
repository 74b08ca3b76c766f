package grammar

import (
	"sort"
	"unicode/utf8"
)

// runeRange is an inclusive range of code points.
type runeRange struct{ lo, hi rune }

// normalize sorts and merges ranges and removes surrogates (not encodable in UTF-8).
func normalize(rs []runeRange) []runeRange {
	var out []runeRange
	for _, r := range rs {
		if r.lo > r.hi {
			continue
		}
		if r.hi > utf8.MaxRune {
			r.hi = utf8.MaxRune
		}
		if r.lo <= 0xDFFF && r.hi >= 0xD800 {
			if r.lo < 0xD800 {
				out = append(out, runeRange{r.lo, 0xD7FF})
			}
			if r.hi > 0xDFFF {
				out = append(out, runeRange{0xE000, r.hi})
			}
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lo < out[j].lo })
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && r.lo <= merged[n-1].hi+1 {
			merged[n-1].hi = max(merged[n-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

// negate returns the code points (minus surrogates) not in rs.
func negate(rs []runeRange) []runeRange {
	rs = normalize(rs)
	var out []runeRange
	next := rune(0)
	for _, r := range rs {
		if r.lo > next {
			out = append(out, runeRange{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, runeRange{next, utf8.MaxRune})
	}
	return normalize(out)
}

// classNode matches one UTF-8 encoded code point in rs. ASCII goes into one byte set; longer
// encodings become sequences of byte ranges (the usual UTF-8 range split).
func classNode(rs []runeRange) *node {
	rs = normalize(rs)
	var ascii byteSet
	var seqs [][][2]byte
	for _, r := range rs {
		if r.lo < 0x80 {
			ascii.addRange(byte(r.lo), byte(min(r.hi, 0x7F)))
			if r.hi < 0x80 {
				continue
			}
			r.lo = 0x80
		}
		seqs = splitUTF8(r.lo, r.hi, seqs)
	}
	var alts []*node
	if ascii.count() > 0 {
		alts = append(alts, setNode(ascii))
	}
	for _, s := range seqs {
		n := &node{op: opSeq}
		for _, br := range s {
			var b byteSet
			b.addRange(br[0], br[1])
			n.kids = append(n.kids, setNode(b))
		}
		alts = append(alts, n)
	}
	if len(alts) == 0 {
		return &node{op: opBytes} // empty set: matches nothing
	}
	if len(alts) == 1 {
		return alts[0]
	}
	return alt(alts...)
}

var utf8Max = [...]rune{0x7F, 0x7FF, 0xFFFF, utf8.MaxRune}

// splitUTF8 appends byte-range sequences matching exactly the encodings of lo..hi (lo >= 0x80).
func splitUTF8(lo, hi rune, out [][][2]byte) [][][2]byte {
	for _, m := range utf8Max[:3] {
		if lo <= m && hi > m {
			out = splitUTF8(lo, m, out)
			return splitUTF8(m+1, hi, out)
		}
	}
	n := utf8.RuneLen(lo)
	for i := 1; i < n; i++ {
		m := rune(1)<<(6*i) - 1
		if lo&^m != hi&^m {
			if lo&m != 0 {
				out = splitUTF8(lo, lo|m, out)
				return splitUTF8((lo|m)+1, hi, out)
			}
			if hi&m != m {
				out = splitUTF8(lo, (hi&^m)-1, out)
				return splitUTF8(hi&^m, hi, out)
			}
		}
	}
	var a, b [4]byte
	utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(b[:], hi)
	s := make([][2]byte, n)
	for i := range n {
		s[i] = [2]byte{a[i], b[i]}
	}
	return append(out, s)
}

// runeLit matches the UTF-8 encoding of one code point.
func runeLit(r rune) *node { return lit(string(r)) }
