package grammar

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// automaton is the lazily built deterministic automaton of a Grammar. A parse stack is a list
// of grammar positions (the top one at a byte set, the ones below return addresses), interned
// as an id; a state is a sorted set of stack ids (all parses alive), also interned. Transitions
// (state, byte) -> state are computed once and cached, so after warm-up matching a byte is an
// array lookup. Stack id 0 is the empty stack (the grammar has ended); state 0 is dead.
type automaton struct {
	g  *Grammar
	mu sync.Mutex

	stackPos []int32 // id 0: the empty stack; id 1 (holeStack): an unknown caller, see localMask
	stackPar []int32
	stackIdx map[[2]int32]int32

	sets      [][]int32
	setIdx    map[string]int32
	trans     []*[256]int32 // -1: not computed yet
	accepting []bool
	hasHole   []bool
	start     int32
	err       error // sticky: a limit was hit while building the start state

	masks map[*TokenTable]*maskCache
	pops  map[int32]int32 // parent stack -> state after returning into it

	work int // expansions since the current Matcher call began (bounded by Limits.MaxWork)

	// scratch for next
	visited visitSet
	out     []int32
}

// holeStack stands for the unknown rest of a stack below its top frames (see localMask).
const holeStack = 1

func newAutomaton(g *Grammar) *automaton {
	a := &automaton{
		g:        g,
		stackPos: []int32{-1, -1}, stackPar: []int32{-1, -1},
		stackIdx: map[[2]int32]int32{},
		sets:     [][]int32{nil}, setIdx: map[string]int32{"": 0},
		trans: []*[256]int32{nil}, accepting: []bool{false}, hasHole: []bool{false},
		masks: map[*TokenTable]*maskCache{}, pops: map[int32]int32{},
	}
	a.out = a.out[:0]
	a.visited.reset()
	var err error
	for _, s := range g.ruleAlts[g.root] {
		if err = a.expand(s, 0); err != nil {
			break
		}
	}
	if err == nil {
		a.start, err = a.intern()
	}
	a.err = err
	return a
}

func (a *automaton) stack(pos, parent int32) (int32, error) {
	k := [2]int32{pos, parent}
	if id, ok := a.stackIdx[k]; ok {
		return id, nil
	}
	if len(a.stackPos) >= a.g.lim.MaxStacks {
		return 0, fmt.Errorf("%w: more than %d parse stacks (grammar too ambiguous or nested too deep)", ErrLimit, a.g.lim.MaxStacks)
	}
	id := int32(len(a.stackPos))
	a.stackPos = append(a.stackPos, pos)
	a.stackPar = append(a.stackPar, parent)
	a.stackIdx[k] = id
	return id, nil
}

// expand adds to a.out the stacks reached from position pos (above parent) without consuming
// input: rule references are entered, finished rules return to their caller.
func (a *automaton) expand(pos, parent int32) error {
	if !a.visited.add([2]int32{pos, parent}) {
		return nil
	}
	if a.work++; a.work > a.g.lim.MaxWork {
		return fmt.Errorf("%w: more than %d parse positions expanded in one step", ErrLimit, a.g.lim.MaxWork)
	}
	if a.visited.size() > a.g.lim.MaxSetSize*16 {
		return fmt.Errorf("%w: more than %d parse positions in one step", ErrLimit, a.g.lim.MaxSetSize*16)
	}
	e := a.g.elems[pos]
	switch e.kind {
	case kBytes:
		id, err := a.stack(pos, parent)
		if err != nil {
			return err
		}
		a.out = append(a.out, id)
	case kRef:
		np := parent
		if a.g.elems[pos+1].kind != kEnd { // tail calls push no return address
			var err error
			if np, err = a.stack(pos+1, parent); err != nil {
				return err
			}
		}
		for _, s := range a.g.ruleAlts[e.arg] {
			if err := a.expand(s, np); err != nil {
				return err
			}
		}
	case kEnd:
		if parent <= holeStack { // the grammar ends, or an unknown caller continues
			a.out = append(a.out, parent)
			return nil
		}
		return a.expand(a.stackPos[parent], a.stackPar[parent])
	}
	return nil
}

// intern turns a.out into a state id.
func (a *automaton) intern() (int32, error) {
	slices.Sort(a.out)
	a.out = slices.Compact(a.out)
	if len(a.out) == 0 {
		return 0, nil
	}
	if len(a.out) > a.g.lim.MaxSetSize {
		return 0, fmt.Errorf("%w: more than %d parses alive at once (grammar too ambiguous)", ErrLimit, a.g.lim.MaxSetSize)
	}
	key := unsafe.String((*byte)(unsafe.Pointer(&a.out[0])), len(a.out)*4)
	if id, ok := a.setIdx[key]; ok {
		return id, nil
	}
	if len(a.sets) >= a.g.lim.MaxSets {
		return 0, fmt.Errorf("%w: more than %d automaton states", ErrLimit, a.g.lim.MaxSets)
	}
	id := int32(len(a.sets))
	set := slices.Clone(a.out)
	a.sets = append(a.sets, set)
	a.setIdx[strings.Clone(key)] = id // key aliases the scratch slice
	a.trans = append(a.trans, nil)
	a.accepting = append(a.accepting, set[0] == 0)
	a.hasHole = append(a.hasHole, slices.Contains(set[:min(2, len(set))], holeStack))
	return id, nil
}

// next returns the state after byte c (0: dead). Callers hold a.mu.
func (a *automaton) next(s int32, c byte) (int32, error) {
	t := a.trans[s]
	if t == nil {
		t = new([256]int32)
		for i := range t {
			t[i] = -1
		}
		a.trans[s] = t
	}
	if v := t[c]; v >= 0 {
		return v, nil
	}
	a.out = a.out[:0]
	a.visited.reset()
	for _, st := range a.sets[s] {
		if st <= holeStack {
			continue
		}
		pos := a.stackPos[st]
		if a.g.sets[a.g.elems[pos].arg].has(c) {
			if err := a.expand(pos+1, a.stackPar[st]); err != nil {
				return 0, err
			}
		}
	}
	v, err := a.intern()
	if err != nil {
		return 0, err
	}
	a.trans[s][c] = v
	return v, nil
}

// visitSet is the positions one expansion has visited: a short list (most expansions touch a
// few positions, and clearing a map that once grew large costs its capacity every time), a map
// beyond.
type visitSet struct {
	list [][2]int32
	m    map[[2]int32]struct{}
}

func (v *visitSet) reset() {
	v.list = v.list[:0]
	v.m = nil
}

func (v *visitSet) size() int { return len(v.list) + len(v.m) }

// add reports whether k is new.
func (v *visitSet) add(k [2]int32) bool {
	if v.m != nil {
		if _, ok := v.m[k]; ok {
			return false
		}
		v.m[k] = struct{}{}
		return true
	}
	if slices.Contains(v.list, k) {
		return false
	}
	if len(v.list) < 32 {
		v.list = append(v.list, k)
		return true
	}
	v.m = make(map[[2]int32]struct{}, 64)
	for _, x := range v.list {
		v.m[x] = struct{}{}
	}
	v.list = v.list[:0]
	v.m[k] = struct{}{}
	return true
}
