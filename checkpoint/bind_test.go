package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/safetensors"
)

// fakeTokenizer stands in for tokenizer.json where only the weights matter.
var fakeTokenizer = []byte(`{"model":{"vocab":{}}}`)

// testConfig is the small preset with a small vocab (keeps tests fast).
func testConfig() *Config {
	c := SmallConfig()
	c.Vocab = 300
	return c
}

func writeTest(t *testing.T, format string) string {
	t.Helper()
	dir := t.TempDir()
	if err := writeModel(dir, testConfig(), format, 7, 0, fakeTokenizer, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// countTensors counts the bound tensors reachable from v.
func countTensors(v reflect.Value, n *int, empty *[]string, path string) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			countTensors(v.Elem(), n, empty, path)
		}
	case reflect.Slice:
		for i := range v.Len() {
			countTensors(v.Index(i), n, empty, path)
		}
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[safetensors.Tensor]() {
			t := v.Interface().(safetensors.Tensor)
			if t.Valid() {
				*n++
			} else if !strings.HasSuffix(path, ".Bias") && !strings.HasSuffix(path, ".Tid2Eid") && !strings.HasSuffix(path, ".Scale") {
				*empty = append(*empty, path)
			}
			return
		}
		if v.Type() == reflect.TypeFor[Config]() {
			return
		}
		for i := range v.NumField() {
			countTensors(v.Field(i), n, empty, path+"."+v.Type().Field(i).Name)
		}
	}
}

func TestBindGenerated(t *testing.T) {
	for _, format := range []string{GenOfficial, GenNVFP4} {
		t.Run(format, func(t *testing.T) {
			dir := writeTest(t, format)
			w, st, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			c := w.Config
			if len(st.Files()) < 2 {
				t.Errorf("%d shards, want >= 2", len(st.Files()))
			}
			// Every tensor of the checkpoint is bound (NVFP4 scalars become floats).
			scalars := 0
			for _, n := range st.Names() {
				if strings.HasSuffix(n, ".weight_scale_2") || strings.HasSuffix(n, ".input_scale") {
					scalars++
				}
			}
			var bound int
			var empty []string
			countTensors(reflect.ValueOf(w), &bound, &empty, "W")
			if bound != len(st.Names())-scalars || len(empty) > 0 {
				t.Errorf("bound %d tensors, checkpoint has %d (+%d scalars); unbound fields: %v", bound, len(st.Names())-scalars, scalars, empty)
			}
			if len(w.Layers) != c.Layers || len(w.MTP) != 1 {
				t.Fatalf("%d layers, %d MTP", len(w.Layers), len(w.MTP))
			}
			for i, l := range w.Layers {
				if (l.Attn.Compressor != nil) != (l.Ratio != 0) || (l.Attn.Indexer != nil) != (l.Ratio == 4) {
					t.Errorf("layer %d ratio %d: compressor %v indexer %v", i, l.Ratio, l.Attn.Compressor != nil, l.Attn.Indexer != nil)
				}
				if l.FFN.Hash() != (i < c.HashLayers) {
					t.Errorf("layer %d: hash %v", i, l.FFN.Hash())
				}
				if l.Attn.WqA.Format != FormatFP8Block || l.FFN.Gate.Format != FormatBF16 || l.FFN.Shared.W2.Format != FormatFP8Block {
					t.Errorf("layer %d: formats wq_a %v gate %v shared %v", i, l.Attn.WqA.Format, l.FFN.Gate.Format, l.FFN.Shared.W2.Format)
				}
				want := FormatMXFP4
				if format == GenNVFP4 {
					want = FormatNVFP4
				}
				for e, ex := range l.FFN.Experts {
					for _, li := range []Linear{ex.W1, ex.W2, ex.W3} {
						if li.Format != want {
							t.Fatalf("layer %d expert %d %s: %v, want %v", i, e, li.Name, li.Format, want)
						}
						if want == FormatNVFP4 {
							if fr, exp := math.Frexp(float64(li.Scale2)); fr != 0.5 || li.InputScale <= 0 {
								t.Errorf("%s: weight_scale_2 %g (2^%d·%g) not a power of two or input_scale %g", li.Name, li.Scale2, exp, fr, li.InputScale)
							}
						}
					}
					if want == FormatNVFP4 && ex.W1.Scale2 != ex.W3.Scale2 {
						t.Errorf("layer %d expert %d: w1/w3 weight_scale_2 differ", i, e)
					}
				}
			}
			m := w.MTP[0]
			if m.FFN.Hash() || m.Attn.Compressor != nil || m.Ratio != 0 || m.Index != c.Layers {
				t.Errorf("MTP: hash %v compressor %v ratio %d index %d", m.FFN.Hash(), m.Attn.Compressor != nil, m.Ratio, m.Index)
			}
			if f := m.FFN.Experts[0].W1.Format; f != FormatMXFP4 {
				t.Errorf("MTP experts are %v, want mxfp4 in every format", f)
			}
			if w.Head.Format != FormatBF16 || w.Head.Out != c.Vocab || w.Embed.Shape[0] != c.Vocab {
				t.Errorf("head %v %d, embed %v", w.Head.Format, w.Head.Out, w.Embed.Shape)
			}
		})
	}
}

