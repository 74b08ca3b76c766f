package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/safetensors"
)

func loadShardModel(t *testing.T) *Weights {
	t.Helper()
	dir := t.TempDir()
	if err := Generate(dir, GenSpec{Format: GenOfficial, Seed: 1, Preset: "small-tp"}); err != nil {
		t.Fatal(err)
	}
	w, st, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if w.Config.Vocab%4 != 0 {
		t.Fatalf("generated vocab %d is not divisible by 2 and 4", w.Config.Vocab)
	}
	return w
}

// layersOf lists the main layers and the MTP blocks' layers.
func layersOf(w *Weights) []*Layer {
	var ls []*Layer
	for i := range w.Layers {
		ls = append(ls, &w.Layers[i])
	}
	for i := range w.MTP {
		ls = append(ls, &w.MTP[i].Layer)
	}
	return ls
}

func sameData(a, b []byte) bool { return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) }

// rowsOf and colsOf are the reference slices of a row-major matrix with
// rowBytes bytes per row; lo and hi count bytes for colsOf.
func rowsOf(data []byte, rowBytes, lo, hi int) []byte { return data[lo*rowBytes : hi*rowBytes] }

func colsOf(data []byte, rowBytes, lo, hi int) []byte {
	var out []byte
	for r := 0; r < len(data); r += rowBytes {
		out = append(out, data[r+lo:r+hi]...)
	}
	return out
}

// joinCols glues the column blocks of parts (each rows×width) back together.
func joinCols(parts [][]byte, rows int) []byte {
	var out []byte
	for r := range rows {
		for _, p := range parts {
			w := len(p) / rows
			out = append(out, p[r*w:(r+1)*w]...)
		}
	}
	return out
}

// checksum hashes a few of w's split tensors (weights and scales).
func checksum(w *Weights) [32]byte {
	h := sha256.New()
	for _, l := range layersOf(w) {
		for _, b := range [][]byte{l.Attn.WqB.Weight.Data, l.Attn.WqB.Scale.Data, l.Attn.WoB.Weight.Data, l.Attn.WoB.Scale.Data, l.Attn.Sink.Data} {
			h.Write(b)
		}
	}
	h.Write(w.Head.Weight.Data)
	return [32]byte(h.Sum(nil))
}

// checkLinear checks part's shape and that its weight and scale are the
// reference slice [lo, hi) of orig's (rows, or columns when !byRows).
func checkLinear(t *testing.T, orig, part Linear, byRows bool, lo, hi int) {
	t.Helper()
	out, in := orig.Out, hi-lo
	if byRows {
		out, in = hi-lo, orig.In
	}
	if part.Out != out || part.In != in || !slices.Equal(part.Weight.Shape, []int{out, in}) || part.Name != orig.Name {
		t.Fatalf("%s: %dx%d shape %v, want %dx%d", orig.Name, part.Out, part.In, part.Weight.Shape, out, in)
	}
	es := orig.Weight.DType.Size()
	cut := func(data []byte, rowBytes, es, lo, hi int) []byte {
		if byRows {
			return rowsOf(data, rowBytes, lo, hi)
		}
		return colsOf(data, rowBytes, lo*es, hi*es)
	}
	if !bytes.Equal(part.Weight.Data, cut(orig.Weight.Data, orig.In*es, es, lo, hi)) {
		t.Errorf("%s [%d, %d): weight bytes differ from the original's slice", orig.Name, lo, hi)
	}
	if orig.Format == FormatFP8Block {
		sc := ceilDiv(orig.In, 128)
		want := cut(orig.Scale.Data, sc, 1, lo/128, ceilDiv(hi, 128))
		if !bytes.Equal(part.Scale.Data, want) || !slices.Equal(part.Scale.Shape, []int{ceilDiv(out, 128), ceilDiv(in, 128)}) {
			t.Errorf("%s [%d, %d): scale %v differs from the original's slice", orig.Name, lo, hi, part.Scale.Shape)
		}
	}
}

