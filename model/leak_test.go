package model

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
)

// countingBackend records where every tensor it hands out was allocated and
// forgets it on Free: what a step leaves behind is what a device pool would
// never get back.
type countingBackend struct {
	backend.Backend
	live map[backend.Tensor]string
}

func (b *countingBackend) track(t backend.Tensor) backend.Tensor {
	_, file, line, _ := runtime.Caller(2)
	b.live[t] = fmt.Sprintf("%s:%d", file[strings.LastIndex(file, "/")+1:], line)
	return t
}

func (b *countingBackend) Alloc(rows, cols int, dt backend.DType) backend.Tensor {
	return b.track(b.Backend.Alloc(rows, cols, dt))
}

func (b *countingBackend) Empty(rows, cols int, dt backend.DType) backend.Tensor {
	return b.track(b.Backend.Empty(rows, cols, dt))
}

func (b *countingBackend) Free(t backend.Tensor) {
	delete(b.live, t)
	b.Backend.Free(t)
}

// sites lists the allocation sites of the live tensors, with counts.
func (b *countingBackend) sites() string {
	n := map[string]int{}
	for _, s := range b.live {
		n[s]++
	}
	var out []string
	for s, k := range n {
		out = append(out, fmt.Sprintf("%s ×%d", s, k))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// TestForwardFreesTemporaries: a step (prefill chunks of two sequences, then
// a batched decode step) frees every tensor it allocates. On the GPU an
// unfreed tensor is pool memory lost for good; the indexer's query, weights
// and top-k once leaked about 18 MB (Flash) per compressed-sparse layer per
// 512-token chunk that way.
func TestForwardFreesTemporaries(t *testing.T) {
	c := checkpoint.SmallConfig()
	be := &countingBackend{Backend: cpu.New(cpu.Options{}), live: map[backend.Tensor]string{}}
	m, err := New(genWeights(t, c, 1), be, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s0, s1 := m.Cache().NewSequence(), m.Cache().NewSequence()
	defer m.FreeSequence(s0)
	defer m.FreeSequence(s1)
	before := len(be.live)
	check := func(what string) {
		t.Helper()
		if len(be.live) != before {
			t.Errorf("%s left %d tensors allocated: %s", what, len(be.live)-before, be.sites())
			before = len(be.live)
		}
	}
	toks := prompt(11, c.Vocab, 1)
	o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s0, Tokens: toks, AllLogits: true, Hidden: true}, {Seq: s1, Tokens: prompt(6, c.Vocab, 2)}}})
	if err != nil {
		t.Fatal(err)
	}
	check("prefill")
	if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s0, Tokens: prompt(1, c.Vocab, 3)}, {Seq: s1, Tokens: prompt(1, c.Vocab, 4)}}}); err != nil {
		t.Fatal(err)
	}
	check("decode step")
	if !m.HasMTP() {
		t.Fatal("the synthetic model has no MTP block")
	}
	w := c.HcDim()
	if _, err := m.ForwardMTP([]MTPItem{{Seq: s0, Hidden: o.Hidden[0][:10*w], Next: toks[1:11], AllLogits: true}}); err != nil {
		t.Fatal(err)
	}
	m.Close() // the MTP pass's input staging
	check("MTP step")
	// Streams kept on the device: a step's, read by an MTP pass that keeps
	// its last row's; both are the caller's to free.
	o2, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s0, Tokens: prompt(2, c.Vocab, 5), KeepHidden: true}}})
	if err != nil {
		t.Fatal(err)
	}
	mo, err := m.ForwardMTP([]MTPItem{{Seq: s0, Start: 10, In: HiddenRef{H: o2.Kept, Row0: o2.KeptRow[0], Rows: 2}, Next: prompt(2, c.Vocab, 6), KeepNext: true, Ahead: true}})
	if err != nil {
		t.Fatal(err)
	}
	if mo.Kept == nil || mo.Kept.Rows() != 1 || mo.KeptRow[0] != 0 {
		t.Fatalf("MTP pass kept %v rows %v, want one row", mo.Kept, mo.KeptRow)
	}
	m.FreeHidden(o2.Kept)
	m.FreeHidden(mo.Kept)
	m.Close()
	check("kept streams")
}
