package safetensors

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"
)

// FuzzParseHeader feeds arbitrary headers to ParseHeader and, through newFile, to the
// whole-file parser. Neither may panic, and every accepted header must satisfy the
// documented invariants.
func FuzzParseHeader(f *testing.F) {
	f.Add([]byte(`{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`), uint16(16))
	f.Add([]byte(`{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"U8","shape":[0],"data_offsets":[6,6]}}  `), uint16(6))
	f.Add([]byte(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`), uint16(3))
	f.Add([]byte(`{"w":{"dtype":"I64","shape":[9223372036854775807,2],"data_offsets":[0,0]}}`), uint16(0))
	f.Add([]byte(`{"w":{"dtype":"F8_E4M3","shape":[],"data_offsets":[0,1]}}`), uint16(1))
	f.Fuzz(func(t *testing.T, header []byte, dataLen uint16) {
		infos, meta, err := ParseHeader(header, int64(dataLen))
		if err == nil {
			checkInfos(t, infos, int64(dataLen))
			if meta == nil {
				t.Fatal("nil metadata without error")
			}
		}
		file := make([]byte, 8+len(header)+int(dataLen))
		binary.LittleEndian.PutUint64(file, uint64(len(header)))
		copy(file[8:], header)
		fl, ferr := newFile("fuzz.safetensors", file)
		if (ferr == nil) != (err == nil) {
			t.Fatalf("ParseHeader err %v but newFile err %v", err, ferr)
		}
		if ferr != nil {
			if !strings.Contains(ferr.Error(), "fuzz.safetensors") {
				t.Fatalf("error does not name the file: %v", ferr)
			}
			return
		}
		for _, tt := range fl.Tensors() {
			if len(tt.Data) != tt.Numel()*tt.DType.Size() {
				t.Fatalf("tensor %s: %d bytes", tt.Name, len(tt.Data))
			}
			if got, ok := fl.Get(tt.Name); !ok || got.Name != tt.Name {
				t.Fatalf("Get(%q) failed", tt.Name)
			}
		}
	})
}

func checkInfos(t *testing.T, infos []TensorInfo, dataLen int64) {
	t.Helper()
	if !slices.IsSortedFunc(infos, func(a, b TensorInfo) int { return strings.Compare(a.Name, b.Name) }) {
		t.Fatal("not sorted")
	}
	for i, ti := range infos {
		if i > 0 && infos[i-1].Name == ti.Name {
			t.Fatalf("duplicate %q", ti.Name)
		}
		if ti.Name == metaKey || !ti.DType.Valid() || ti.Begin < 0 || ti.End < ti.Begin || ti.End > dataLen {
			t.Fatalf("bad info %+v", ti)
		}
		if n, ok := byteSize(ti.Shape, ti.DType.Size()); !ok || n != ti.End-ti.Begin {
			t.Fatalf("size mismatch %+v", ti)
		}
		for j := range i {
			o := infos[j]
			if o.End > o.Begin && ti.End > ti.Begin && o.Begin < ti.End && ti.Begin < o.End {
				t.Fatalf("overlap %+v %+v", o, ti)
			}
		}
	}
}
