// Package tokenizer implements the subset of Hugging Face tokenizer.json that DeepSeek models use:
// added tokens split out first, a Sequence of Split pre-tokenizers (Isolated), ByteLevel byte mapping
// without its own regex, a byte-level BPE model applied by merge rank, and the ByteLevel decoder.
// Anything outside that subset is rejected at load time with an error rather than silently mis-encoded.
package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// Tokenizer encodes text to token ids and back. It is safe for concurrent use.
type Tokenizer struct {
	vocab    map[string]int // BPE vocabulary and added tokens, content -> id
	idToTok  []string       // id -> token string ("" for holes)
	isAdded  []bool         // id -> token is an added token (decoded raw)
	special  []bool         // id -> an added token marked special (skip_special_tokens drops it)
	byteTok  [256]int       // byte -> id of its single-byte BPE token, -1 if absent
	merges   map[uint64]mergeInfo
	added    *trie
	splits   []splitter
	byteDec  map[rune]byte
	maxRunes int

	mu    sync.RWMutex
	cache map[string][]int
}

type mergeInfo struct {
	rank int32
	id   int32
}

// cacheCap bounds the BPE piece cache; when full it is cleared (cheap, and pieces recur quickly).
const cacheCap = 1 << 16

// splitter splits one piece into sub-pieces, appending them to out (all substrings of piece).
type splitter interface {
	split(piece string, out []string) []string
}

// ErrUnsupported is wrapped by load errors for tokenizer.json features this package does not implement.
var ErrUnsupported = errors.New("unsupported tokenizer.json feature")

