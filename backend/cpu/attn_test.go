package cpu

import (
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/rope"
)

// seqBatch is a one-sequence batch of rows at positions start….
func seqBatch(slot int, blocks []int32, start, rows int) *backend.Batch {
	b := &backend.Batch{Seqs: []backend.SeqInfo{{Slot: slot, Blocks: blocks, Start: start, Rows: rows}}}
	for i := range rows {
		b.Pos = append(b.Pos, int32(start+i))
		b.Seq = append(b.Seq, 0)
	}
	return b
}

// compressRef is the float64 entry j of spec §5.4 (before RMSNorm and RoPE
// it pools; then the norm and the rope at position j·r are applied).
func compressRef(A, Z, ape [][]float64, norm []float64, f *rope.Freqs, r, dc, j int) []float64 {
	type slot struct{ a, z []float64 }
	var slots []slot
	if r == 4 {
		for t := 4*j - 4; t < 4*j; t++ {
			if t >= 0 {
				slots = append(slots, slot{A[t][:dc], addv(Z[t][:dc], ape[t%4][:dc])})
			}
		}
		for t := 4 * j; t < 4*j+4; t++ {
			slots = append(slots, slot{A[t][dc:], addv(Z[t][dc:], ape[t%4][dc:])})
		}
	} else {
		for t := r * j; t < r*j+r; t++ {
			slots = append(slots, slot{A[t], addv(Z[t], ape[t%r])})
		}
	}
	u := make([]float64, dc)
	for ch := range dc {
		mx := math.Inf(-1)
		for _, s := range slots {
			mx = math.Max(mx, s.z[ch])
		}
		var den float64
		for _, s := range slots {
			den += math.Exp(s.z[ch] - mx)
		}
		for _, s := range slots {
			u[ch] += math.Exp(s.z[ch]-mx) / den * s.a[ch]
		}
	}
	var ss float64
	for _, v := range u {
		ss += v * v
	}
	rr := 1 / math.Sqrt(ss/float64(dc)+1e-6)
	for i := range u {
		u[i] *= rr * norm[i]
	}
	rd := f.Dim()
	for p := range rd / 2 {
		i := dc - rd + 2*p
		th := float64(j*r) * f.F64[p]
		a, b := u[i], u[i+1]
		u[i], u[i+1] = a*math.Cos(th)-b*math.Sin(th), a*math.Sin(th)+b*math.Cos(th)
	}
	return u
}

func addv(a, b []float64) []float64 {
	o := make([]float64, len(a))
	for i := range a {
		o[i] = a[i] + b[i]
	}
	return o
}

func rows64(v []float32, n, w int) [][]float64 {
	out := make([][]float64, n)
	for i := range out {
		out[i] = f64(v[i*w : (i+1)*w])
	}
	return out
}