func dequant(t *testing.T, l Linear) []float32 {
	t.Helper()
	out := make([]float32, l.Out*l.In)
	switch l.Format {
	case FormatMXFP4:
		num.DequantMXFP4(l.Weight.Data, l.Scale.Data, l.Out, l.In, out)
	case FormatNVFP4:
		num.DequantNVFP4(l.Weight.Data, l.Scale.Data, l.Scale2, l.Out, l.In, out)
	default:
		t.Fatalf("%s: format %v", l.Name, l.Format)
	}
	return out
}

// TestNVFP4IsLosslessCast: the same seed gives the same expert weights in both
// formats, and every other tensor is byte-identical.
func TestNVFP4IsLosslessCast(t *testing.T) {
	wo, so, err := Load(writeTest(t, GenOfficial))
	if err != nil {
		t.Fatal(err)
	}
	defer so.Close()
	wn, sn, err := Load(writeTest(t, GenNVFP4))
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close()
	for i := range wo.Layers {
		for e := range wo.Layers[i].FFN.Experts {
			a, b := wo.Layers[i].FFN.Experts[e], wn.Layers[i].FFN.Experts[e]
			for k, pair := range [][2]Linear{{a.W1, b.W1}, {a.W2, b.W2}, {a.W3, b.W3}} {
				x, y := dequant(t, pair[0]), dequant(t, pair[1])
				if !slices.Equal(x, y) {
					t.Fatalf("layer %d expert %d w%d: NVFP4 dequant differs from MXFP4", i, e, k+1)
				}
				if !bytes.Equal(pair[0].Weight.Data, pair[1].Weight.Data) {
					t.Fatalf("layer %d expert %d w%d: nibbles differ", i, e, k+1)
				}
			}
		}
	}
	for _, n := range so.Names() {
		if strings.HasPrefix(n, "layers.") && strings.Contains(n, ".ffn.experts.") {
			continue
		}
		x, _ := so.Get(n)
		y, ok := sn.Get(n)
		if !ok || x.DType != y.DType || !bytes.Equal(x.Data, y.Data) {
			t.Errorf("%s differs between the official and NVFP4 checkpoints", n)
		}
	}
}

func TestGenerateDeterministic(t *testing.T) {
	a, b := writeTest(t, GenNVFP4), writeTest(t, GenNVFP4)
	ents, err := os.ReadDir(a)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) < 8 {
		t.Fatalf("only %d files", len(ents))
	}
	for _, e := range ents {
		x, _ := os.ReadFile(filepath.Join(a, e.Name()))
		y, err := os.ReadFile(filepath.Join(b, e.Name()))
		if err != nil || !bytes.Equal(x, y) {
			t.Errorf("%s differs between two runs (%v)", e.Name(), err)
		}
	}
	// A different seed changes the weights.
	c := t.TempDir()
	if err := writeModel(c, testConfig(), GenNVFP4, 8, 0, fakeTokenizer, nil); err != nil {
		t.Fatal(err)
	}
	x, err := os.ReadFile(shardNames(t, a)[0])
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(shardNames(t, c)[0])
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(x, y) {
		t.Error("seed 7 and seed 8 give the same first shard")
	}
}

