package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var allDTypes = []DType{BF16, F16, F32, F8E4M3, F8E8M0, I8, U8, I32, I64, F64, I16, U16, U32, U64, Bool, F8E5M2}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func TestDTypeSize(t *testing.T) {
	want := map[DType]int{BF16: 2, F16: 2, F32: 4, F8E4M3: 1, F8E8M0: 1, I8: 1, U8: 1, I32: 4, I64: 8,
		F64: 8, I16: 2, U16: 2, U32: 4, U64: 8, Bool: 1, F8E5M2: 1, "F4": 0, "": 0, "bf16": 0}
	for d, n := range want {
		if d.Size() != n || d.Valid() != (n != 0) {
			t.Errorf("%q.Size() = %d, want %d", d, d.Size(), n)
		}
	}
}

// TestRoundTripEveryDType writes one file holding every dtype in several shapes
// (including a scalar and empty tensors) and reads it back byte for byte.
func TestRoundTripEveryDType(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := [][]int{{}, {7}, {3, 5}, {2, 0, 4}, {2, 3, 4}}
	w := NewWriter()
	type want struct {
		dt    DType
		shape []int
		data  []byte
	}
	wants := map[string]want{}
	for _, dt := range allDTypes {
		for si, sh := range shapes {
			name := strings.ToLower(string(dt)) + ".t" + string(rune('a'+si))
			data := randBytes(rng, numel(sh)*dt.Size())
			if err := w.Add(name, dt, sh, data); err != nil {
				t.Fatal(err)
			}
			wants[name] = want{dt, sh, data}
		}
	}
	path := filepath.Join(t.TempDir(), "all.safetensors")
	meta := map[string]string{"format": "pt", "note": "<&> \"quoted\""}
	if err := w.WriteFile(path, meta); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	if (8+n)%8 != 0 {
		t.Errorf("data section starts at %d, not 8-byte aligned", 8+n)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Tensors()) != len(wants) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors()), len(wants))
	}
	if !slices.IsSortedFunc(f.Tensors(), func(a, b Tensor) int { return strings.Compare(a.Name, b.Name) }) {
		t.Errorf("tensors not sorted by name")
	}
	for name, wt := range wants {
		got, ok := f.Get(name)
		if !ok {
			t.Fatalf("tensor %s missing", name)
		}
		if got.DType != wt.dt || !slices.Equal(got.Shape, wt.shape) || !bytes.Equal(got.Data, wt.data) || got.File != path {
			t.Fatalf("tensor %s: got %s %v (%d bytes, file %s), want %s %v (%d bytes)", name, got.DType, got.Shape, len(got.Data), got.File, wt.dt, wt.shape, len(wt.data))
		}
		if got.Numel() != numel(wt.shape) {
			t.Fatalf("tensor %s: Numel %d", name, got.Numel())
		}
		if cap(got.Data) != len(got.Data) {
			t.Fatalf("tensor %s: view capacity %d exceeds its length %d", name, cap(got.Data), len(got.Data))
		}
	}
	if _, ok := f.Get("nope"); ok {
		t.Errorf("Get of a missing tensor succeeded")
	}
	if !maps(f.Metadata(), meta) {
		t.Errorf("metadata %v, want %v", f.Metadata(), meta)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestDecodeHelpers(t *testing.T) {
	w := NewWriter()
	f32 := make([]byte, 8)
	binary.LittleEndian.PutUint32(f32, math.Float32bits(1.5))
	binary.LittleEndian.PutUint32(f32[4:], math.Float32bits(-2))
	i64 := make([]byte, 16)
	binary.LittleEndian.PutUint64(i64, uint64(1<<40))
	binary.LittleEndian.PutUint64(i64[8:], uint64(math.MaxUint64)) // -1
	i32 := []byte{0xff, 0xff, 0xff, 0xff, 7, 0, 0, 0}
	for _, a := range []struct {
		n  string
		dt DType
		sh []int
		d  []byte
	}{
		{"bf", BF16, []int{2}, []byte{0x80, 0x3f, 0x40, 0xc0}},
		{"h", F16, []int{2}, []byte{0x00, 0x3c, 0x00, 0xc0}},
		{"f", F32, []int{2}, f32},
		{"i64", I64, []int{2}, i64},
		{"i32", I32, []int{2}, i32},
	} {
		if err := w.Add(a.n, a.dt, a.sh, a.d); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "d.safetensors")
	if err := w.WriteFile(path, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, want := range map[string][]float32{"bf": {1, -3}, "h": {1, -2}, "f": {1.5, -2}} {
		tt, _ := f.Get(name)
		got, err := tt.Float32s()
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s.Float32s() = %v, %v; want %v", name, got, err, want)
		}
	}
	for name, want := range map[string][]int64{"i64": {1 << 40, -1}, "i32": {-1, 7}} {
		tt, _ := f.Get(name)
		got, err := tt.Int64s()
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s.Int64s() = %v, %v; want %v", name, got, err, want)
		}
	}
	tt, _ := f.Get("i64")
	if _, err := tt.Float32s(); err == nil || !strings.Contains(err.Error(), "i64") || !strings.Contains(err.Error(), path) {
		t.Errorf("Float32s of I64: %v", err)
	}
	tt, _ = f.Get("f")
	if _, err := tt.Int64s(); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Int64s of F32: %v", err)
	}
	if (Tensor{}).Numel() != 0 || (Tensor{}).Valid() {
		t.Errorf("zero Tensor is not empty")
	}
}