// TestCompressorVsFloat64 covers the ratio-4 overlap (8 slots, the first entry
// with only 4) and ratio 128, fed in uneven chunks so the pending state and the
// previous-window roll are exercised across calls.
func TestCompressorVsFloat64(t *testing.T) {
	f, _ := rope.New(64, 160000, &rope.YaRN{Factor: 16, OriginalLen: 65536, BetaFast: 32, BetaSlow: 1})
	for _, tc := range []struct {
		ratio, tokens int
		chunks        []int
	}{{4, 22, []int{1, 5, 3, 7, 6}}, {128, 300, []int{100, 1, 60, 139}}} {
		r, dc := tc.ratio, 128
		c := coff(r)
		b := newB(backend.Exact)
		st, err := b.NewKVStore(backend.KVSpec{BlockTokens: 256, MaxBlocks: 4, MaxSlots: 1,
			Layers: []backend.LayerKV{{Window: 16, HeadDim: dc, Ratio: r}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.ResetSlot(st, 0); err != nil {
			t.Fatal(err)
		}
		rg := rnd(uint64(r))
		w := c * dc
		A := randVec(rg, tc.tokens*w, 1, false)
		Z := randVec(rg, tc.tokens*w, 2, false)
		ape := randVec(rg, r*w, 1, false)
		norm := randVec(rg, dc, 0.3, false)
		for i := range norm {
			norm[i] += 1
		}
		args := backend.CompressArgs{Layer: 0, Kind: backend.CompressKV, Ratio: r, Dim: dc, APE: NewMat(r, w, ape), Norm: NewVec(norm), NormEps: 1e-6, Rope: f}
		blocks := []int32{0, 1}
		pos := 0
		for _, n := range tc.chunks {
			bt := seqBatch(0, blocks, pos, n)
			if err := b.Compress(st, NewTensor(n, w, A[pos*w:(pos+n)*w]), NewTensor(n, w, Z[pos*w:(pos+n)*w]), args, bt); err != nil {
				t.Fatal(err)
			}
			pos += n
		}
		k := st.(*kvStore)
		sq := &backend.SeqInfo{Blocks: blocks}
		for j := range tc.tokens / r {
			got, err := k.entry(sq, 0, j, false)
			if err != nil {
				t.Fatal(err)
			}
			want := compressRef(rows64(A, tc.tokens, w), rows64(Z, tc.tokens, w), rows64(ape, r, w), f64(norm), f, r, dc, j)
			if e := relErr(got, want); e > 1e-5 {
				t.Errorf("ratio %d entry %d: rel err %.3g", r, j, e)
			}
		}
		// The entry after the last complete window is untouched (still zero).
		next, _ := k.entry(sq, 0, tc.tokens/r, false)
		for _, v := range next {
			if v != 0 {
				t.Fatalf("ratio %d: incomplete window %d was emitted", r, tc.tokens/r)
			}
		}
	}
}

// attnRef is float64 sparse MQA with sink for one head (spec §5.7).
func attnRef(q []float64, keys [][]float64, sink, scale float64) []float64 {
	s := make([]float64, len(keys))
	m := math.Inf(-1)
	for i, k := range keys {
		for d := range q {
			s[i] += q[d] * k[d]
		}
		s[i] *= scale
		m = math.Max(m, s[i])
	}
	den := math.Exp(sink - m)
	for i := range s {
		den += math.Exp(s[i] - m)
	}
	o := make([]float64, len(q))
	for i, k := range keys {
		p := math.Exp(s[i]-m) / den
		for d := range o {
			o[d] += p * k[d]
		}
	}
	return o
}

// TestSparseAttentionSinkAndVisibility: window keys (ring + fresh rows) and
// HCA entries against float64 math with the sink in the denominator only; a
// compressed entry is invisible until its window is complete.
func TestSparseAttentionSinkAndVisibility(t *testing.T) {
	const D, H, W = 64, 2, 8
	b := newB(backend.Exact)
	st, _ := b.NewKVStore(backend.KVSpec{BlockTokens: 256, MaxBlocks: 2, MaxSlots: 1, Layers: []backend.LayerKV{{Window: W, HeadDim: D, Ratio: 128}}})
	b.ResetSlot(st, 0)
	k := st.(*kvStore)
	rg := rnd(9)
	blocks := []int32{0}
	sq := &backend.SeqInfo{Blocks: blocks}
	e0, _ := k.entry(sq, 0, 0, false)
	copy(e0, randVec(rg, D, 1, false))
	sink := []float32{0.5, -1}
	// Prefill 120 tokens so the ring holds positions 112..119, then a chunk 120..129.
	kv := randVec(rg, 130*D, 1, false)
	if err := b.WriteWindow(st, 0, NewTensor(120, D, kv[:120*D]), seqBatch(0, blocks, 0, 120)); err != nil {
		t.Fatal(err)
	}
	q := randVec(rg, 10*H*D, 1, false)
	bt := seqBatch(0, blocks, 120, 10)
	out := b.Alloc(10, H*D, backend.F32).(*Tensor)
	args := backend.AttnArgs{Layer: 0, Heads: H, HeadDim: D, Window: W, Ratio: 128, Scale: 0.125, Sink: NewVec(sink)}
	if err := b.SparseAttention(st, NewTensor(10, H*D, q), NewTensor(10, D, kv[120*D:]), nil, args, bt, out); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		tpos := 120 + i
		var keys [][]float64
		for p := tpos - W + 1; p <= tpos; p++ {
			keys = append(keys, f64(kv[p*D:(p+1)*D]))
		}
		if (tpos+1)/128 > 0 { // entry 0 visible from position 127 on
			keys = append(keys, f64(e0))
		}
		for h := range H {
			want := attnRef(f64(q[(i*H+h)*D:(i*H+h+1)*D]), keys, float64(sink[h]), 0.125)
			if e := relErr(out.Row(i)[h*D:(h+1)*D], want); e > 1e-5 {
				t.Errorf("pos %d head %d: rel err %.3g", tpos, h, e)
			}
		}
	}
	// Visibility made stark: entry 0 = NaN poisons exactly the rows at t ≥ 127.
	for i := range e0 {
		e0[i] = float32(math.NaN())
	}
	b.SparseAttention(st, NewTensor(10, H*D, q), NewTensor(10, D, kv[120*D:]), nil, args, bt, out)
	for i := range 10 {
		bad := SliceStats(out.Row(i)).FirstBad >= 0
		if bad != (120+i >= 127) {
			t.Errorf("pos %d: NaN entry visible=%v", 120+i, bad)
		}
	}
}

// TestSinkMass: with one key and q·k = 0, p = 1/(1+e^sink).
func TestSinkMass(t *testing.T) {
	b := newB(backend.Exact)
	st, _ := b.NewKVStore(backend.KVSpec{BlockTokens: 256, MaxSlots: 1, Layers: []backend.LayerKV{{Window: 4, HeadDim: 4, Ratio: 0}}})
	b.ResetSlot(st, 0)
	for _, sink := range []float32{-2, 0, 3} {
		out := b.Alloc(1, 4, backend.F32).(*Tensor)
		kv := []float32{1, 2, 3, 4}
		err := b.SparseAttention(st, NewTensor(1, 4, []float32{0, 0, 0, 0}), NewTensor(1, 4, kv), nil,
			backend.AttnArgs{Heads: 1, HeadDim: 4, Window: 4, Scale: 0.5, Sink: NewVec([]float32{sink})}, seqBatch(0, nil, 0, 1), out)
		if err != nil {
			t.Fatal(err)
		}
		p := 1 / (1 + math.Exp(float64(sink)))
		for d := range 4 {
			if math.Abs(float64(out.F[d])-p*float64(kv[d])) > 1e-6 {
				t.Errorf("sink %g: o[%d] = %g, want %g", sink, d, out.F[d], p*float64(kv[d]))
			}
		}
	}
}

// TestIndexerTopK: scores Σ_h w_h·ReLU(q_h·k_j) against float64, only complete
// entries are candidates, descending order, ties → lower index, -1 padding.
func TestIndexerTopK(t *testing.T) {
	const Hi, Di = 2, 64
	b := newB(backend.Exact)
	st, _ := b.NewKVStore(backend.KVSpec{BlockTokens: 256, MaxBlocks: 1, MaxSlots: 1, Layers: []backend.LayerKV{{Window: 4, HeadDim: 64, Ratio: 4, IndexDim: Di}}})
	b.ResetSlot(st, 0)
	k := st.(*kvStore)
	blocks := []int32{0}
	sq := &backend.SeqInfo{Blocks: blocks}
	rg := rnd(5)
	keys := make([][]float32, 6)
	for j := range keys {
		e, _ := k.entry(sq, 0, j, true)
		copy(e, randVec(rg, Di, 1, false))
		keys[j] = e
	}
	copy(keys[4], keys[1]) // exact tie between entries 1 and 4
	q := randVec(rg, Hi*Di, 1, false)
	w := []float32{0.7, 0.4}
	pos := []int{2, 6, 18, 23}
	bt := &backend.Batch{Seqs: []backend.SeqInfo{{Slot: 0, Blocks: blocks, Start: 0, Rows: len(pos)}}}
	qs := make([]float32, 0)
	ws := make([]float32, 0)
	for _, p := range pos {
		bt.Pos = append(bt.Pos, int32(p))
		bt.Seq = append(bt.Seq, 0)
		qs = append(qs, q...)
		ws = append(ws, w...)
	}
	const topk = 4
	out := b.Alloc(len(pos), topk, backend.I32).(*Tensor)
	if err := b.IndexerTopK(st, NewTensor(len(pos), Hi*Di, qs), NewTensor(len(pos), Hi, ws), backend.IndexerArgs{Heads: Hi, HeadDim: Di, TopK: topk, Ratio: 4}, bt, out); err != nil {
		t.Fatal(err)
	}
	score := func(j int) float64 {
		var s float64
		for h := range Hi {
			var d float64
			for i := range Di {
				d += float64(q[h*Di+i]) * float64(keys[j][i])
			}
			s += float64(w[h]) * math.Max(d, 0)
		}
		return s
	}
	for ri, p := range pos {
		avail := (p + 1) / 4
		var want []int32
		for len(want) < min(topk, avail) {
			best := -1
			for j := range avail {
				if contains(want, int32(j)) {
					continue
				}
				if best < 0 || score(j) > score(best)+1e-9 {
					best = j
				}
			}
			want = append(want, int32(best))
		}
		for len(want) < topk {
			want = append(want, -1)
		}
		got := out.I[ri*topk : (ri+1)*topk]
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("pos %d: selection %v, want %v", p, got, want)
				break
			}
		}
	}
}

func contains(s []int32, v int32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
