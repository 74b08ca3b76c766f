package gpu

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/parallel"
)

// TestNCCLSingleRank: the NCCL binding on one GPU — a one-rank all-reduce
// leaves the values as they are and a one-rank all-gather copies them.
func TestNCCLSingleRank(t *testing.T) {
	g := openGPU(t, Options{})
	comms, closeAll, err := NewNCCLComms([]*Backend{g})
	if err != nil {
		t.Fatalf("NCCL on a GPU machine: %v", err)
	}
	defer closeAll()
	c := comms[0]
	if c.Rank() != 0 || c.Size() != 1 {
		t.Fatalf("rank %d of %d", c.Rank(), c.Size())
	}
	v := make([]float32, 3*129)
	for i := range v {
		v[i] = float32(i)*0.5 - 7
	}
	x := g.Alloc(3, 129, backend.F32)
	must(t, g.Upload(x, v))
	must(t, c.AllReduceSum(g, x))
	out := g.Alloc(3, 129, backend.F32)
	must(t, g.Upload(out, make([]float32, len(v))))
	must(t, c.AllGatherRows(g, x, out))
	for _, tt := range []backend.Tensor{x, out} {
		got := make([]float32, len(v))
		must(t, g.Download(tt, got))
		if !slices.Equal(got, v) {
			t.Fatalf("one-rank collective changed the values: %v...", got[:4])
		}
	}
	if err := c.AllGatherRows(g, x, g.Alloc(2, 129, backend.F32)); err == nil {
		t.Error("all-gather into the wrong shape accepted")
	}
}

// TestParallelOnGPU runs the tensor- and expert-parallel model with every
// rank on a GPU backend (two backends on GPU 0 exchanging through host
// memory; over NCCL between GPUs 0 and 1 when there are two) and requires
// the CPU single-rank greedy tokens in exact numerics.
func TestParallelOnGPU(t *testing.T) {
	g0 := openGPU(t, Options{})
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "tp"), checkpoint.GenSpec{Seed: 5, Preset: "small-tp"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	opts := model.Options{Numerics: "exact", CacheBytes: 16 << 20}
	single, err := model.New(w, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{5, 17, 300, 2, 999, 41, 7, 7, 64, 128, 3}
	greedy := func(m engine.Stepper) []int32 {
		s := m.Cache().NewSequence()
		defer m.FreeSequence(s)
		var toks []int32
		in := prompt
		for range 10 {
			o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: in}}})
			if err != nil {
				t.Fatal(err)
			}
			next := engine.Argmax(o.Last(0))
			toks, in = append(toks, next), []int32{next}
		}
		return toks
	}
	want := greedy(single)
	g1, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g1.Close()
	type setup struct {
		name  string
		bes   []backend.Backend
		comms []parallel.Comm
	}
	setups := []setup{{name: "host exchange, 2 ranks on GPU 0", bes: []backend.Backend{g0, g1}}}
	if n, _ := g0.drv.DeviceCount(); n >= 2 {
		gb, err := New(Options{Device: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer gb.Close()
		comms, closeAll, err := NewNCCLComms([]*Backend{g0, gb})
		if err != nil {
			t.Fatal(err)
		}
		defer closeAll()
		setups = append(setups, setup{name: "NCCL, GPUs 0 and 1", bes: []backend.Backend{g0, gb}, comms: comms})
	}
	for _, s := range setups {
		var p *model.Parallel
		if s.comms == nil {
			p, err = model.NewParallel(w, s.bes, opts)
		} else {
			p, err = model.NewParallelComms(w, s.bes, s.comms, opts)
		}
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got := greedy(p)
		t.Logf("%s: greedy %v, single-rank CPU %v", s.name, got, want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: greedy tokens %v, single-rank CPU %v", s.name, got, want)
		}
	}
}