type fileJSON struct {
	AddedTokens []struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Decoder       json.RawMessage `json:"decoder"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Type                    string            `json:"type"`
		Dropout                 *float64          `json:"dropout"`
		UnkToken                *string           `json:"unk_token"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		ByteFallback            bool              `json:"byte_fallback"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		Vocab                   map[string]int    `json:"vocab"`
		Merges                  []json.RawMessage `json:"merges"`
	} `json:"model"`
}

type component struct {
	Type           string            `json:"type"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        map[string]string `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
}

// LoadFile reads a tokenizer.json (or tokenizer.json.gz) from disk.
func LoadFile(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	if len(data) > 2 && data[0] == 0x1f && data[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
		}
		data, err = io.ReadAll(zr)
		if err != nil {
			return nil, fmt.Errorf("load tokenizer %s: gunzip: %w", path, err)
		}
	}
	t, err := Load(data)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	return t, nil
}

// Load parses tokenizer.json content.
func Load(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	m := &f.Model
	if m.Type != "BPE" && !(m.Type == "" && m.Merges != nil) {
		return nil, fmt.Errorf("model type %q: %w (only BPE)", m.Type, ErrUnsupported)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fmt.Errorf("BPE dropout: %w", ErrUnsupported)
	}
	if m.ByteFallback {
		return nil, fmt.Errorf("BPE byte_fallback: %w", ErrUnsupported)
	}
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") || (m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return nil, fmt.Errorf("BPE subword prefix/suffix: %w", ErrUnsupported)
	}
	if m.IgnoreMerges {
		return nil, fmt.Errorf("BPE ignore_merges: %w", ErrUnsupported)
	}
	if len(m.Vocab) == 0 {
		return nil, errors.New("tokenizer.json: empty BPE vocab")
	}
	if err := checkNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := checkDecoder(f.Decoder); err != nil {
		return nil, err
	}
	t := &Tokenizer{vocab: make(map[string]int, len(m.Vocab)+len(f.AddedTokens)), cache: make(map[string][]int)}
	splits, sawByteLevel, err := buildPreTokenizer(f.PreTokenizer)
	if err != nil {
		return nil, err
	}
	if !sawByteLevel {
		return nil, fmt.Errorf("pre_tokenizer without ByteLevel: %w (only byte-level BPE)", ErrUnsupported)
	}
	t.splits = splits

	maxID := -1
	for s, id := range m.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("tokenizer.json: negative id %d for %q", id, s)
		}
		t.vocab[s] = id
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		if a.LStrip || a.RStrip || a.SingleWord {
			return nil, fmt.Errorf("added token %q with lstrip/rstrip/single_word: %w", a.Content, ErrUnsupported)
		}
		if a.Content == "" || a.ID < 0 {
			return nil, fmt.Errorf("tokenizer.json: bad added token id %d %q", a.ID, a.Content)
		}
		maxID = max(maxID, a.ID)
	}
	if maxID > 1<<24 {
		return nil, fmt.Errorf("tokenizer.json: id %d too large", maxID)
	}
	t.idToTok = make([]string, maxID+1)
	t.isAdded = make([]bool, maxID+1)
	t.special = make([]bool, maxID+1)
	for s, id := range m.Vocab {
		t.idToTok[id] = s
	}
	t.added = newTrie()
	for _, a := range f.AddedTokens {
		t.idToTok[a.ID] = a.Content
		t.isAdded[a.ID] = true
		t.special[a.ID] = a.Special
		t.vocab[a.Content] = a.ID
		t.added.insert(a.Content, a.ID)
	}

	enc := bytesToUnicode()
	t.byteDec = make(map[rune]byte, 256)
	for b := 0; b < 256; b++ {
		t.byteDec[enc[b]] = byte(b)
		t.byteTok[b] = -1
		if id, ok := m.Vocab[string(enc[b])]; ok {
			t.byteTok[b] = id
		}
	}

	t.merges = make(map[uint64]mergeInfo, len(m.Merges))
	for rank, raw := range m.Merges {
		a, b, err := parseMerge(raw)
		if err != nil {
			return nil, fmt.Errorf("merge %d: %w", rank, err)
		}
		ia, oka := m.Vocab[a]
		ib, okb := m.Vocab[b]
		im, okm := m.Vocab[a+b]
		if !oka || !okb || !okm {
			return nil, fmt.Errorf("merge %d (%q %q): token not in vocab", rank, a, b)
		}
		key := uint64(ia)<<32 | uint64(ib)
		if _, dup := t.merges[key]; !dup { // HF keeps the first (lowest) rank
			t.merges[key] = mergeInfo{rank: int32(rank), id: int32(im)}
		}
	}
	return t, nil
}

func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok || a == "" || b == "" || strings.Contains(b, " ") {
			return "", "", fmt.Errorf("malformed merge %q", s)
		}
		return a, b, nil
	}
	var p []string
	if err := json.Unmarshal(raw, &p); err != nil || len(p) != 2 {
		return "", "", fmt.Errorf("malformed merge %s", raw)
	}
	return p[0], p[1], nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

func checkNormalizer(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("normalizer: %w", err)
	}
	if c.Type == "Sequence" {
		for _, n := range c.Normalizers {
			if err := checkNormalizer(n); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("normalizer %q: %w", c.Type, ErrUnsupported)
}

func checkDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("decoder: %w", err)
	}
	if c.Type != "ByteLevel" {
		return fmt.Errorf("decoder %q: %w", c.Type, ErrUnsupported)
	}
	return nil
}

// buildPreTokenizer returns the Split stages in order and whether a ByteLevel stage was seen.
func buildPreTokenizer(raw json.RawMessage) ([]splitter, bool, error) {
	if isNull(raw) {
		return nil, false, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, false, fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch c.Type {
	case "Sequence":
		var out []splitter
		saw := false
		for _, p := range c.Pretokenizers {
			if saw {
				return nil, false, fmt.Errorf("pre_tokenizer stage after ByteLevel: %w", ErrUnsupported)
			}
			s, bl, err := buildPreTokenizer(p)
			if err != nil {
				return nil, false, err
			}
			out = append(out, s...)
			saw = saw || bl
		}
		return out, saw, nil
	case "Split":
		if c.Behavior != "Isolated" || c.Invert {
			return nil, false, fmt.Errorf("Split behavior %q invert=%v: %w (only Isolated)", c.Behavior, c.Invert, ErrUnsupported)
		}
		if re, ok := c.Pattern["Regex"]; ok {
			rx, err := regexp2.Compile(re, regexp2.None)
			if err != nil {
				return nil, false, fmt.Errorf("Split regex %q: %w", re, err)
			}
			return []splitter{regexSplit{rx}}, false, nil
		}
		if s, ok := c.Pattern["String"]; ok && s != "" {
			return []splitter{stringSplit(s)}, false, nil
		}
		return nil, false, fmt.Errorf("Split pattern %v: %w", c.Pattern, ErrUnsupported)
	case "ByteLevel":
		if c.AddPrefixSpace || c.UseRegex == nil || *c.UseRegex {
			return nil, false, fmt.Errorf("ByteLevel pre_tokenizer with add_prefix_space or use_regex: %w", ErrUnsupported)
		}
		return nil, true, nil
	}
	return nil, false, fmt.Errorf("pre_tokenizer %q: %w", c.Type, ErrUnsupported)
}

type regexSplit struct{ rx *regexp2.Regexp }

// split runs the regex over the piece and keeps both matches and the text between them (Isolated).
// regexp2 reports rune offsets; they are mapped back to byte offsets.
func (r regexSplit) split(piece string, out []string) []string {
	runes := []rune(piece)
	offs := make([]int, len(runes)+1)
	o := 0
	for i, c := range runes {
		offs[i] = o
		o += utf8.RuneLen(c)
		if c == utf8.RuneError { // invalid bytes decode to U+FFFD but occupy 1 byte
			_, sz := utf8.DecodeRuneInString(piece[offs[i]:])
			o += sz - 3
		}
	}
	offs[len(runes)] = len(piece)
	prev := 0
	m, err := r.rx.FindRunesMatch(runes)
	for err == nil && m != nil {
		s, e := offs[m.Index], offs[m.Index+m.Length]
		if e > s {
			if s > prev {
				out = append(out, piece[prev:s])
			}
			out = append(out, piece[s:e])
			prev = e
		}
		m, err = r.rx.FindNextMatch(m)
	}
	if prev < len(piece) {
		out = append(out, piece[prev:])
	}
	return out
}

type stringSplit string

func (s stringSplit) split(piece string, out []string) []string {
	for {
		i := strings.Index(piece, string(s))
		if i < 0 {
			break
		}
		if i > 0 {
			out = append(out, piece[:i])
		}
		out = append(out, piece[i:i+len(s)])
		piece = piece[i+len(s):]
	}
	if piece != "" {
		out = append(out, piece)
	}
	return out
}

// bytesToUnicode is GPT-2's reversible byte -> printable rune table.
func bytesToUnicode() [256]rune {
	var t [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}

// VocabSize is the number of ids (highest id + 1).
func (t *Tokenizer) VocabSize() int { return len(t.idToTok) }

// TokenID returns the id of an exact token string (added or BPE vocabulary token).
func (t *Tokenizer) TokenID(s string) (int, bool) {
	id, ok := t.vocab[s]
	return id, ok
}

// TokenString returns the raw token string of an id ("" and false when out of range).
func (t *Tokenizer) TokenString(id int) (string, bool) {
	if id < 0 || id >= len(t.idToTok) || t.idToTok[id] == "" {
		return "", false
	}
	return t.idToTok[id], true
}

// IsAdded reports whether id is an added (special) token.
func (t *Tokenizer) IsAdded(id int) bool { return id >= 0 && id < len(t.isAdded) && t.isAdded[id] }

// IsSpecial reports whether id is an added token that tokenizer.json marks special.
func (t *Tokenizer) IsSpecial(id int) bool { return id >= 0 && id < len(t.special) && t.special[id] }

// Encode tokenizes text; added tokens appearing literally in text are matched (no BOS is added).
func (t *Tokenizer) Encode(text string) []int {
	ids := make([]int, 0, len(text)/3+1)
	var pieces []string
	for len(text) > 0 {
		start, end, id := t.added.findLeftmostLongest(text)
		seg := text
		if start >= 0 {
			seg = text[:start]
		}
		if seg != "" {
			pieces = t.preTokenize(seg, pieces[:0])
			for _, p := range pieces {
				ids = t.bpe(p, ids)
			}
		}
		if start < 0 {
			break
		}
		ids = append(ids, id)
		text = text[end:]
	}
	return ids
}

// EncodeOrdinary tokenizes text without matching added tokens.
func (t *Tokenizer) EncodeOrdinary(text string) []int {
	ids := make([]int, 0, len(text)/3+1)
	for _, p := range t.preTokenize(text, nil) {
		ids = t.bpe(p, ids)
	}
	return ids
}

// EncodeHead tokenizes, as Encode, the head of text that more text will
// follow (the bytes a grammar forces, for jump-forward): it leaves out the
// last pre-tokenized piece, whose split can change with what follows. n is
// the number of bytes of text the ids spell.
func (t *Tokenizer) EncodeHead(text string) (ids []int, n int) {
	var pieces []string
	for len(text) > 0 {
		start, end, id := t.added.findLeftmostLongest(text)
		seg := text
		if start >= 0 {
			seg = text[:start]
		}
		pieces = pieces[:0]
		if seg != "" {
			pieces = t.preTokenize(seg, pieces)
		}
		if start < 0 && len(pieces) > 0 {
			pieces = pieces[:len(pieces)-1] // the last piece of the text
		}
		for _, p := range pieces {
			ids = t.bpe(p, ids)
			n += len(p)
		}
		if start < 0 {
			break
		}
		ids = append(ids, id)
		n += end - start
		text = text[end:]
	}
	return ids, n
}

func (t *Tokenizer) preTokenize(seg string, out []string) []string {
	cur := append(out[:0], seg)
	var next []string
	for _, s := range t.splits {
		next = next[:0]
		for _, p := range cur {
			next = s.split(p, next)
		}
		cur, next = next, cur
	}
	return cur
}

// bpe appends the ids of one pre-tokenized piece.
func (t *Tokenizer) bpe(piece string, ids []int) []int {
	if len(piece) < 256 {
		t.mu.RLock()
		c, ok := t.cache[piece]
		t.mu.RUnlock()
		if ok {
			return append(ids, c...)
		}
	}
	// Whole piece already a token and single byte: fast path.
	var buf [64]int32
	syms := buf[:0]
	for i := 0; i < len(piece); i++ {
		id := t.byteTok[piece[i]]
		if id < 0 { // no token for this byte (no unk token in such files): HF drops it
			continue
		}
		syms = append(syms, int32(id))
	}
	// Repeatedly merge the lowest-rank adjacent pair, leftmost first.
	for len(syms) > 1 {
		best, bestRank := -1, int32(1<<31-1)
		var bestID int32
		for i := 0; i+1 < len(syms); i++ {
			if mi, ok := t.merges[uint64(syms[i])<<32|uint64(syms[i+1])]; ok && mi.rank < bestRank {
				best, bestRank, bestID = i, mi.rank, mi.id
			}
		}
		if best < 0 {
			break
		}
		// Merge every non-overlapping occurrence of the best pair left to right (same rank → same result).
		a, b := syms[best], syms[best+1]
		w := best
		for r := best; r < len(syms); {
			if r+1 < len(syms) && syms[r] == a && syms[r+1] == b {
				syms[w] = bestID
				r += 2
			} else {
				syms[w] = syms[r]
				r++
			}
			w++
		}
		syms = syms[:w]
	}
	n := len(ids)
	for _, s := range syms {
		ids = append(ids, int(s))
	}
	if len(piece) < 256 {
		c := append([]int(nil), ids[n:]...)
		t.mu.Lock()
		if len(t.cache) >= cacheCap {
			clear(t.cache)
		}
		t.cache[piece] = c
		t.mu.Unlock()
	}
	return ids
}

// Decode turns ids into text. Byte-level tokens map back to their bytes; added tokens (and any token
// with characters outside the byte table) are emitted as their raw string. Unknown ids are skipped.
func (t *Tokenizer) Decode(ids []int) string {
	var b []byte
	for _, id := range ids {
		b = t.appendToken(b, id)
	}
	return string(b)
}

// DecodeBytes is Decode for one token, returned as bytes (may be partial UTF-8).
func (t *Tokenizer) appendToken(b []byte, id int) []byte {
	if id < 0 || id >= len(t.idToTok) {
		return b
	}
	s := t.idToTok[id]
	if t.isAdded[id] {
		return append(b, s...)
	}
	n := len(b)
	for _, r := range s {
		c, ok := t.byteDec[r]
		if !ok {
			return append(b[:n], s...)
		}
		b = append(b, c)
	}
	return b
}

// AddedTokens returns the added tokens sorted by id.
func (t *Tokenizer) AddedTokens() []string {
	var out []string
	for id, a := range t.isAdded {
		if a {
			out = append(out, t.idToTok[id])
		}
	}
	return out
}

// trie over bytes for leftmost-longest matching of added tokens.
type trie struct {
	nodes []trieNode
	first [256]bool
}

type trieNode struct {
	next map[byte]int32
	id   int32 // -1 when no token ends here
}

func newTrie() *trie { return &trie{nodes: []trieNode{{id: -1}}} }

func (tr *trie) insert(s string, id int) {
	n := 0
	tr.first[s[0]] = true
	for i := 0; i < len(s); i++ {
		nx, ok := tr.nodes[n].next[s[i]]
		if !ok {
			if tr.nodes[n].next == nil {
				tr.nodes[n].next = map[byte]int32{}
			}
			tr.nodes = append(tr.nodes, trieNode{id: -1})
			nx = int32(len(tr.nodes) - 1)
			tr.nodes[n].next[s[i]] = nx
		}
		n = int(nx)
	}
	tr.nodes[n].id = int32(id)
}

// findLeftmostLongest returns the first position where some token matches, with the longest token there.
func (tr *trie) findLeftmostLongest(s string) (start, end, id int) {
	for i := 0; i < len(s); i++ {
		if !tr.first[s[i]] {
			continue
		}
		n, bestEnd, bestID := 0, -1, -1
		for j := i; j < len(s); j++ {
			nx, ok := tr.nodes[n].next[s[j]]
			if !ok {
				break
			}
			n = int(nx)
			if tr.nodes[n].id >= 0 {
				bestEnd, bestID = j+1, int(tr.nodes[n].id)
			}
		}
		if bestEnd > 0 {
			return i, bestEnd, bestID
		}
	}
	return -1, -1, -1
}

// sortedKeys returns the keys of m in sorted order (deterministic iteration).
func sortedKeys(m map[string]int) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
