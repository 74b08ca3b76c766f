package gpu

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/rope"
)

// TestKVStoreCompact runs TestKVStoreSteps' schedule in faithful numerics on
// three stores: the CPU's fp32 store, the GPU's fp32 store and the GPU's
// compact store. The compact store's attention outputs and indexer
// selections equal the GPU fp32 store's bit for bit (so they match the CPU as
// the fp32 store does), and its bytes are kvcache's encoding of the fp32
// store's values.
func TestKVStoreCompact(t *testing.T) {
	const (
		D, RD, W, ID, IH, H, topK = 128, 64, 16, 64, 4, 8, 12
	)
	spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 8, MaxSlots: 2, Layers: []backend.LayerKV{
		{Window: W, HeadDim: D, RopeDim: RD}, {Window: W, HeadDim: D, RopeDim: RD, Ratio: 4, IndexDim: ID},
		{Window: W, HeadDim: D, RopeDim: RD, Ratio: 128}}}
	steps := [][2]int{{37, 5}, {40, 32}, {60, 30}, {1, 1}, {1, 55}, {3, 1}, {1, 1}, {1, 2}, {1, 1}, {1, 1}}
	p := newPair(t, backend.Faithful)
	g := p.G.(*Backend)
	fr, err := rope.New(RD, 10000, nil)
	must(t, err)
	kv := newKVTwin(t, p, spec)
	cspec := spec
	cspec.Compact = true
	ck, err := g.NewKVStore(cspec)
	must(t, err)
	for s := range cspec.MaxSlots {
		must(t, g.ResetSlot(ck, s))
	}
	ef, err := kvcache.NewEntryFormat(D, RD)
	must(t, err)
	// Compressor parameters per layer and kind (main, indexer), both backends.
	type params struct {
		cm, gm backend.Mat
		cn, gn backend.Vec
	}
	mk := func(r, dc int) (pr params) {
		a := p.Rand(r, coff(r)*dc, 0.5)
		pr.cm = cpu.NewMat(r, coff(r)*dc, a.Host)
		pr.gm, err = g.NewMat(r, coff(r)*dc, a.Host)
		must(t, err)
		nv := p.Rand(1, dc, 0.1)
		for i := range nv.Host {
			nv.Host[i] += 1
		}
		pr.cn = cpu.NewVec(nv.Host)
		pr.gn, err = g.NewVec(nv.Host)
		must(t, err)
		return
	}
	prm := make([][2]params, len(spec.Layers))
	for i, l := range spec.Layers {
		if l.Ratio > 0 {
			prm[i][0] = mk(l.Ratio, D)
			if l.IndexDim > 0 {
				prm[i][1] = mk(l.Ratio, ID)
			}
		}
	}
	// compress runs one compressor on the three stores from the same A, Z.
	compress := func(layer int, kind backend.CompressKind, dc int, pr params, bt *backend.Batch) {
		r, n := spec.Layers[layer].Ratio, bt.Rows()
		A, Z := p.Rand(n, coff(r)*dc, 1), p.Rand(n, coff(r)*dc, 1)
		ca := backend.CompressArgs{Layer: layer, Kind: kind, Ratio: r, Dim: dc, APE: pr.cm, Norm: pr.cn, NormEps: 1e-6, Rope: fr}
		ga := ca
		ga.APE, ga.Norm = pr.gm, pr.gn
		must(t, p.C.Compress(kv.C, A.C, Z.C, ca, bt))
		must(t, g.Compress(kv.G, A.G, Z.G, ga, bt))
		must(t, g.Compress(ck, A.G, Z.G, ga, bt))
	}
	sinkH := p.Rand(1, H, 1).Host
	cs := cpu.NewVec(sinkH)
	gs, err := g.NewVec(sinkH)
	must(t, err)
	starts := []int{0, 0}
	for si, st := range steps {
		bt := opcheck.StepBatch(starts, st[:])
		n := bt.Rows()
		for layer, l := range spec.Layers {
			tag := fmt.Sprintf("step %d layer %d (ratio %d)", si, layer, l.Ratio)
			// kv rows as the model's NormRopeKVQuant leaves them: already in the entry format.
			kvr := p.From(n, D, opcheck.RoundEntries(p, ef, p.Rand(n, D, 1).Host))
			q := p.Rand(n, H*D, 1)
			var sel opcheck.Twin
			if l.Ratio > 0 {
				compress(layer, backend.CompressKV, D, prm[layer][0], bt)
			}
			if l.IndexDim > 0 {
				compress(layer, backend.CompressIndex, ID, prm[layer][1], bt)
				iq, iw := p.Rand(n, IH*ID, 1), p.Rand(n, IH, 0.5)
				ia := backend.IndexerArgs{Layer: layer, Heads: IH, HeadDim: ID, TopK: topK, Ratio: l.Ratio, Trace: true}
				o, oc := p.OutI32(n, topK), p.OutI32(n, topK)
				must(t, p.C.IndexerTopK(kv.C, iq.C, iw.C, ia, bt, o.C))
				must(t, g.IndexerTopK(kv.G, iq.G, iw.G, ia, bt, o.G))
				must(t, g.IndexerTopK(ck, iq.G, iw.G, ia, bt, oc.G))
				want, got := make([]int32, n*topK), make([]int32, n*topK)
				must(t, g.DownloadI32(o.G, want))
				must(t, g.DownloadI32(oc.G, got))
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("%s: indexer id %d: compact store %d, fp32 store %d", tag, i, got[i], want[i])
					}
				}
				oc.C = o.C
				p.CheckIDsTol("indexer (compact) "+tag, oc, 0.05)
				// Attention uses the CPU's selection (plus a -1 and an out-of-range entry).
				ws := append([]int32(nil), o.C.(*cpu.Tensor).I...)
				ws[0], ws[len(ws)-1] = -1, 1<<20
				sel = p.IDs(n, topK, ws)
			}
			aa := backend.AttnArgs{Layer: layer, Heads: H, HeadDim: D, Window: W, Ratio: l.Ratio, Scale: 0.088, Sink: cs}
			ga := aa
			ga.Sink = gs
			o, oc := p.Out(n, H*D), p.Out(n, H*D)
			must(t, p.C.SparseAttention(kv.C, q.C, kvr.C, sel.C, aa, bt, o.C))
			must(t, g.SparseAttention(kv.G, q.G, kvr.G, sel.G, ga, bt, o.G))
			must(t, g.SparseAttention(ck, q.G, kvr.G, sel.G, ga, bt, oc.G))
			want, got := make([]float32, n*H*D), make([]float32, n*H*D)
			must(t, g.Download(o.G, want))
			must(t, g.Download(oc.G, got))
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s: attention output %d: compact store %v, fp32 store %v", tag, i, got[i], want[i])
				}
			}
			oc.C = o.C
			p.Check("attention (compact) "+tag, oc, 2e-3)
			must(t, p.C.WriteWindow(kv.C, layer, kvr.C, bt))
			must(t, g.WriteWindow(kv.G, layer, kvr.G, bt))
			must(t, g.WriteWindow(ck, layer, kvr.G, bt))
		}
		for i := range starts {
			starts[i] += st[i]
		}
	}
	checkCompactBytes(t, g, kv.G.(*kvStore), ck.(*kvStore))
}

