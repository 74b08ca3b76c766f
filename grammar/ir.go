package grammar

import (
	"errors"
	"fmt"
	"math/bits"
	"time"
)

// Limits bound compilation so that adversarial input fails with an error instead of hanging.
type Limits struct {
	MaxElems   int           // grammar elements after desugaring repetitions
	MaxRepeat  int           // largest m or n in {m,n}
	MaxDepth   int           // nesting of groups / schemas
	Timeout    time.Duration // wall-clock bound on one compilation
	MaxStacks  int           // interned parse stacks of one Grammar's automaton
	MaxSets    int           // interned stack sets (automaton states)
	MaxSetSize int           // stacks in one state (ambiguity)
	MaxWork    int           // parse positions expanded by one Matcher call (bounds its time)
}

// DefaultLimits returns the limits used when none are given: generous for real schemas, small
// enough to bound memory (tens of MiB) and time (seconds).
func DefaultLimits() Limits {
	return Limits{
		MaxElems:   1 << 18,
		MaxRepeat:  10000,
		MaxDepth:   256,
		Timeout:    2 * time.Second,
		MaxStacks:  1 << 20,
		MaxSets:    1 << 16,
		MaxSetSize: 4096,
		MaxWork:    1 << 24,
	}
}

// ErrLimit is wrapped by errors from exceeding a Limits bound.
var ErrLimit = errors.New("grammar limit exceeded")

// byteSet is a set of bytes: the only terminal of the byte-level grammar.
type byteSet [4]uint64

func (s *byteSet) add(b byte)      { s[b>>6] |= 1 << (b & 63) }
func (s *byteSet) has(b byte) bool { return s[b>>6]&(1<<(b&63)) != 0 }
func (s *byteSet) addRange(lo, hi byte) {
	for c := int(lo); c <= int(hi); c++ {
		s.add(byte(c))
	}
}
func (s *byteSet) count() int {
	return bits.OnesCount64(s[0]) + bits.OnesCount64(s[1]) + bits.OnesCount64(s[2]) + bits.OnesCount64(s[3])
}

// node is the front-end expression tree shared by the GBNF, regex and JSON-schema compilers.
type node struct {
	op       opKind
	kids     []*node
	set      byteSet
	ref      int32
	min, max int // opRepeat; max < 0 is unbounded
}

type opKind uint8

const (
	opEmpty opKind = iota
	opBytes
	opSeq
	opAlt
	opRef
	opRepeat
)

func empty() *node                  { return &node{op: opEmpty} }
func ref(r int32) *node             { return &node{op: opRef, ref: r} }
func setNode(s byteSet) *node       { return &node{op: opBytes, set: s} }
func seq(kids ...*node) *node       { return &node{op: opSeq, kids: kids} }
func alt(kids ...*node) *node       { return &node{op: opAlt, kids: kids} }
func rep(x *node, lo, hi int) *node { return &node{op: opRepeat, kids: []*node{x}, min: lo, max: hi} }
func opt(x *node) *node             { return rep(x, 0, 1) }
func star(x *node) *node            { return rep(x, 0, -1) }
func plus(x *node) *node            { return rep(x, 1, -1) }

// lit matches the bytes of s exactly.
func lit(s string) *node {
	n := &node{op: opSeq}
	for i := 0; i < len(s); i++ {
		var b byteSet
		b.add(s[i])
		n.kids = append(n.kids, setNode(b))
	}
	return n
}

// bytesIn matches one byte from the listed ranges ("az09" = a-z and 0-9).
func bytesIn(pairs string) *node {
	var s byteSet
	for i := 0; i+1 < len(pairs); i += 2 {
		s.addRange(pairs[i], pairs[i+1])
	}
	return setNode(s)
}

// elem is one element of the flat grammar.
type elem struct {
	kind elemKind
	arg  int32 // set index (kBytes) or rule index (kRef)
}

type elemKind uint8

const (
	kEnd elemKind = iota
	kBytes
	kRef
)

// builder collects rules as expression trees and lowers them to the flat grammar.
type builder struct {
	lim      Limits
	deadline time.Time
	names    []string
	bodies   []*node
	byName   map[string]int32

	elems    []elem
	sets     []byteSet
	setIdx   map[byteSet]int32
	ruleAlts [][]int32
	pending  []int32 // rules created during lowering, still to lower
}

func newBuilder(lim Limits) *builder {
	return &builder{lim: lim, deadline: time.Now().Add(lim.Timeout), byName: map[string]int32{}, setIdx: map[byteSet]int32{}}
}

func (b *builder) checkTime() error {
	if time.Now().After(b.deadline) {
		return fmt.Errorf("%w: compilation took longer than %v", ErrLimit, b.lim.Timeout)
	}
	return nil
}

// rule returns the id of the named rule, creating it undefined.
func (b *builder) rule(name string) int32 {
	if id, ok := b.byName[name]; ok {
		return id
	}
	id := int32(len(b.names))
	b.names = append(b.names, name)
	b.bodies = append(b.bodies, nil)
	b.byName[name] = id
	return id
}

