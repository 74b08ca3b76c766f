package model

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

// TestTraceNonFinite plants a NaN scale (e8m0 0xFF) in layer 0's expert 5 w2
// and checks that the tracer names that expert stage and the position.
func TestTraceNonFinite(t *testing.T) {
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 1)
	ex := &w.Layers[0].FFN.Experts[5].W2
	sc := append([]byte(nil), ex.Scale.Data...)
	sc[0] = 0xff
	ex.Scale.Data = sc
	// A token routed to expert 5 by the hash table of layer 0.
	tab := w.Layers[0].FFN.Tid2Eid.Data
	tok := int32(-1)
	for v := range c.Vocab {
		for k := range c.TopK {
			if binary.LittleEndian.Uint64(tab[8*(v*c.TopK+k):]) == 5 {
				tok = int32(v)
			}
		}
		if tok >= 0 {
			break
		}
	}
	free := int32(-1) // a token not routed to 5
	for v := range c.Vocab {
		hit := false
		for k := range c.TopK {
			hit = hit || binary.LittleEndian.Uint64(tab[8*(v*c.TopK+k):]) == 5
		}
		if !hit {
			free = int32(v)
			break
		}
	}
	m, err := New(w, nil, Options{TraceNonFinite: true})
	if err != nil {
		t.Fatal(err)
	}
	s := m.Cache().NewSequence()
	_, err = m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: []int32{free, free, tok, free}}}})
	var nf *NonFiniteError
	if !errors.As(err, &nf) {
		t.Fatalf("want NonFiniteError, got %v", err)
	}
	t.Log(nf)
	if nf.Component != "layer 0 moe expert 5 w2" || nf.Layer != 0 || nf.Position != 2 || nf.Row != 2 {
		t.Errorf("got component %q layer %d position %d row %d", nf.Component, nf.Layer, nf.Position, nf.Row)
	}
	if !strings.Contains(nf.Error(), "absmax") {
		t.Error("message lacks statistics")
	}
	// Without tracing the NaN surfaces in the logits instead (no error).
	m2, _ := New(w, nil, Options{})
	o, err := m2.Forward(&Batch{Items: []BatchItem{{Seq: m2.Cache().NewSequence(), Tokens: []int32{tok}}}})
	if err != nil {
		t.Fatal(err)
	}
	if v := o.Last(0)[0]; v == v {
		t.Error("planted NaN did not propagate")
	}
}
