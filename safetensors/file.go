package safetensors

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"

	"github.com/megamoe/megamoe/num"
)

// MaxHeaderLen caps the JSON header length (the Pro checkpoint's largest shard header
// is a few MB).
const MaxHeaderLen = 100 << 20

// Tensor is one tensor of a file. Data is a read-only view of the mapped file.
type Tensor struct {
	Name, File string
	DType      DType
	Shape      []int
	Data       []byte
}

// Numel returns the number of elements (1 for a scalar, 0 for the zero Tensor).
func (t Tensor) Numel() int {
	if t.DType == "" {
		return 0
	}
	return numel(t.Shape)
}

// Valid reports whether t is a real tensor (not the zero value).
func (t Tensor) Valid() bool { return t.DType != "" }

func (t Tensor) String() string {
	return fmt.Sprintf("%s (%s %v in %s)", t.Name, t.DType, t.Shape, t.File)
}

// Float32s decodes a BF16, F16 or F32 tensor into a new float32 slice.
func (t Tensor) Float32s() ([]float32, error) {
	n := t.Numel()
	if len(t.Data) != n*t.DType.Size() {
		return nil, fmt.Errorf("tensor %s in %s: %d data bytes for %s %v", t.Name, t.File, len(t.Data), t.DType, t.Shape)
	}
	out := make([]float32, n)
	switch t.DType {
	case BF16:
		num.DecodeBF16(t.Data, out)
	case F16:
		num.DecodeF16(t.Data, out)
	case F32:
		num.DecodeF32(t.Data, out)
	default:
		return nil, fmt.Errorf("tensor %s in %s: dtype %s is not a float16/bfloat16/float32 type", t.Name, t.File, t.DType)
	}
	return out, nil
}

// Int64s decodes an I64 or I32 tensor into a new int64 slice.
func (t Tensor) Int64s() ([]int64, error) {
	n := t.Numel()
	if len(t.Data) != n*t.DType.Size() {
		return nil, fmt.Errorf("tensor %s in %s: %d data bytes for %s %v", t.Name, t.File, len(t.Data), t.DType, t.Shape)
	}
	out := make([]int64, n)
	switch t.DType {
	case I64:
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
		}
	case I32:
		for i := range out {
			out[i] = int64(int32(binary.LittleEndian.Uint32(t.Data[4*i:])))
		}
	default:
		return nil, fmt.Errorf("tensor %s in %s: dtype %s is not an integer type I32/I64", t.Name, t.File, t.DType)
	}
	return out, nil
}

// File is one memory-mapped safetensors file.
type File struct {
	path    string
	mm      []byte
	tensors []Tensor
	index   map[string]int
	meta    map[string]string
}

// Open maps path read-only and validates its header.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("safetensors %s: not a regular file", path)
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("safetensors %s: truncated: %d bytes, shorter than the 8-byte header length", path, size)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("safetensors %s: file too large to map (%d bytes)", path, size)
	}
	mm, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: mmap: %w", path, err)
	}
	f, err := newFile(path, mm)
	if err != nil {
		syscall.Munmap(mm)
		return nil, err
	}
	return f, nil
}

func newFile(path string, mm []byte) (*File, error) {
	n := binary.LittleEndian.Uint64(mm)
	if n > MaxHeaderLen {
		return nil, fmt.Errorf("safetensors %s: header length %d exceeds the %d-byte limit", path, n, MaxHeaderLen)
	}
	if n > uint64(len(mm)-8) {
		return nil, fmt.Errorf("safetensors %s: truncated: header length %d but only %d bytes follow", path, n, len(mm)-8)
	}
	data := mm[8+n:]
	infos, meta, err := ParseHeader(mm[8:8+n], int64(len(data)))
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	f := &File{path: path, mm: mm, meta: meta, index: make(map[string]int, len(infos))}
	f.tensors = make([]Tensor, len(infos))
	for i, ti := range infos {
		f.tensors[i] = Tensor{Name: ti.Name, File: path, DType: ti.DType, Shape: ti.Shape, Data: data[ti.Begin:ti.End:ti.End]}
		f.index[ti.Name] = i
	}
	return f, nil
}

// Path returns the file's path as given to Open.
func (f *File) Path() string { return f.path }

// Tensors returns all tensors sorted by name (the slice is shared; do not modify).
func (f *File) Tensors() []Tensor { return f.tensors }

// Get returns the named tensor.
func (f *File) Get(name string) (Tensor, bool) {
	i, ok := f.index[name]
	if !ok {
		return Tensor{}, false
	}
	return f.tensors[i], true
}

// Metadata returns the __metadata__ map (empty if absent; shared, do not modify).
func (f *File) Metadata() map[string]string { return f.meta }

// Close unmaps the file; tensors obtained from it become invalid. Closing twice is a
// no-op.
func (f *File) Close() error {
	if f.mm == nil {
		return nil
	}
	err := syscall.Munmap(f.mm)
	f.mm, f.tensors, f.index = nil, nil, nil
	if err != nil {
		return fmt.Errorf("safetensors %s: munmap: %w", f.path, err)
	}
	return nil
}
