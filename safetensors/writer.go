package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Writer collects tensors and writes them as safetensors files (for tools and tests).
type Writer struct {
	entries []entry
	names   map[string]bool
}

type entry struct {
	name  string
	dtype DType
	shape []int
	data  []byte
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer { return &Writer{names: make(map[string]bool)} }

// Add queues a tensor; data must hold exactly numel(shape)·dtype.Size() bytes and is
// referenced, not copied, until the file is written.
func (w *Writer) Add(name string, dtype DType, shape []int, data []byte) error {
	if name == "" || name == metaKey {
		return fmt.Errorf("safetensors writer: bad tensor name %q", name)
	}
	if w.names[name] {
		return fmt.Errorf("safetensors writer: tensor %q added twice", name)
	}
	if !dtype.Valid() {
		return fmt.Errorf("safetensors writer: tensor %q: unknown dtype %q", name, dtype)
	}
	want, ok := byteSize(shape, dtype.Size())
	if !ok {
		return fmt.Errorf("safetensors writer: tensor %q: bad shape %v", name, shape)
	}
	if int64(len(data)) != want {
		return fmt.Errorf("safetensors writer: tensor %q: %s %v needs %d bytes, got %d", name, dtype, shape, want, len(data))
	}
	w.names[name] = true
	w.entries = append(w.entries, entry{name, dtype, append([]int{}, shape...), data})
	return nil
}

// Len returns the number of queued tensors.
func (w *Writer) Len() int { return len(w.entries) }

type headerEntry struct {
	DType       DType    `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// WriteFile writes all queued tensors to path, data laid out in Add order.
func (w *Writer) WriteFile(path string, metadata map[string]string) error {
	return writeEntries(path, w.entries, metadata)
}

func writeEntries(path string, entries []entry, metadata map[string]string) error {
	hdr := make(map[string]any, len(entries)+1)
	var off int64
	for _, e := range entries {
		n := int64(len(e.data))
		hdr[e.name] = headerEntry{e.dtype, e.shape, [2]int64{off, off + n}}
		off += n
	}
	if len(metadata) > 0 {
		hdr[metaKey] = metadata
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(hdr); err != nil {
		return fmt.Errorf("safetensors write %s: %w", path, err)
	}
	js := bytes.TrimRight(buf.Bytes(), "\n")
	// Pad with spaces so that the data section starts 8-byte aligned.
	for (8+len(js))%8 != 0 {
		js = append(js, ' ')
	}
	fd, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("safetensors write %s: %w", path, err)
	}
	bw := bufio.NewWriterSize(fd, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(js)))
	bw.Write(lenBuf[:])
	bw.Write(js)
	for _, e := range entries {
		bw.Write(e.data)
	}
	err = bw.Flush() // bufio keeps the first write error
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("safetensors write %s: %w", path, err)
	}
	return nil
}

// WriteSharded writes the queued tensors into dir as model-0000N-of-0000M.safetensors
// shards of at most maxShardBytes tensor data each (a larger tensor gets a shard of
// its own; maxShardBytes <= 0 means one shard), plus model.safetensors.index.json
// ({"metadata": {"total_size": N}, "weight_map": {...}}), which is written even for a
// single shard. metadata goes into every shard's __metadata__.
func WriteSharded(dir string, w *Writer, maxShardBytes int64, metadata map[string]string) error {
	var shards [][]entry
	var cur []entry
	var curBytes, total int64
	for _, e := range w.entries {
		n := int64(len(e.data))
		if len(cur) > 0 && maxShardBytes > 0 && curBytes+n > maxShardBytes {
			shards = append(shards, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, e)
		curBytes += n
		total += n
	}
	if len(cur) > 0 || len(shards) == 0 {
		shards = append(shards, cur)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("safetensors write %s: %w", dir, err)
	}
	weightMap := make(map[string]string, len(w.entries))
	for i, s := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		if err := writeEntries(filepath.Join(dir, name), s, metadata); err != nil {
			return err
		}
		for _, e := range s {
			weightMap[e.name] = name
		}
	}
	idx := struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}{map[string]int64{"total_size": total}, weightMap}
	js, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return fmt.Errorf("safetensors write %s: %w", dir, err)
	}
	p := filepath.Join(dir, IndexFile)
	if err := os.WriteFile(p, append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("safetensors write %s: %w", p, err)
	}
	return nil
}