// TestConfigRoundTrip: the written config.json parses back to the same Config
// and has the key set of the real Flash config (plus the NVFP4 keys).
func TestConfigRoundTrip(t *testing.T) {
	real, err := os.ReadFile("testdata/flash-config.json")
	if err != nil {
		t.Fatal(err)
	}
	var realKeys map[string]any
	if err := json.Unmarshal(real, &realKeys); err != nil {
		t.Fatal(err)
	}
	for _, nv := range []bool{false, true} {
		c := testConfig()
		if nv {
			c.MoEQuantAlgo = "NVFP4"
		}
		data := configJSON(c, nv)
		got, err := ParseConfig(data)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("nvfp4=%v: round trip\n got %+v\nwant %+v", nv, got, c)
		}
		var keys map[string]any
		if err := json.Unmarshal(data, &keys); err != nil {
			t.Fatal(err)
		}
		for k := range realKeys {
			if _, ok := keys[k]; !ok {
				t.Errorf("generated config.json lacks key %q", k)
			}
		}
		extra := len(keys) - len(realKeys)
		if want := map[bool]int{false: 0, true: 8}[nv]; extra != want {
			t.Errorf("nvfp4=%v: %d extra keys, want %d", nv, extra, want)
		}
	}
	if _, err := ParseQuantConfig(quantConfigJSON(testConfig())); err != nil {
		t.Error(err)
	}
}

// --- corrupted checkpoints ---

// entriesCache generates the tensors of each format once per test.
type entriesCache map[string][]genEntry

// writeMutated writes a checkpoint whose tensor list went through mutate
// (which may edit the entries it gets: they are copies).
func (ec entriesCache) writeMutated(t *testing.T, format string, mutate func([]genEntry) []genEntry) string {
	t.Helper()
	base, ok := ec[format]
	if !ok {
		c := testConfig()
		formats, _ := genFormats(format)
		g := &genVisitor{c: c, formats: formats, rng: newRNG(7)}
		walk(c, g)
		if err := g.finishNVFP4(); err != nil {
			t.Fatal(err)
		}
		base = g.entries
		ec[format] = base
	}
	entries := make([]genEntry, len(base))
	for i, e := range base {
		entries[i] = genEntry{e.name, e.dtype, slices.Clone(e.shape), slices.Clone(e.data)}
	}
	if mutate != nil {
		entries = mutate(entries)
	}
	dir := t.TempDir()
	if err := writeFiles(dir, testConfig(), format, entries, 0, fakeTokenizer); err != nil {
		t.Fatal(err)
	}
	return dir
}

func shardNames(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "model-*-of-*.safetensors"))
	if err != nil || len(m) < 2 {
		t.Fatalf("shards %v, %v", m, err)
	}
	return m
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func edit(name string, f func(*genEntry)) func([]genEntry) []genEntry {
	return func(es []genEntry) []genEntry {
		for i := range es {
			if es[i].name == name {
				f(&es[i])
			}
		}
		return es
	}
}

func drop(name string) func([]genEntry) []genEntry {
	return func(es []genEntry) []genEntry {
		return slices.DeleteFunc(es, func(e genEntry) bool { return e.name == name })
	}
}

func rewriteFile(t *testing.T, path string, f func([]byte) []byte) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, f(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// lieAboutOffsets moves one tensor's end offset by 2 bytes in a shard header.
func lieAboutOffsets(t *testing.T, path string) {
	rewriteFile(t, path, func(b []byte) []byte {
		n := binary.LittleEndian.Uint64(b)
		var hdr map[string]json.RawMessage
		if err := json.Unmarshal(b[8:8+n], &hdr); err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			if k == "__metadata__" {
				continue
			}
			var e struct {
				DType   string   `json:"dtype"`
				Shape   []int    `json:"shape"`
				Offsets [2]int64 `json:"data_offsets"`
			}
			json.Unmarshal(v, &e)
			e.Offsets[1] += 2
			hdr[k] = must(json.Marshal(e))
			break
		}
		js := must(json.Marshal(hdr))
		out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
		out = append(out, js...)
		return append(out, b[8+n:]...)
	})
}

