package grammar

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
)

// TokenTable is a vocabulary prepared for masking: its tokens' bytes in a trie flattened in
// depth-first order, so that one linear scan with subtree skips visits every token whose
// prefix the grammar still accepts. Build one per tokenizer and share it: it is safe for
// concurrent use, and it caches the masks that all grammars have in common.
type TokenTable struct {
	vocab [][]byte
	eos   []int32
	isEOS []bool

	// trie node i: the byte on the edge into it, its depth (1-based), the index just after its
	// subtree, and the ids of the tokens ending there (ids[first[i]:first[i+1]]).
	nodeByte  []byte
	nodeDepth []uint16
	nodeSkip  []int32
	first     []int32
	ids       []int32
	maxDepth  int

	// local masks shared by all grammars, keyed by the fingerprint of the stack's reachable
	// grammar (the JSON string, number and value rules are the same in every JSON grammar)
	mu     sync.Mutex
	shared map[[32]byte]*localMask
}

// NewTokenTable builds the table for a vocabulary: vocab[id] is the token's bytes as it appears
// in the text (nil or empty for special tokens, which are never allowed), eos the ids that end
// the output (allowed only where the grammar can end).
func NewTokenTable(vocab [][]byte, eos []int32) (*TokenTable, error) {
	t := &TokenTable{vocab: vocab, isEOS: make([]bool, len(vocab)), shared: map[[32]byte]*localMask{}}
	for _, e := range eos {
		if e < 0 || int(e) >= len(vocab) {
			return nil, fmt.Errorf("eos id %d outside the vocabulary of %d tokens", e, len(vocab))
		}
		t.isEOS[e] = true
		t.eos = append(t.eos, e)
	}
	order := make([]int32, 0, len(vocab))
	for id, b := range vocab {
		if len(b) > 0 && !t.isEOS[id] {
			if len(b) > 0xFFFF {
				return nil, fmt.Errorf("token %d is %d bytes long", id, len(b))
			}
			order = append(order, int32(id))
		}
	}
	slices.SortFunc(order, func(x, y int32) int {
		if c := bytes.Compare(vocab[x], vocab[y]); c != 0 {
			return c
		}
		return int(x - y)
	})
	var path []int32 // node index per depth-1 of the current path
	var prev []byte
	closeTo := func(d int) {
		for len(path) > d {
			n := path[len(path)-1]
			t.nodeSkip[n] = int32(len(t.nodeByte))
			path = path[:len(path)-1]
		}
	}
	for _, id := range order {
		b := vocab[id]
		l := 0
		for l < len(prev) && l < len(b) && prev[l] == b[l] {
			l++
		}
		closeTo(l)
		for d := l; d < len(b); d++ {
			path = append(path, int32(len(t.nodeByte)))
			t.nodeByte = append(t.nodeByte, b[d])
			t.nodeDepth = append(t.nodeDepth, uint16(d+1))
			t.nodeSkip = append(t.nodeSkip, 0)
			t.first = append(t.first, int32(len(t.ids)))
		}
		t.ids = append(t.ids, id)
		t.maxDepth = max(t.maxDepth, len(b))
		prev = b
	}
	closeTo(0)
	t.first = append(t.first, int32(len(t.ids)))
	return t, nil
}

// Size is the number of token ids.
func (t *TokenTable) Size() int { return len(t.vocab) }

// MaskWords is the length of a mask for this table: one bit per token id, id i at bit i%32 of
// word i/32.
func (t *TokenTable) MaskWords() int { return (len(t.vocab) + 31) / 32 }

// maskCache holds, for one table, the token masks of automaton states and the local masks of
// truncated stacks; both bounded in entries.
type maskCache struct {
	m     map[int32][]uint32
	local map[int32]*localMask
}

// maskEntries bounds the cached masks of one (Grammar, TokenTable) pair, each kind (16 KiB
// per mask for a 129K vocabulary).
const maskEntries = 2048

// localFrames is how many top frames of a stack its local mask depends on. Three frames hold
// a shared rule and its caller's return (inside a JSON string: the character, the repetition,
// the closing quote), so the expensive masks (most tokens allowed) are computed once per
// Grammar rather than once per place the rule is used.
const localFrames = 3

// localMask is what the top frames of a stack allow whatever lies below them (the hole):
// accepted tokens are consumed by those frames alone; the tokens of the uncertain ranges
// reach the hole after off bytes and are allowed iff their remaining bytes continue the real
// caller's state.
type localMask struct {
	accepted  []uint32 // nil when sparse
	sparse    []int32  // the accepted ids when they are few (cheaper to merge than a bitmap)
	uncertain []tokenRange
}