// anon creates a fresh rule with a unique name derived from prefix.
func (b *builder) anon(prefix string, body *node) int32 {
	name := fmt.Sprintf("%s-%d", prefix, len(b.names))
	for {
		if _, ok := b.byName[name]; !ok {
			break
		}
		name += "_"
	}
	id := b.rule(name)
	b.bodies[id] = body
	return id
}

func (b *builder) define(id int32, body *node) { b.bodies[id] = body }

// Grammar is a compiled byte-level grammar. It is safe for concurrent use; its automaton
// (the states reached so far and their token masks) is shared by all Matchers made from it.
type Grammar struct {
	elems    []elem
	sets     []byteSet
	ruleAlts [][]int32
	names    []string
	root     int32
	lim      Limits
	auto     *automaton
}

// finish lowers every rule, checks references and left recursion, and returns the Grammar.
func (b *builder) finish(root int32) (*Grammar, error) {
	b.ruleAlts = make([][]int32, len(b.names))
	b.pending = b.pending[:0]
	for id := range b.names {
		b.pending = append(b.pending, int32(id))
	}
	for len(b.pending) > 0 {
		id := b.pending[0]
		b.pending = b.pending[1:]
		if b.bodies[id] == nil {
			return nil, fmt.Errorf("undefined rule %q", b.names[id])
		}
		if err := b.lowerRule(id); err != nil {
			return nil, err
		}
	}
	g := &Grammar{elems: b.elems, sets: b.sets, ruleAlts: b.ruleAlts, names: b.names, root: root, lim: b.lim}
	if err := g.checkLeftRecursion(); err != nil {
		return nil, err
	}
	g.auto = newAutomaton(g)
	if g.auto.err != nil {
		return nil, g.auto.err
	}
	if g.auto.start == 0 {
		return nil, errors.New("the grammar matches nothing")
	}
	return g, nil
}

func (b *builder) lowerRule(id int32) error {
	body := b.bodies[id]
	var alts []*node
	if body.op == opAlt {
		alts = body.kids
	} else {
		alts = []*node{body}
	}
	starts := make([]int32, 0, len(alts))
	for _, a := range alts {
		var seqElems []elem
		var err error
		if seqElems, err = b.lowerSeq(a, seqElems, 0); err != nil {
			return err
		}
		starts = append(starts, int32(len(b.elems)))
		b.elems = append(b.elems, seqElems...)
		b.elems = append(b.elems, elem{kind: kEnd})
		if len(b.elems) > b.lim.MaxElems {
			return fmt.Errorf("%w: more than %d grammar elements", ErrLimit, b.lim.MaxElems)
		}
	}
	b.ruleAlts[id] = starts
	return b.checkTime()
}

func (b *builder) setIndex(s byteSet) int32 {
	if i, ok := b.setIdx[s]; ok {
		return i
	}
	i := int32(len(b.sets))
	b.sets = append(b.sets, s)
	b.setIdx[s] = i
	return i
}

// newRule registers a rule created while lowering (its alternatives are lowered later).
func (b *builder) newRule(prefix string, body *node) int32 {
	id := b.anon(prefix, body)
	b.ruleAlts = append(b.ruleAlts, nil)
	b.pending = append(b.pending, id)
	return id
}

// single returns one element standing for n (a fresh rule unless n is a byte set or a ref).
func (b *builder) single(n *node, depth int) (elem, error) {
	switch n.op {
	case opBytes:
		return elem{kind: kBytes, arg: b.setIndex(n.set)}, nil
	case opRef:
		if n.ref < 0 {
			return elem{kind: kBytes, arg: -1 - n.ref}, nil
		}
		return elem{kind: kRef, arg: n.ref}, nil
	case opSeq:
		if len(n.kids) == 1 {
			return b.single(n.kids[0], depth)
		}
	}
	return elem{kind: kRef, arg: b.newRule("group", n)}, nil
}

