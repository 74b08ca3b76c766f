package gpu

import (
	"errors"
	"math"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// TestSideStreamSameBits: with the side stream on, eager and recorded steps
// (prefill chunks and decode steps of every layer kind, forks at both) give
// the logits of the main stream alone bit for bit, and forks did run.
func TestSideStreamSameBits(t *testing.T) {
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 3)
	type run struct {
		name string
		g    *Backend
		m    *model.Model
		seqs []*kvcache.Sequence
	}
	var runs []*run
	for _, o := range []struct {
		name string
		opt  Options
	}{{"main stream", Options{NoSideStream: true}}, {"side, eager", Options{}}, {"side, graphs", Options{Graphs: true}}} {
		g := openGPU(t, o.opt)
		m, err := model.New(w, g, model.Options{CacheBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, &run{name: o.name, g: g, m: m})
	}
	prompts := [][]int32{make([]int32, 9), make([]int32, 3)}
	for i, p := range prompts {
		for k := range p {
			p[k] = int32((i*131 + k*7919) % c.Vocab)
		}
	}
	same := func(what string, outs []*model.Output, rows int) {
		t.Helper()
		for k := range rows {
			ref := outs[0].Last(k)
			for i, o := range outs[1:] {
				got := o.Last(k)
				for v := range ref {
					if math.Float32bits(ref[v]) != math.Float32bits(got[v]) {
						t.Fatalf("%s, row %d: logit %d %s %g, %s %g", what, k, v, runs[0].name, ref[v], runs[i+1].name, got[v])
					}
				}
			}
		}
	}
	next := make([]int32, len(prompts))
	for i, p := range prompts {
		for at := 0; at < len(p); at += 8 { // chunks of 8, 1 and 3: forks in prefill too
			outs := make([]*model.Output, len(runs))
			for j, r := range runs {
				if at == 0 {
					r.seqs = append(r.seqs, r.m.Cache().NewSequence())
				}
				var err error
				if outs[j], err = r.m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: r.seqs[i], Tokens: p[at:min(at+8, len(p))]}}}); err != nil {
					t.Fatalf("%s: prefill: %v", r.name, err)
				}
			}
			same("prefill", outs, 1)
			next[i] = engine.Argmax(outs[0].Last(0))
		}
	}
	for step := range 2 {
		outs := make([]*model.Output, len(runs))
		for j, r := range runs {
			b := &model.Batch{}
			for k, s := range r.seqs {
				b.Items = append(b.Items, model.BatchItem{Seq: s, Tokens: []int32{next[k]}})
			}
			var err error
			if outs[j], err = r.m.Forward(b); err != nil {
				t.Fatalf("%s: decode step %d: %v", r.name, step, err)
			}
		}
		same("decode", outs, len(prompts))
		for k := range next {
			next[k] = engine.Argmax(outs[0].Last(k))
		}
	}
	for _, r := range runs[1:] {
		if r.g.side.forks == 0 {
			t.Errorf("%s: no fork ran on the side stream", r.name)
		}
		if r.g.side.open {
			t.Errorf("%s: a fork is still open after the steps", r.name)
		}
	}
	if st := runs[2].g.GraphStats(); st.Replayed == 0 || len(st.Failed) > 0 {
		t.Errorf("side, graphs: no step replayed or a recording failed: %+v", st)
	}
}

// TestForkRules: what Fork and Join promise besides the bits: a sync inside
// the fork's ops does not end it, a fork inside a fork or above sideMaxRows
// rows runs in order, an error joins at once, and a block the fork frees is
// not handed out before the join.
func TestForkRules(t *testing.T) {
	g := openGPU(t, Options{})
	must(t, g.Fork(1, nil, func() error {
		if err := g.Sync(); err != nil {
			return err
		}
		return g.Fork(1, nil, func() error { // nested: in order, on the side stream
			if g.s != g.side.s {
				t.Error("a nested fork left the side stream")
			}
			return nil
		})
	}))
	if !g.side.open || g.side.forks != 1 {
		t.Fatalf("after a fork whose ops synced: open %v, %d forks; want open, 1", g.side.open, g.side.forks)
	}
	must(t, g.Join())
	if g.side.open {
		t.Fatal("Join left the fork open")
	}
	must(t, g.Fork(sideMaxRows+1, nil, func() error { return nil }))
	if g.side.open || g.side.forks != 1 {
		t.Error("a step above sideMaxRows rows forked")
	}
	bad := errors.New("op failed")
	if err := g.Fork(1, nil, func() error { return bad }); !errors.Is(err, bad) || g.side.open {
		t.Errorf("failing fork: %v, open %v; want the op's error and the fork joined", err, g.side.open)
	}
	var freed cuda.DevicePtr
	must(t, g.Fork(1, nil, func() error {
		buf, err := g.scratch(4096)
		if err == nil {
			freed = buf.Ptr
			buf.Free()
		}
		return err
	}))
	buf, err := g.scratch(4096)
	must(t, err)
	if buf.Ptr == freed {
		t.Error("a block freed inside the fork was reused before the join")
	}
	buf.Free()
	must(t, g.Join())
}
