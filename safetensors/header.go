// Package safetensors reads and writes the safetensors format: a little-endian u64
// header length N, N bytes of JSON
// {"name": {"dtype": .., "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data section that the offsets (relative to its start) point into.
//
// Files are memory-mapped read-only; Tensor.Data is a zero-copy view that stays
// valid until the File (or Checkpoint) is closed and must never be written to.
package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strings"
)

// DType is a safetensors dtype string.
type DType string

// Dtypes. The first group is what DeepSeek-V4 checkpoints use; the rest parse but are
// unusual here.
const (
	BF16    DType = "BF16"
	F16     DType = "F16"
	F32     DType = "F32"
	F8E4M3  DType = "F8_E4M3"
	F8E8M0  DType = "F8_E8M0"
	I8      DType = "I8"
	U8      DType = "U8"
	I32     DType = "I32"
	I64     DType = "I64"
	F64     DType = "F64"
	I16     DType = "I16"
	U16     DType = "U16"
	U32     DType = "U32"
	U64     DType = "U64"
	Bool    DType = "BOOL"
	F8E5M2  DType = "F8_E5M2"
	metaKey       = "__metadata__"
)

// Size returns the element size in bytes, or 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case I8, U8, Bool, F8E4M3, F8E5M2, F8E8M0:
		return 1
	case BF16, F16, I16, U16:
		return 2
	case F32, I32, U32:
		return 4
	case F64, I64, U64:
		return 8
	}
	return 0
}

// Valid reports whether d is a known dtype.
func (d DType) Valid() bool { return d.Size() != 0 }

// TensorInfo describes one tensor of a header. Begin and End are byte offsets
// relative to the start of the data section.
type TensorInfo struct {
	Name       string
	DType      DType
	Shape      []int
	Begin, End int64
}

// Numel returns the product of the shape (1 for a scalar).
func (t TensorInfo) Numel() int { return numel(t.Shape) }

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// byteSize returns numel(shape)·size, or false if a dimension is negative or the
// result overflows int64.
func byteSize(shape []int, size int) (int64, bool) {
	n := uint64(size)
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		n = lo
	}
	return int64(n), true
}

type rawInfo struct {
	DType       *string  `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

// ParseHeader parses and validates the JSON header of a safetensors file whose data
// section is dataLen bytes long. It checks: valid JSON object, no duplicate keys,
// known dtypes, non-negative shapes, 0 <= begin <= end <= dataLen,
// end-begin == numel·size, and no two non-empty tensors overlapping. Trailing
// spaces (alignment padding) are allowed. Tensors are returned sorted by name.
// Errors name the offending tensor; the caller adds the file name.
func ParseHeader(buf []byte, dataLen int64) ([]TensorInfo, map[string]string, error) {
	buf = bytes.TrimRight(buf, " ")
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, fmt.Errorf("header is not valid JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, errors.New("header is not a JSON object")
	}
	var infos []TensorInfo
	var meta map[string]string
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("header is not valid JSON: %w", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, nil, errors.New("header is not valid JSON: non-string key")
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("tensor %q: duplicate key in header", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, fmt.Errorf("tensor %q: header is not valid JSON: %w", name, err)
		}
		if name == metaKey {
			if string(raw) == "null" {
				continue
			}
			if err := json.Unmarshal(raw, &meta); err != nil {
				return nil, nil, fmt.Errorf("__metadata__ must map strings to strings: %w", err)
			}
			continue
		}
		ti, err := parseInfo(name, raw, dataLen)
		if err != nil {
			return nil, nil, err
		}
		infos = append(infos, ti)
	}
	if _, err := dec.Token(); err != nil { // closing brace
		return nil, nil, fmt.Errorf("header is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, errors.New("header has trailing data after the JSON object")
	}
	if err := checkOverlaps(infos); err != nil {
		return nil, nil, err
	}
	slices.SortFunc(infos, func(a, b TensorInfo) int { return strings.Compare(a.Name, b.Name) })
	if meta == nil {
		meta = map[string]string{}
	}
	return infos, meta, nil
}

func parseInfo(name string, raw json.RawMessage, dataLen int64) (TensorInfo, error) {
	var ri rawInfo
	d := json.NewDecoder(bytes.NewReader(raw))
	if err := d.Decode(&ri); err != nil {
		return TensorInfo{}, fmt.Errorf("tensor %q: bad entry: %w", name, err)
	}
	if ri.DType == nil || ri.Shape == nil || ri.DataOffsets == nil {
		return TensorInfo{}, fmt.Errorf("tensor %q: entry needs dtype, shape and data_offsets", name)
	}
	dt := DType(*ri.DType)
	if !dt.Valid() {
		return TensorInfo{}, fmt.Errorf("tensor %q: unknown dtype %q", name, *ri.DType)
	}
	shape := make([]int, len(*ri.Shape))
	for i, v := range *ri.Shape {
		if v < 0 || int64(int(v)) != v {
			return TensorInfo{}, fmt.Errorf("tensor %q: bad dimension %d in shape %v", name, v, *ri.Shape)
		}
		shape[i] = int(v)
	}
	if len(*ri.DataOffsets) != 2 {
		return TensorInfo{}, fmt.Errorf("tensor %q: data_offsets must have 2 entries, has %d", name, len(*ri.DataOffsets))
	}
	b, e := (*ri.DataOffsets)[0], (*ri.DataOffsets)[1]
	if b < 0 || e < b {
		return TensorInfo{}, fmt.Errorf("tensor %q: bad data_offsets [%d, %d]", name, b, e)
	}
	if e > dataLen {
		return TensorInfo{}, fmt.Errorf("tensor %q: data_offsets [%d, %d] past the end of the %d-byte data section", name, b, e, dataLen)
	}
	want, ok := byteSize(shape, dt.Size())
	if !ok {
		return TensorInfo{}, fmt.Errorf("tensor %q: shape %v is too large", name, shape)
	}
	if e-b != want {
		return TensorInfo{}, fmt.Errorf("tensor %q: %s %v needs %d bytes but data_offsets [%d, %d] span %d", name, dt, shape, want, b, e, e-b)
	}
	return TensorInfo{Name: name, DType: dt, Shape: shape, Begin: b, End: e}, nil
}

func checkOverlaps(infos []TensorInfo) error {
	idx := make([]int, 0, len(infos))
	for i, t := range infos {
		if t.End > t.Begin {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int {
		if c := infos[a].Begin - infos[b].Begin; c != 0 {
			if c < 0 {
				return -1
			}
			return 1
		}
		return strings.Compare(infos[a].Name, infos[b].Name)
	})
	for k := 1; k < len(idx); k++ {
		p, q := infos[idx[k-1]], infos[idx[k]]
		if q.Begin < p.End {
			return fmt.Errorf("tensors %q [%d, %d] and %q [%d, %d] overlap", p.Name, p.Begin, p.End, q.Name, q.Begin, q.End)
		}
	}
	return nil
}