func TestCorruptCheckpoints(t *testing.T) {
	ec := entriesCache{}
	shard1 := "model-00001-of-" // the generator writes several shards; corrupt the first
	first := func(t *testing.T, dir string) string { return shardNames(t, dir)[0] }
	cases := []struct {
		name   string
		format string
		mutate func([]genEntry) []genEntry // nil: use the generated files
		after  func(t *testing.T, dir string)
		want   []string // substrings of the error; nil: must load
	}{
		{name: "truncated shard", after: func(t *testing.T, dir string) {
			rewriteFile(t, first(t, dir), func(b []byte) []byte { return b[:len(b)-100] })
		}, want: []string{shard1}},
		{name: "truncated header", after: func(t *testing.T, dir string) {
			rewriteFile(t, first(t, dir), func(b []byte) []byte { return b[:20] })
		}, want: []string{shard1, "truncated"}},
		{name: "header lies about offsets", after: func(t *testing.T, dir string) {
			lieAboutOffsets(t, first(t, dir))
		}, want: []string{shard1}},
		{name: "missing shard", after: func(t *testing.T, dir string) {
			os.Remove(shardNames(t, dir)[1])
		}, want: []string{"model-00002-of-", "is missing"}},
		{name: "missing tensor", mutate: drop("layers.3.attn.indexer.compressor.ape"),
			want: []string{"missing tensor layers.3.attn.indexer.compressor.ape (want F32 [4 128])"}},
		{name: "extra tensor", mutate: func(es []genEntry) []genEntry {
			return append(es, genEntry{"layers.0.attn.compressor.ape", safetensors.F32, []int{4}, make([]byte, 16)})
		}, want: []string{"unexpected tensor layers.0.attn.compressor.ape", "(F32 [4])"}},
		{name: "wrong dtype", mutate: edit("layers.2.attn.attn_sink", func(e *genEntry) {
			e.dtype, e.shape = safetensors.BF16, []int{12}
		}), want: []string{"dtype: tensor layers.2.attn.attn_sink", "is BF16, want F32"}},
		{name: "wrong shape", mutate: edit("layers.4.hc_ffn_base", func(e *genEntry) { e.shape = []int{4, 6} }),
			want: []string{"shape: tensor layers.4.hc_ffn_base", "has shape [4 6], want [24]"}},
		{name: "expert stored as U8 without NVFP4 scales", mutate: edit("layers.1.ffn.experts.3.w2.weight", func(e *genEntry) { e.dtype = safetensors.U8 }),
			want: []string{"missing tensor layers.1.ffn.experts.3.w2.weight_scale ", "missing tensor layers.1.ffn.experts.3.w2.weight_scale_2 ",
				"unexpected tensor layers.1.ffn.experts.3.w2.scale"}},
		{name: "tid2eid out of range", mutate: edit("layers.1.ffn.gate.tid2eid", func(e *genEntry) {
			binary.LittleEndian.PutUint64(e.data[8*21:], 8)
		}), want: []string{"tensor layers.1.ffn.gate.tid2eid", "entry [10, 1] = 8 outside [0, 8)"}},
		{name: "tid2eid negative", mutate: edit("layers.0.ffn.gate.tid2eid", func(e *genEntry) {
			binary.LittleEndian.PutUint64(e.data, math.MaxUint64)
		}), want: []string{"entry [0, 0] = -1 outside"}},
		{name: "nvfp4 NaN weight_scale_2", format: GenNVFP4, mutate: edit("layers.2.ffn.experts.0.w2.weight_scale_2", func(e *genEntry) {
			e.data = f32Bytes([]float32{float32(math.NaN())})
		}), want: []string{"layers.2.ffn.experts.0.w2.weight_scale_2", "finite and positive"}},
		{name: "nvfp4 scalar as [1] is fine", format: GenNVFP4, mutate: edit("layers.2.ffn.experts.0.w2.input_scale", func(e *genEntry) {
			e.shape = []int{1}
		})},
		{name: "nvfp4 scalar as [2]", format: GenNVFP4, mutate: edit("layers.2.ffn.experts.0.w2.input_scale", func(e *genEntry) {
			e.shape, e.data = []int{2}, make([]byte, 8)
		}), want: []string{"has shape [2], want []"}},
		{name: "declared NVFP4 but stored MXFP4", format: GenOfficial, after: func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, QuantConfigFile), quantConfigJSON(testConfig()), 0o644)
		}, want: []string{"format: layers.0.ffn.experts.0.w1 is MXFP4 but hf_quant_config.json declares it NVFP4"}},
		{name: "nvfp4 without quant config entry", format: GenNVFP4, after: func(t *testing.T, dir string) {
			rewriteFile(t, filepath.Join(dir, QuantConfigFile), func(b []byte) []byte {
				return bytes.Replace(b, []byte(`"layers.5.ffn.experts"`), []byte(`"layers.5.ffn.expertsX"`), 1)
			})
		}, want: []string{"format: layers.5.ffn.experts.0.w1 is NVFP4 but hf_quant_config.json does not list it"}},
		{name: "old hf_quant_config revision", format: GenNVFP4, after: func(t *testing.T, dir string) {
			q := map[string]any{}
			c := testConfig()
			for l := range c.Layers {
				for e := range c.Experts {
					for _, p := range []string{"w1", "w2", "w3"} {
						q["layers."+strconv.Itoa(l)+".ffn.experts."+strconv.Itoa(e)+"."+p] = map[string]any{"quant_algo": "NVFP4", "awq_block_size": 16}
					}
				}
			}
			js := must(json.Marshal(map[string]any{"producer": map[string]string{"name": "modelopt"},
				"quantization": map[string]any{"quant_algo": nil, "quantized_layers": q, "exclude_modules": []string{"*.attn.*", "mtp.*"}}}))
			os.WriteFile(filepath.Join(dir, QuantConfigFile), js, 0o644)
		}},
		{name: "bad hf_quant_config", after: func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, QuantConfigFile), []byte(`{"quantization": {"quant_algo": "INT4_AWQ"}}`), 0o644)
		}, want: []string{"quant_algo \"INT4_AWQ\" unsupported"}},
		{name: "compress_ratios wrong length", after: func(t *testing.T, dir string) {
			rewriteFile(t, filepath.Join(dir, "config.json"), func(b []byte) []byte {
				return bytes.Replace(b, []byte(`[0, 4, 128, 4, 128, 4, 0]`), []byte(`[0, 4, 128, 4, 128, 4]`), 1)
			})
		}, want: []string{"compress_ratios has 6 entries, want num_hidden_layers+num_nextn_predict_layers = 7"}},
		{name: "compress_ratios bad value", after: func(t *testing.T, dir string) {
			rewriteFile(t, filepath.Join(dir, "config.json"), func(b []byte) []byte {
				return bytes.Replace(b, []byte(`[0, 4, 128, 4, 128, 4, 0]`), []byte(`[0, 4, 64, 4, 128, 4, 0]`), 1)
			})
		}, want: []string{"compress_ratios[2] = 64, want 0, 4 or 128"}},
		{name: "absurd expert count", after: func(t *testing.T, dir string) {
			rewriteFile(t, filepath.Join(dir, "config.json"), func(b []byte) []byte {
				return bytes.Replace(b, []byte(`"n_routed_experts": 8`), []byte(`"n_routed_experts": 100000000`), 1)
			})
		}, want: []string{"n_routed_experts = 100000000 exceeds"}},
		{name: "config not json", after: func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "config.json"), []byte("{"), 0o644)
		}, want: []string{"config.json"}},
		{name: "config for another model", after: func(t *testing.T, dir string) {
			rewriteFile(t, filepath.Join(dir, "config.json"), func(b []byte) []byte {
				return bytes.Replace(b, []byte(`"hidden_size": 256`), []byte(`"hidden_size": 512`), 1)
			})
		}, want: []string{"shape: tensor embed.weight", "want [300 512]", "more problems of this kind not shown"}},
		{name: "several problems at once", mutate: func(es []genEntry) []genEntry {
			es = drop("mtp.0.enorm.weight")(es)
			es = edit("norm.weight", func(e *genEntry) { e.shape = []int{128, 2} })(es)
			return append(es, genEntry{"bogus", safetensors.U8, []int{1}, []byte{1}})
		}, want: []string{"missing tensor mtp.0.enorm.weight", "shape: tensor norm.weight", "unexpected tensor bogus"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			format := tc.format
			if format == "" {
				format = GenOfficial
			}
			dir := ec.writeMutated(t, format, tc.mutate)
			if tc.after != nil {
				tc.after(t, dir)
			}
			w, st, err := Load(dir)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("want success, got %v", err)
				}
				st.Close()
				if w == nil {
					t.Fatal("nil weights")
				}
				return
			}
			if err == nil {
				st.Close()
				t.Fatalf("loaded; want error with %q", tc.want)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error lacks %q:\n%v", s, err)
				}
			}
		})
	}
}