// sparseMax is the largest accepted count kept as a list.
const sparseMax = 512

// tokenRange is t.ids[lo:hi] (one trie subtree) with the bytes consumed before the hole.
type tokenRange struct {
	lo, hi int32
	off    uint16
}

// mask returns the token mask of state s: the union over its stacks of their local masks,
// with uncertain tokens checked against the real caller. Callers hold a.mu.
func (a *automaton) mask(t *TokenTable, s int32) ([]uint32, error) {
	c := a.masks[t]
	if c == nil {
		c = &maskCache{m: map[int32][]uint32{}, local: map[int32]*localMask{}}
		a.masks[t] = c
	}
	if m, ok := c.m[s]; ok {
		return m, nil
	}
	m := make([]uint32, t.MaskWords())
	for _, st := range a.sets[s] {
		if st == 0 {
			continue
		}
		local, below, err := a.truncate(st)
		if err != nil {
			return nil, err
		}
		lm, ok := c.local[local]
		if !ok {
			if lm, err = a.sharedLocal(t, local); err != nil {
				return nil, err
			}
			evictKey(c.local)
			c.local[local] = lm
		}
		for i, w := range lm.accepted {
			m[i] |= w
		}
		for _, id := range lm.sparse {
			m[id>>5] |= 1 << (id & 31)
		}
		if len(lm.uncertain) == 0 {
			continue
		}
		p, err := a.popInto(below)
		if err != nil {
			return nil, err
		}
		for _, r := range lm.uncertain {
			for _, id := range t.ids[r.lo:r.hi] {
				if m[id>>5]&(1<<(id&31)) != 0 {
					continue
				}
				ns := p
				for _, b := range t.vocab[id][r.off:] {
					if ns, err = a.next(ns, b); err != nil {
						return nil, err
					}
					if ns == 0 {
						break
					}
				}
				if ns != 0 {
					m[id>>5] |= 1 << (id & 31)
				}
			}
		}
	}
	if a.accepting[s] {
		for _, id := range t.eos {
			m[id>>5] |= 1 << (id & 31)
		}
	}
	if !slices.ContainsFunc(m, func(w uint32) bool { return w != 0 }) {
		return nil, errDeadEnd
	}
	evictKey(c.m)
	c.m[s] = m
	return m, nil
}

// sharedLocal returns the local mask of a stack from the table's cross-grammar cache, or
// computes it (and shares it when the stack's reachable grammar is small enough to fingerprint).
func (a *automaton) sharedLocal(t *TokenTable, local int32) (*localMask, error) {
	fp, ok := a.fingerprint(local)
	if ok {
		t.mu.Lock()
		lm := t.shared[fp]
		t.mu.Unlock()
		if lm != nil {
			return lm, nil
		}
	}
	lm, err := a.scanLocal(t, local)
	if err != nil || !ok {
		return lm, err
	}
	t.mu.Lock()
	evictKey(t.shared)
	t.shared[fp] = lm
	t.mu.Unlock()
	return lm, nil
}

func evictKey[K comparable, V any](m map[K]V) {
	if len(m) >= maskEntries {
		for k := range m {
			delete(m, k)
			break
		}
	}
}

// fpMaxElems bounds the grammar serialized for a fingerprint.
const fpMaxElems = 512

// fingerprint hashes what determines a stack's behaviour: the rest of each frame's
// alternative, every rule reachable from them (renumbered in discovery order) and the byte
// sets, whether the bottom is the hole or the end. ok is false past fpMaxElems.
func (a *automaton) fingerprint(local int32) (fp [32]byte, ok bool) {
	g := a.g
	num := map[int32]uint32{}
	var queue []int32
	var buf []byte
	n := 0
	writeSeq := func(p int32) bool {
		for ; ; p++ {
			if n++; n > fpMaxElems {
				return false
			}
			e := g.elems[p]
			switch e.kind {
			case kEnd:
				buf = append(buf, 0)
				return true
			case kBytes:
				buf = append(buf, 1)
				for _, w := range g.sets[e.arg] {
					buf = binary.LittleEndian.AppendUint64(buf, w)
				}
			case kRef:
				r, seen := num[e.arg]
				if !seen {
					r = uint32(len(queue))
					num[e.arg] = r
					queue = append(queue, e.arg)
				}
				buf = binary.LittleEndian.AppendUint32(append(buf, 2), r)
			}
		}
	}
	st := local
	for ; st > holeStack; st = a.stackPar[st] {
		buf = append(buf, 3)
		if !writeSeq(a.stackPos[st]) {
			return fp, false
		}
	}
	buf = append(buf, 5+byte(st)) // 5: the end of the grammar, 6: the hole
	for i := 0; i < len(queue); i++ {
		alts := g.ruleAlts[queue[i]]
		buf = binary.LittleEndian.AppendUint32(append(buf, 4), uint32(len(alts)))
		for _, s := range alts {
			if !writeSeq(s) {
				return fp, false
			}
		}
	}
	return sha256.Sum256(buf), true
}