func TestShard(t *testing.T) {
	w := loadShardModel(t)
	c := w.Config
	t.Logf("generated vocab %d", c.Vocab)
	before, heads := checksum(w), c.Heads
	for _, size := range []int{2, 4} {
		parts := make([]*Weights, size)
		for rank := range size {
			s, err := Shard(w, rank, size)
			if err != nil {
				t.Fatalf("Shard(%d, %d): %v", rank, size, err)
			}
			parts[rank] = s
			sc := s.Config
			if sc == c || sc.Heads != c.Heads/size || sc.OGroups != c.OGroups/size || sc.Experts != c.Experts ||
				sc.Vocab != c.Vocab || sc.IndexHeads != c.IndexHeads || sc.HeadDim != c.HeadDim || sc.OLoraRank != c.OLoraRank {
				t.Errorf("rank %d/%d config %+v", rank, size, *sc)
			}
			ne, nv := c.Experts/size, c.Vocab/size
			if want := (Part{rank, size, rank * ne, (rank + 1) * ne, rank * nv, (rank + 1) * nv}); s.Part == nil || *s.Part != want {
				t.Errorf("rank %d/%d part %+v, want %+v", rank, size, s.Part, want)
			}
			if len(s.MTP) != len(w.MTP) || len(s.Layers) != len(w.Layers) || len(w.MTP) == 0 {
				t.Fatalf("rank %d/%d: %d layers %d mtp", rank, size, len(s.Layers), len(s.MTP))
			}
			q, o, hl := c.HeadDim*c.Heads/size, c.OGroups/size*c.OLoraRank, c.Heads/size
			ol := layersOf(w)
			for i, l := range layersOf(s) {
				a, oa := &l.Attn, &ol[i].Attn
				checkLinear(t, oa.WqB, a.WqB, true, rank*q, (rank+1)*q)
				checkLinear(t, oa.WoA, a.WoA, true, rank*o, (rank+1)*o)
				checkLinear(t, oa.WoB, a.WoB, false, rank*o, (rank+1)*o)
				if !bytes.Equal(a.Sink.Data, oa.Sink.Data[4*rank*hl:4*(rank+1)*hl]) || !slices.Equal(a.Sink.Shape, []int{hl}) {
					t.Errorf("layer %d sink %v", l.Index, a.Sink.Shape)
				}
				if len(l.FFN.Experts) != ne {
					t.Fatalf("layer %d: %d experts, want %d", l.Index, len(l.FFN.Experts), ne)
				}
				for j, e := range l.FFN.Experts {
					oe := ol[i].FFN.Experts[rank*ne+j]
					if e.W1.Name != oe.W1.Name || !sameData(e.W1.Weight.Data, oe.W1.Weight.Data) ||
						!sameData(e.W2.Scale.Data, oe.W2.Scale.Data) || !sameData(e.W3.Weight.Data, oe.W3.Weight.Data) {
						t.Errorf("layer %d expert %d is not the original's expert %d", l.Index, j, rank*ne+j)
					}
				}
				// Replicated: the same bytes, not copies.
				for name, pair := range map[string][2][]byte{
					"wq_a": {a.WqA.Weight.Data, oa.WqA.Weight.Data}, "wkv": {a.WKV.Weight.Data, oa.WKV.Weight.Data},
					"gate": {l.FFN.Gate.Weight.Data, ol[i].FFN.Gate.Weight.Data}, "shared.w2": {l.FFN.Shared.W2.Weight.Data, ol[i].FFN.Shared.W2.Weight.Data},
					"hc_attn": {l.HcAttn.Fn.Data, ol[i].HcAttn.Fn.Data},
				} {
					if !sameData(pair[0], pair[1]) {
						t.Errorf("layer %d %s not shared", l.Index, name)
					}
				}
				if a.Indexer != nil && (!sameData(a.Indexer.WqB.Weight.Data, oa.Indexer.WqB.Weight.Data) || a.Indexer.WqB.Out != oa.Indexer.WqB.Out) {
					t.Errorf("layer %d indexer wq_b not shared", l.Index)
				}
			}
			checkLinear(t, w.Head, s.Head, true, rank*nv, (rank+1)*nv)
			if !sameData(s.Embed.Data, w.Embed.Data) || !sameData(s.Norm.Data, w.Norm.Data) || !sameData(s.MTP[0].EProj.Weight.Data, w.MTP[0].EProj.Weight.Data) {
				t.Errorf("rank %d/%d: embed, norm or mtp e_proj not shared", rank, size)
			}
		}

		// The ranks' slices put together are the original, bytes and scales.
		ol := layersOf(w)
		for i := range ol {
			var wqb, wqbS, woa, woaS, wob, wobS [][]byte
			for _, p := range parts {
				a := &layersOf(p)[i].Attn
				wqb, wqbS = append(wqb, a.WqB.Weight.Data), append(wqbS, a.WqB.Scale.Data)
				woa, woaS = append(woa, a.WoA.Weight.Data), append(woaS, a.WoA.Scale.Data)
				wob, wobS = append(wob, a.WoB.Weight.Data), append(wobS, a.WoB.Scale.Data)
			}
			a := &ol[i].Attn
			for _, chk := range []struct {
				name      string
				got, want []byte
			}{
				{"wq_b", bytes.Join(wqb, nil), a.WqB.Weight.Data}, {"wq_b.scale", bytes.Join(wqbS, nil), a.WqB.Scale.Data},
				{"wo_a", bytes.Join(woa, nil), a.WoA.Weight.Data}, {"wo_a.scale", bytes.Join(woaS, nil), a.WoA.Scale.Data},
				{"wo_b", joinCols(wob, a.WoB.Out), a.WoB.Weight.Data}, {"wo_b.scale", joinCols(wobS, ceilDiv(a.WoB.Out, 128)), a.WoB.Scale.Data},
			} {
				if !bytes.Equal(chk.got, chk.want) {
					t.Errorf("size %d layer %d: joined %s differs from the original", size, ol[i].Index, chk.name)
				}
			}
		}
		var head [][]byte
		for _, p := range parts {
			head = append(head, p.Head.Weight.Data)
		}
		if !bytes.Equal(bytes.Join(head, nil), w.Head.Weight.Data) {
			t.Errorf("size %d: joined head differs", size)
		}
	}

	one, err := Shard(w, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Part{0, 1, 0, c.Experts, 0, c.Vocab}); one.Part == nil || *one.Part != want || len(one.Layers[0].FFN.Experts) != c.Experts || one.Config.Heads != c.Heads {
		t.Errorf("size 1: part %+v", one.Part)
	}
	if checksum(w) != before || w.Config.Heads != heads || w.Part != nil || w.Layers[0].Attn.WqB.Out != heads*c.HeadDim ||
		len(w.Layers[0].FFN.Experts) != c.Experts || w.Layers[0].Attn.WoB.Weight.Shape[1] != c.OGroups*c.OLoraRank {
		t.Error("Shard modified the original weights")
	}
}