// TestKVStoreCompactRejects: a compact store is refused in exact numerics, at
// creation and when the numerics change under it.
func TestKVStoreCompactRejects(t *testing.T) {
	g := openGPU(t, Options{})
	spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 2, MaxSlots: 1, Compact: true,
		Layers: []backend.LayerKV{{Window: 16, HeadDim: 128, RopeDim: 64}}}
	g.SetNumerics(backend.Faithful)
	s, err := g.NewKVStore(spec)
	must(t, err)
	g.SetNumerics(backend.Exact)
	for _, c := range []struct {
		name string
		err  error
	}{
		{"new store", func() error { _, err := g.NewKVStore(spec); return err }()},
		{"reset slot", g.ResetSlot(s, 0)},
	} {
		if c.err == nil {
			t.Errorf("%s: a compact store in exact numerics was accepted", c.name)
		}
	}
}

// checkCompactBytes requires every entry and index key of the compact store
// c to be kvcache's encoding of the fp32 store f's values; entries f never
// wrote (zero) must be zero bytes in c too.
func checkCompactBytes(t *testing.T, g *Backend, f, c *kvStore) {
	t.Helper()
	for i := range f.layers {
		fl, cl := &f.layers[i], &c.layers[i]
		ef, err := kvcache.NewEntryFormat(fl.spec.HeadDim, fl.spec.RopeDim)
		must(t, err)
		enc := func(dst []byte, x []float32) error { return ef.Encode(dst, x) }
		cmpBuffers(t, g, fmt.Sprintf("layer %d window", i), fl.win, cl.win, fl.spec.HeadDim, cl.eb, enc)
		if fl.kv != nil {
			cmpBuffers(t, g, fmt.Sprintf("layer %d entries", i), fl.kv, cl.kv, fl.spec.HeadDim, cl.eb, enc)
		}
		if fl.ik != nil {
			kf, err := kvcache.NewIndexKeyFormat(fl.spec.IndexDim)
			must(t, err)
			cmpBuffers(t, g, fmt.Sprintf("layer %d index keys", i), fl.ik, cl.ik, fl.spec.IndexDim, cl.kb,
				func(dst []byte, x []float32) error { return kf.Encode(dst, x) })
		}
	}
}

// cmpBuffers compares fp32 entries of dim values in fb with compact entries
// of eb bytes in cb.
func cmpBuffers(t *testing.T, g *Backend, name string, fb, cb *cuda.Buffer, dim, eb int, encode func([]byte, []float32) error) {
	t.Helper()
	n := fb.Size / (4 * dim)
	fv := make([]float32, n*dim)
	must(t, g.s.CopyDtoH(cuda.Bytes(fv), fb.Ptr))
	cv := download8(t, g, cb.Ptr, n*eb)
	want, zero := make([]byte, eb), make([]byte, eb)
	written := 0
	for e := range n {
		x, got := fv[e*dim:(e+1)*dim], cv[e*eb:(e+1)*eb]
		clear(want)
		if !allZero(x) {
			must(t, encode(want, x))
			written++
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: entry %d: compact bytes\n%x\nwant (zero %v)\n%x", name, e, got, bytes.Equal(want, zero), want)
		}
	}
	t.Logf("%s: %d of %d entries written, bytes equal", name, written, n)
	if written == 0 {
		t.Errorf("%s: no entry written", name)
	}
}

func allZero(x []float32) bool {
	for _, v := range x {
		if v != 0 {
			return false
		}
	}
	return true
}