// truncate returns the stack made of st's top localFrames frames over the hole, and the real
// stack below them (st itself and 0 when it is not deeper).
func (a *automaton) truncate(st int32) (local, below int32, err error) {
	var frames [localFrames]int32
	n, cur := 0, st
	for ; n < localFrames && cur > holeStack; n++ {
		frames[n] = a.stackPos[cur]
		cur = a.stackPar[cur]
	}
	if cur == 0 {
		return st, 0, nil
	}
	local = holeStack
	for i := n - 1; i >= 0; i-- {
		if local, err = a.stack(frames[i], local); err != nil {
			return 0, 0, err
		}
	}
	return local, cur, nil
}

// popInto returns the state of returning into the stack below (the caller continuing).
func (a *automaton) popInto(below int32) (int32, error) {
	if s, ok := a.pops[below]; ok {
		return s, nil
	}
	a.out = a.out[:0]
	a.visited.reset()
	if err := a.expand(a.stackPos[below], a.stackPar[below]); err != nil {
		return 0, err
	}
	s, err := a.intern()
	if err != nil {
		return 0, err
	}
	a.pops[below] = s
	return s, nil
}

// scanLocal computes the local mask of one stack: a pass over the trie from the state holding
// only that stack, skipping subtrees the stack rejects unless the hole was reached above them.
func (a *automaton) scanLocal(t *TokenTable, local int32) (*localMask, error) {
	a.out = append(a.out[:0], local)
	s, err := a.intern()
	if err != nil {
		return nil, err
	}
	lm := &localMask{accepted: make([]uint32, t.MaskWords())}
	states := make([]int32, t.maxDepth+1)
	states[0] = s
	var holes []uint16 // depths on the current path whose state reached the hole
	n := int32(len(t.nodeByte))
	for i := int32(0); i < n; {
		d := t.nodeDepth[i]
		for len(holes) > 0 && holes[len(holes)-1] >= d {
			holes = holes[:len(holes)-1]
		}
		ns, err := a.next(states[d-1], t.nodeByte[i])
		if err != nil {
			return nil, err
		}
		if ns == 0 {
			for _, h := range holes {
				lm.uncertain = append(lm.uncertain, tokenRange{t.first[i], t.first[t.nodeSkip[i]], h})
			}
			i = t.nodeSkip[i]
			continue
		}
		states[d] = ns
		for _, id := range t.ids[t.first[i]:t.first[i+1]] {
			lm.accepted[id>>5] |= 1 << (id & 31)
		}
		if a.hasHole[ns] {
			holes = append(holes, d)
		}
		i++
	}
	count := 0
	for _, w := range lm.accepted {
		count += bits.OnesCount32(w)
	}
	if count <= sparseMax {
		lm.sparse = make([]int32, 0, count)
		for wi, w := range lm.accepted {
			for ; w != 0; w &= w - 1 {
				lm.sparse = append(lm.sparse, int32(wi*32+bits.TrailingZeros32(w)))
			}
		}
		lm.accepted = nil
	}
	return lm, nil
}

// errDeadEnd: the grammar has a state from which no token continues (e.g. an empty class).
var errDeadEnd = errors.New("no token of the vocabulary continues the output here (dead end in the grammar)")

// Matcher follows one output through a Grammar, token by token. It is not safe for concurrent
// use; make one per sequence (they are cheap: the automaton lives in the Grammar).
type Matcher struct {
	a    *automaton
	t    *TokenTable
	hist []step // hist[0] is the start; one entry per accepted token
}

type step struct {
	state int32
	ended bool // an EOS token was accepted
}

// NewMatcher starts matching g with the vocabulary t.
func NewMatcher(g *Grammar, t *TokenTable) (*Matcher, error) {
	if g.auto.err != nil {
		return nil, g.auto.err
	}
	return &Matcher{a: g.auto, t: t, hist: []step{{state: g.auto.start}}}, nil
}

// ErrRejected is wrapped by Accept errors for tokens the grammar does not allow.
var ErrRejected = errors.New("token rejected by the grammar")

func (m *Matcher) cur() step { return m.hist[len(m.hist)-1] }