func TestWriterErrors(t *testing.T) {
	w := NewWriter()
	if err := w.Add("a", F32, []int{2}, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		dt    DType
		shape []int
		n     int
		want  string
	}{
		{"a", F32, []int{2}, 8, "twice"},
		{"b", F32, []int{2}, 7, "needs 8 bytes"},
		{"c", "F4", []int{2}, 1, "unknown dtype"},
		{"d", F32, []int{-1}, 0, "bad shape"},
		{"", F32, []int{1}, 4, "bad tensor name"},
		{"__metadata__", F32, []int{1}, 4, "bad tensor name"},
		{"e", U8, []int{1 << 62, 1 << 62}, 0, "bad shape"},
	}
	for _, c := range cases {
		err := w.Add(c.name, c.dt, c.shape, make([]byte, c.n))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("Add(%q, %s, %v, %d bytes) = %v, want error containing %q and the name", c.name, c.dt, c.shape, c.n, err, c.want)
		}
	}
	if w.Len() != 1 {
		t.Errorf("failed adds were queued: %d", w.Len())
	}
	if err := w.WriteFile(filepath.Join(t.TempDir(), "no", "such", "dir.safetensors"), nil); err == nil {
		t.Errorf("write into a missing directory succeeded")
	}
}

func TestWriteShardedAndOpenDir(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		maxBytes   int64
		wantShards int
	}{{0, 1}, {1 << 20, 1}, {100, 4}, {1, 6}} {
		w := NewWriter()
		datas := map[string][]byte{}
		for i := range 6 {
			name := "layers." + string(rune('0'+i)) + ".w"
			d := randBytes(rng, 2*(10+i*5))
			datas[name] = d
			if err := w.Add(name, BF16, []int{len(d) / 2}, d); err != nil {
				t.Fatal(err)
			}
		}
		dir := filepath.Join(t.TempDir(), "ckpt")
		if err := WriteSharded(dir, w, tc.maxBytes, map[string]string{"format": "pt"}); err != nil {
			t.Fatal(err)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "model-*.safetensors"))
		if len(files) != tc.wantShards {
			t.Fatalf("max %d: %d shards, want %d", tc.maxBytes, len(files), tc.wantShards)
		}
		last := filepath.Base(files[len(files)-1])
		if want := "model-" + pad5(tc.wantShards) + "-of-" + pad5(tc.wantShards) + ".safetensors"; last != want {
			t.Errorf("last shard %s, want %s", last, want)
		}
		var idx struct {
			Metadata  map[string]json.Number `json:"metadata"`
			WeightMap map[string]string      `json:"weight_map"`
		}
		raw, err := os.ReadFile(filepath.Join(dir, IndexFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &idx); err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, d := range datas {
			total += int64(len(d))
		}
		if got, _ := idx.Metadata["total_size"].Int64(); got != total || len(idx.WeightMap) != len(datas) {
			t.Errorf("index total_size %v (want %d), %d entries", idx.Metadata["total_size"], total, len(idx.WeightMap))
		}
		c, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Names()) != len(datas) || !slices.IsSorted(c.Names()) || len(c.Files()) != tc.wantShards {
			t.Fatalf("names %v, %d files", c.Names(), len(c.Files()))
		}
		for name, d := range datas {
			tt, ok := c.Get(name)
			if !ok || !bytes.Equal(tt.Data, d) || filepath.Base(tt.File) != idx.WeightMap[name] {
				t.Fatalf("tensor %s: ok=%v file %s (index %s)", name, ok, tt.File, idx.WeightMap[name])
			}
			f, _ := c.Get(name)
			if f.Numel() != len(d)/2 {
				t.Fatalf("numel")
			}
		}
		if c.Files()[0].Metadata()["format"] != "pt" {
			t.Errorf("shard metadata lost")
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func pad5(n int) string {
	s := "0000" + string(rune('0'+n))
	return s[len(s)-5:]
}

func TestOpenDirWithoutIndex(t *testing.T) {
	dir := t.TempDir()
	for i, name := range []string{"a", "b"} {
		w := NewWriter()
		if err := w.Add(name, U8, []int{1}, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if err := w.WriteFile(filepath.Join(dir, name+".safetensors"), nil); err != nil {
			t.Fatal(err)
		}
	}
	c, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Names(), []string{"a", "b"}) {
		t.Errorf("names %v", c.Names())
	}
	c.Close()
	// A third file repeating tensor "a" is an error naming both files.
	w := NewWriter()
	w.Add("a", U8, []int{1}, []byte{9})
	dup := filepath.Join(dir, "c.safetensors")
	if err := w.WriteFile(dup, nil); err != nil {
		t.Fatal(err)
	}
	_, err = OpenDir(dir)
	wantErr(t, err, `"a"`, "two shards", dup, filepath.Join(dir, "a.safetensors"))
	_, err = OpenDir(t.TempDir())
	wantErr(t, err, "no "+IndexFile)
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not contain %q", err, p)
		}
	}
}