func (b *builder) lowerSeq(n *node, out []elem, depth int) ([]elem, error) {
	if depth > b.lim.MaxDepth {
		return nil, fmt.Errorf("%w: nesting deeper than %d", ErrLimit, b.lim.MaxDepth)
	}
	if len(out)+len(b.elems) > b.lim.MaxElems {
		return nil, fmt.Errorf("%w: more than %d grammar elements", ErrLimit, b.lim.MaxElems)
	}
	switch n.op {
	case opEmpty:
		return out, nil
	case opBytes, opRef:
		e, _ := b.single(n, depth)
		return append(out, e), nil
	case opSeq:
		var err error
		for _, k := range n.kids {
			if out, err = b.lowerSeq(k, out, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	case opAlt:
		if len(n.kids) == 1 {
			return b.lowerSeq(n.kids[0], out, depth+1)
		}
		return append(out, elem{kind: kRef, arg: b.newRule("alt", n)}), nil
	case opRepeat:
		return b.lowerRepeat(n, out, depth)
	}
	return nil, fmt.Errorf("internal: unknown node kind %d", n.op)
}

func (b *builder) lowerRepeat(n *node, out []elem, depth int) ([]elem, error) {
	lo, hi := n.min, n.max
	if lo < 0 || lo > b.lim.MaxRepeat || hi > b.lim.MaxRepeat || (hi >= 0 && hi < lo) {
		return nil, fmt.Errorf("invalid or too large repetition {%d,%d} (at most %d)", lo, hi, b.lim.MaxRepeat)
	}
	x, err := b.single(n.kids[0], depth+1)
	if err != nil {
		return nil, err
	}
	if hi == 0 {
		return out, nil
	}
	for i := 0; i < lo; i++ {
		out = append(out, x)
		if len(out)+len(b.elems) > b.lim.MaxElems {
			return nil, fmt.Errorf("%w: more than %d grammar elements", ErrLimit, b.lim.MaxElems)
		}
	}
	if hi == lo {
		return out, nil
	}
	if hi < 0 { // r ::= x r | "" (right recursion: the matcher's tail calls keep the stack flat)
		r := b.newRule("star", nil)
		b.bodies[r] = alt(seq(elemNode(x), ref(r)), empty())
		return append(out, elem{kind: kRef, arg: r}), nil
	}
	// o_k ::= x o_{k-1} | "" ; o_1 ::= x | ""
	var prev int32 = -1
	for k := 1; k <= hi-lo; k++ {
		xs := elemNode(x)
		if prev >= 0 {
			xs = seq(elemNode(x), ref(prev))
		}
		prev = b.newRule("opt", alt(xs, empty()))
		if len(b.names) > b.lim.MaxElems {
			return nil, fmt.Errorf("%w: more than %d grammar rules", ErrLimit, b.lim.MaxElems)
		}
	}
	return append(out, elem{kind: kRef, arg: prev}), nil
}

// elemNode turns a lowered element back into a node (to reuse it inside generated rules).
func elemNode(e elem) *node {
	if e.kind == kRef {
		return ref(e.arg)
	}
	return &node{op: opRef, ref: -1 - e.arg} // negative ref: a byte-set element by index
}

// checkLeftRecursion rejects rules that can reach themselves without consuming a byte: the
// matcher's stacks would grow without bound.
func (g *Grammar) checkLeftRecursion() error {
	n := len(g.ruleAlts)
	nullable := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for r := range n {
			if nullable[r] {
				continue
			}
			for _, a := range g.ruleAlts[r] {
				if g.nullablePrefix(a, nullable) < 0 {
					nullable[r], changed = true, true
					break
				}
			}
		}
	}
	// Leftmost references (reached before any byte). A cycle of them that pushes a return
	// address (a reference not in tail position) grows the stack forever; cycles of tail calls
	// are harmless (the matcher detects them).
	type edge struct {
		to   int32
		tail bool
	}
	edges := make([][]edge, n)
	for r := range n {
		for _, a := range g.ruleAlts[r] {
			for p := a; g.elems[p].kind != kEnd; p++ {
				e := g.elems[p]
				if e.kind == kBytes {
					break
				}
				edges[r] = append(edges[r], edge{e.arg, g.elems[p+1].kind == kEnd})
				if !nullable[e.arg] {
					break
				}
			}
		}
	}
	// Tarjan's strongly connected components.
	index := make([]int32, n)
	low := make([]int32, n)
	comp := make([]int32, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i], comp[i] = -1, -1
	}
	var stack []int32
	next := int32(0)
	var visit func(r int32)
	visit = func(r int32) {
		index[r], low[r] = next, next
		next++
		stack = append(stack, r)
		onStack[r] = true
		for _, e := range edges[r] {
			if index[e.to] < 0 {
				visit(e.to)
				low[r] = min(low[r], low[e.to])
			} else if onStack[e.to] {
				low[r] = min(low[r], index[e.to])
			}
		}
		if low[r] == index[r] {
			for {
				x := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[x] = false
				comp[x] = r
				if x == r {
					break
				}
			}
		}
	}
	for r := range n {
		if index[r] < 0 {
			visit(int32(r))
		}
	}
	for r := range n {
		for _, e := range edges[r] {
			if !e.tail && comp[e.to] == comp[r] {
				return fmt.Errorf("left recursion through rule %q: it reaches itself before consuming input", g.names[r])
			}
		}
	}
	return nil
}

// nullablePrefix returns -1 if the alternative at a can match the empty string, else its first
// non-nullable position.
func (g *Grammar) nullablePrefix(a int32, nullable []bool) int32 {
	for p := a; ; p++ {
		e := g.elems[p]
		switch {
		case e.kind == kEnd:
			return -1
		case e.kind == kBytes, !nullable[e.arg]:
			return p
		}
	}
}