func TestShardErrors(t *testing.T) {
	w := loadShardModel(t)
	s2, err := Shard(w, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	// The small preset with one head per group: 2 ranks cut wo_a at 3·64 rows.
	misaligned := SmallConfig()
	misaligned.OGroups, misaligned.Vocab = 6, 300
	dir := t.TempDir()
	if err := writeModel(dir, misaligned, GenOfficial, 7, 0, fakeTokenizer, nil); err != nil {
		t.Fatal(err)
	}
	wm, st, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	preset := *wm
	preset.Config = SmallConfig()

	for _, tc := range []struct {
		name       string
		w          *Weights
		rank, size int
		want       []string
	}{
		{"nil", nil, 0, 1, []string{"nil weights"}},
		{"nil config", &Weights{}, 0, 1, []string{"nil weights or config"}},
		{"size 0", w, 0, 0, []string{"size = 0"}},
		{"rank = size", w, 2, 2, []string{"rank = 2 outside [0, 2)"}},
		{"negative rank", w, -1, 2, []string{"rank = -1"}},
		{"heads", w, 0, 3, []string{"Heads = 4 not divisible by size 3", "OGroups = 4", "Experts = 8"}},
		{"preset experts", &preset, 0, 3, []string{"Experts = 8 not divisible by size 3"}},
		{"preset groups", &preset, 0, 2, []string{"OGroups = 3 not divisible by size 2"}},
		{"fp8 alignment", wm, 0, 2, []string{"shard layers.0.attn.wo_a: rows [0, 192) not aligned to the 128-tall scale blocks"}},
		{"re-shard", s2, 0, 2, []string{"already rank 1 of 2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Shard(tc.w, tc.rank, tc.size)
			if err == nil {
				t.Fatal("no error")
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// TestCutLinear checks the slicing helpers on synthetic matrices, including
// a partial last scale block and the formats that must not be cut.
func TestCutLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	mk := func(f Format, out, in int) Linear {
		dt, es := map[Format]safetensors.DType{FormatBF16: safetensors.BF16, FormatF32: safetensors.F32, FormatFP8Block: safetensors.F8E4M3}[f], map[Format]int{FormatBF16: 2, FormatF32: 4, FormatFP8Block: 1}[f]
		data := make([]byte, out*in*es)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		l := Linear{Name: "x", Format: f, Out: out, In: in, Weight: safetensors.Tensor{Name: "x.weight", DType: dt, Shape: []int{out, in}, Data: data}}
		if f == FormatFP8Block {
			sr, sc := ceilDiv(out, 128), ceilDiv(in, 128)
			s := make([]byte, sr*sc)
			for i := range s {
				s[i] = byte(rng.Uint32())
			}
			l.Scale = safetensors.Tensor{Name: "x.scale", DType: safetensors.F8E8M0, Shape: []int{sr, sc}, Data: s}
		}
		return l
	}
	for _, tc := range []struct {
		name    string
		l       Linear
		byRows  bool
		lo, hi  int
		wantErr string
	}{
		{"bf16 rows", mk(FormatBF16, 6, 5), true, 2, 4, ""},
		{"bf16 cols", mk(FormatBF16, 6, 5), false, 1, 3, ""},
		{"f32 cols", mk(FormatF32, 3, 8), false, 4, 8, ""},
		{"fp8 rows partial block", mk(FormatFP8Block, 200, 300), true, 128, 200, ""},
		{"fp8 cols partial block", mk(FormatFP8Block, 200, 300), false, 256, 300, ""},
		{"fp8 cols", mk(FormatFP8Block, 130, 512), false, 128, 384, ""},
		{"fp8 cols misaligned", mk(FormatFP8Block, 256, 256), false, 64, 128, "columns [64, 128) not aligned to the 128-wide scale blocks"},
		{"fp8 rows misaligned", mk(FormatFP8Block, 256, 256), true, 0, 64, "rows [0, 64) not aligned"},
		{"out of range", mk(FormatBF16, 4, 4), true, 2, 5, "rows [2, 5) outside [0, 4)"},
		{"mxfp4", Linear{Name: "x", Format: FormatMXFP4, Out: 4, In: 64}, true, 0, 2, "mxfp4 linears are never sliced"},
		{"nvfp4", Linear{Name: "x", Format: FormatNVFP4, Out: 4, In: 64}, false, 0, 32, "nvfp4 linears are never sliced"},
		{"short data", func() Linear { l := mk(FormatBF16, 4, 4); l.Weight.Data = l.Weight.Data[:10]; return l }(), true, 0, 2, "10 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shape := slices.Clone(tc.l.Weight.Shape)
			got, err := cutLinear(tc.l, tc.byRows, tc.lo, tc.hi)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "shard x: ") {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkLinear(t, tc.l, got, tc.byRows, tc.lo, tc.hi)
			if !slices.Equal(tc.l.Weight.Shape, shape) {
				t.Error("original shape modified")
			}
		})
	}
	sink := safetensors.Tensor{Name: "s", DType: safetensors.F32, Shape: []int{4}, Data: make([]byte, 16)}
	if _, err := cutVector(safetensors.Tensor{DType: safetensors.BF16, Shape: []int{4}, Data: make([]byte, 8)}, 4, 0, 2); err == nil {
		t.Error("cutVector accepted a bf16 vector")
	}
	if _, err := cutVector(sink, 6, 0, 3); err == nil {
		t.Error("cutVector accepted a wrong element count")
	}
	if s, err := cutVector(sink, 4, 2, 4); err != nil || len(s.Data) != 8 || cap(s.Data) != 8 || &s.Data[0] != &sink.Data[8] {
		t.Errorf("cutVector = %v, %v", s, err)
	}
}