// Accept advances over one token. A rejected token leaves the matcher unchanged.
func (m *Matcher) Accept(tok int32) error {
	c := m.cur()
	if c.ended {
		return fmt.Errorf("token %d after the end of the output: %w", tok, ErrRejected)
	}
	if tok < 0 || int(tok) >= len(m.t.vocab) {
		return fmt.Errorf("token %d outside the vocabulary: %w", tok, ErrRejected)
	}
	m.a.mu.Lock()
	defer m.a.mu.Unlock()
	m.a.work = 0
	if m.t.isEOS[tok] {
		if !m.a.accepting[c.state] {
			return fmt.Errorf("end of output where the grammar cannot end: %w", ErrRejected)
		}
		m.hist = append(m.hist, step{state: c.state, ended: true})
		return nil
	}
	b := m.t.vocab[tok]
	if len(b) == 0 {
		return fmt.Errorf("special token %d: %w", tok, ErrRejected)
	}
	s, err := m.walk(c.state, b)
	if err != nil {
		return err
	}
	if s == 0 {
		return fmt.Errorf("token %d (%q): %w", tok, b, ErrRejected)
	}
	m.hist = append(m.hist, step{state: s})
	return nil
}

// AcceptBytes advances over text that was emitted without a token (e.g. ForcedBytes); it counts
// as one step for Rollback.
func (m *Matcher) AcceptBytes(b []byte) error {
	c := m.cur()
	if c.ended {
		return fmt.Errorf("bytes after the end of the output: %w", ErrRejected)
	}
	m.a.mu.Lock()
	defer m.a.mu.Unlock()
	m.a.work = 0
	s, err := m.walk(c.state, b)
	if err != nil {
		return err
	}
	if s == 0 {
		return fmt.Errorf("bytes %q: %w", b, ErrRejected)
	}
	m.hist = append(m.hist, step{state: s})
	return nil
}

func (m *Matcher) walk(s int32, b []byte) (int32, error) {
	for _, c := range b {
		var err error
		if s, err = m.a.next(s, c); err != nil || s == 0 {
			return 0, err
		}
	}
	return s, nil
}

// Rollback undoes the last n accepted steps (rejected MTP draft tokens); n larger than the
// number of steps rolls back to the start.
func (m *Matcher) Rollback(n int) {
	n = min(max(n, 0), len(m.hist)-1)
	m.hist = m.hist[:len(m.hist)-n]
}

// Steps is the number of accepted steps (tokens and AcceptBytes calls).
func (m *Matcher) Steps() int { return len(m.hist) - 1 }

// IsTerminated reports whether an EOS token has been accepted.
func (m *Matcher) IsTerminated() bool { return m.cur().ended }

// CanTerminate reports whether the output so far is a complete match (EOS would be accepted).
func (m *Matcher) CanTerminate() bool {
	c := m.cur()
	return !c.ended && m.a.accepting[c.state]
}

// FillMask writes the allowed tokens of the next step into mask (MaskWords words; bit set =
// allowed). After termination nothing is allowed.
func (m *Matcher) FillMask(mask []uint32) error {
	if len(mask) < m.t.MaskWords() {
		return fmt.Errorf("mask has %d words, the vocabulary needs %d", len(mask), m.t.MaskWords())
	}
	c := m.cur()
	if c.ended {
		clear(mask)
		return nil
	}
	m.a.mu.Lock()
	defer m.a.mu.Unlock()
	m.a.work = 0
	src, err := m.a.mask(m.t, c.state)
	if err != nil {
		return err
	}
	copy(mask, src)
	return nil
}

// maxForced bounds ForcedBytes.
const maxForced = 4096

// ForcedBytes returns the bytes the grammar forces next (jump-forward): the longest string such
// that every continuation of the output starts with it. Empty when there is a choice (or the
// output may end here).
func (m *Matcher) ForcedBytes() ([]byte, error) {
	c := m.cur()
	if c.ended {
		return nil, nil
	}
	m.a.mu.Lock()
	defer m.a.mu.Unlock()
	m.a.work = 0
	var out []byte
	s := c.state
	for len(out) < maxForced && !m.a.accepting[s] {
		only, n := int32(0), 0
		var ob byte
		for b := 0; b < 256 && n < 2; b++ {
			ns, err := m.a.next(s, byte(b))
			if err != nil {
				return nil, err
			}
			if ns != 0 {
				only, ob = ns, byte(b)
				n++
			}
		}
		if n != 1 {
			break
		}
		out = append(out, ob)
		s = only
	}
	return out, nil
}
