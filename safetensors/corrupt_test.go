package safetensors

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rawFile builds a safetensors image from a literal header and data length.
func rawFile(header string, dataLen int) []byte {
	b := make([]byte, 8, 8+len(header)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, dataLen)...)
}

func TestOpenCorrupt(t *testing.T) {
	good := rawFile(`{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`, 16)
	setLen := func(b []byte, n uint64) []byte {
		c := append([]byte(nil), b...)
		binary.LittleEndian.PutUint64(c, n)
		return c
	}
	cases := []struct {
		name string
		file []byte
		want []string // besides the file path
	}{
		{"empty file", nil, []string{"truncated"}},
		{"short length", []byte{1, 0, 0}, []string{"truncated"}},
		{"truncated data", good[:len(good)-1], []string{`"w"`, "past the end"}},
		{"truncated header", good[:20], []string{"truncated", "header length"}},
		{"header length beyond file", setLen(good, uint64(len(good))), []string{"truncated", "header length"}},
		{"header length huge", setLen(good, 1<<63), []string{"exceeds"}},
		{"bad json", rawFile(`{"w":{"dtype":"F32",`, 0), []string{"not valid JSON"}},
		{"bad json in entry", rawFile(`{"w":{"dtype":F32}}`, 0), []string{"not valid JSON"}},
		{"not an object", rawFile(`[1,2]`, 0), []string{"not a JSON object"}},
		{"trailing garbage", rawFile(`{} x`, 0), []string{"trailing"}},
		{"two objects", rawFile(`{}{}`, 0), []string{"trailing"}},
		{"offsets past end", rawFile(`{"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}`, 16), []string{`"w"`, "past the end"}},
		{"overlap", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12), []string{`"a"`, `"b"`, "overlap"}},
		{"contained overlap", rawFile(`{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"c":{"dtype":"U8","shape":[2],"data_offsets":[5,7]}}`, 8), []string{`"a"`, "overlap"}},
		{"size mismatch", rawFile(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}`, 16), []string{`"w"`, "needs 12 bytes"}},
		{"unknown dtype", rawFile(`{"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`, 1), []string{`"w"`, "unknown dtype"}},
		{"negative dim", rawFile(`{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`, 0), []string{`"w"`, "bad dimension"}},
		{"fractional dim", rawFile(`{"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}}`, 0), []string{`"w"`}},
		{"huge shape", rawFile(`{"w":{"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0), []string{`"w"`, "too large"}},
		{"reversed offsets", rawFile(`{"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}}`, 8), []string{`"w"`, "bad data_offsets"}},
		{"negative offset", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}`, 8), []string{`"w"`, "bad data_offsets"}},
		{"three offsets", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, 8), []string{`"w"`, "2 entries"}},
		{"missing field", rawFile(`{"w":{"dtype":"U8","shape":[1]}}`, 8), []string{`"w"`, "data_offsets"}},
		{"entry not object", rawFile(`{"w":3}`, 8), []string{`"w"`, "bad entry"}},
		{"duplicate key", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), []string{`"w"`, "duplicate"}},
		{"bad metadata", rawFile(`{"__metadata__":{"a":1}}`, 0), []string{"__metadata__"}},
	}
	dir := t.TempDir()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_")+".safetensors")
			if err := os.WriteFile(path, c.file, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := Open(path)
			if err == nil {
				f.Close()
			}
			wantErr(t, err, append([]string{path}, c.want...)...)
		})
	}
	if _, err := Open(filepath.Join(dir, "missing.safetensors")); err == nil || !strings.Contains(err.Error(), "missing.safetensors") {
		t.Errorf("missing file: %v", err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "regular") {
		t.Errorf("directory: %v", err)
	}
}

func TestParseHeaderValid(t *testing.T) {
	cases := []struct {
		name    string
		header  string
		dataLen int64
		names   []string
		meta    map[string]string
	}{
		{"empty", `{}`, 0, nil, map[string]string{}},
		{"padded", `{"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}     `, 2, []string{"b"}, map[string]string{}},
		{"sorted", `{"z":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2, []string{"a", "z"}, map[string]string{}},
		{"gap and slack", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}}`, 9, []string{"a"}, map[string]string{}},
		{"empty tensors share offsets", `{"a":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 4, []string{"a", "b"}, map[string]string{}},
		{"scalar", `{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, 4, []string{"s"}, map[string]string{}},
		{"metadata", `{"__metadata__":{"format":"pt"},"s":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, 8, []string{"s"}, map[string]string{"format": "pt"}},
		{"null metadata", `{"__metadata__":null}`, 0, nil, map[string]string{}},
		{"extra fields", `{"s":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}`, 1, []string{"s"}, map[string]string{}},
	}
	for _, c := range cases {
		infos, meta, err := ParseHeader([]byte(c.header), c.dataLen)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var names []string
		for _, ti := range infos {
			names = append(names, ti.Name)
			if ti.End-ti.Begin != int64(ti.Numel()*ti.DType.Size()) {
				t.Errorf("%s: %s size inconsistent", c.name, ti.Name)
			}
		}
		if strings.Join(names, ",") != strings.Join(c.names, ",") || !maps(meta, c.meta) {
			t.Errorf("%s: names %v meta %v, want %v %v", c.name, names, meta, c.names, c.meta)
		}
	}
}