// shardedDir writes tensors x (shard 1) and y (shard 2) with an index and returns
// the directory and the parsed index for tampering.
func shardedDir(t *testing.T) (string, map[string]any) {
	t.Helper()
	w := NewWriter()
	w.Add("x", F32, []int{4}, make([]byte, 16))
	w.Add("y", F32, []int{4}, make([]byte, 16))
	dir := t.TempDir()
	if err := WriteSharded(dir, w, 16, nil); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	var idx map[string]any
	if err := json.Unmarshal(raw, &idx); err != nil {
		t.Fatal(err)
	}
	return dir, idx
}

func writeIndex(t *testing.T, dir string, idx any) {
	t.Helper()
	raw, _ := json.Marshal(idx)
	if err := os.WriteFile(filepath.Join(dir, IndexFile), raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenDirIndexErrors(t *testing.T) {
	s1, s2 := "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	cases := []struct {
		name   string
		tamper func(dir string, idx map[string]any) any
		want   []string
	}{
		{"missing shard", func(dir string, idx map[string]any) any {
			os.Remove(filepath.Join(dir, s2))
			return idx
		}, []string{s2, `"y"`, "missing"}},
		{"wrong shard", func(dir string, idx map[string]any) any {
			idx["weight_map"].(map[string]any)["y"] = s1
			return idx
		}, []string{`"y"`, s1, "absent"}},
		{"unlisted tensor", func(dir string, idx map[string]any) any {
			w := NewWriter()
			w.Add("x", F32, []int{4}, make([]byte, 16))
			w.Add("z", F32, []int{1}, make([]byte, 4))
			w.WriteFile(filepath.Join(dir, s1), nil)
			return idx
		}, []string{`"z"`, s1, "not listed"}},
		{"tensor in two shards", func(dir string, idx map[string]any) any {
			w := NewWriter()
			w.Add("x", F32, []int{4}, make([]byte, 16))
			w.Add("y", F32, []int{4}, make([]byte, 16))
			w.WriteFile(filepath.Join(dir, s2), nil)
			return idx
		}, []string{`"x"`, s1, s2, "two shards"}},
		{"bad json", func(dir string, idx map[string]any) any { return json.RawMessage(`{"weight_map": [}`) }, []string{IndexFile}},
		{"no weight_map", func(dir string, idx map[string]any) any { return map[string]any{"metadata": map[string]any{}} }, []string{IndexFile, "no weight_map"}},
		{"path in shard name", func(dir string, idx map[string]any) any {
			idx["weight_map"].(map[string]any)["y"] = "../" + s2
			return idx
		}, []string{`"y"`, "bad shard name"}},
		{"corrupt shard", func(dir string, idx map[string]any) any {
			os.WriteFile(filepath.Join(dir, s2), []byte{1, 2, 3}, 0o644)
			return idx
		}, []string{s2, "truncated"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, idx := shardedDir(t)
			if c.name == "bad json" {
				os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"weight_map": [}`), 0o644)
			} else {
				writeIndex(t, dir, c.tamper(dir, idx))
			}
			cp, err := OpenDir(dir)
			if err == nil {
				cp.Close()
			}
			wantErr(t, err, c.want...)
		})
	}
}
