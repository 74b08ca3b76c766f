package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// IndexFile is the Hugging Face shard index name.
const IndexFile = "model.safetensors.index.json"

// Checkpoint is a set of safetensors shards opened together.
type Checkpoint struct {
	dir     string
	files   []*File
	tensors map[string]Tensor
	names   []string
}

type indexJSON struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// OpenDir opens a checkpoint directory. With model.safetensors.index.json it opens
// exactly the shards its weight_map names and checks that every listed tensor is in
// its shard and that the shards hold no unlisted tensors; otherwise it opens every
// *.safetensors file in dir. A tensor present in two shards is an error.
func OpenDir(dir string) (*Checkpoint, error) {
	c := &Checkpoint{dir: dir, tensors: make(map[string]Tensor)}
	if err := c.open(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Checkpoint) open() error {
	idxPath := filepath.Join(c.dir, IndexFile)
	raw, err := os.ReadFile(idxPath)
	switch {
	case err == nil:
		return c.openIndexed(idxPath, raw)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("checkpoint %s: %w", c.dir, err)
	}
	shards, err := filepath.Glob(filepath.Join(c.dir, "*.safetensors"))
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", c.dir, err)
	}
	if len(shards) == 0 {
		return fmt.Errorf("checkpoint %s: no %s and no *.safetensors files", c.dir, IndexFile)
	}
	slices.Sort(shards)
	for _, p := range shards {
		f, err := Open(p)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", c.dir, err)
		}
		c.files = append(c.files, f)
		for _, t := range f.Tensors() {
			if prev, dup := c.tensors[t.Name]; dup {
				return fmt.Errorf("checkpoint %s: tensor %q is in two shards: %s and %s", c.dir, t.Name, prev.File, p)
			}
			c.tensors[t.Name] = t
		}
	}
	c.finish()
	return nil
}

func (c *Checkpoint) openIndexed(idxPath string, raw []byte) error {
	var idx indexJSON
	if err := json.Unmarshal(raw, &idx); err != nil {
		return fmt.Errorf("checkpoint index %s: %w", idxPath, err)
	}
	if idx.WeightMap == nil {
		return fmt.Errorf("checkpoint index %s: no weight_map", idxPath)
	}
	// Group the listed tensors by shard; shard names must be plain file names.
	byShard := make(map[string][]string)
	for name, shard := range idx.WeightMap {
		if shard == "" || filepath.Base(shard) != shard || strings.ContainsRune(shard, os.PathSeparator) {
			return fmt.Errorf("checkpoint index %s: tensor %q maps to bad shard name %q", idxPath, name, shard)
		}
		byShard[shard] = append(byShard[shard], name)
	}
	shards := make([]string, 0, len(byShard))
	for s := range byShard {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	for _, s := range shards {
		names := byShard[s]
		slices.Sort(names)
		p := filepath.Join(c.dir, s)
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("checkpoint index %s: shard %s (holding tensor %q and %d more) is missing: %w", idxPath, p, names[0], len(names)-1, err)
		}
		f, err := Open(p)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", c.dir, err)
		}
		c.files = append(c.files, f)
		for _, name := range names {
			t, ok := f.Get(name)
			if !ok {
				return fmt.Errorf("checkpoint index %s: tensor %q is listed in shard %s but absent from it", idxPath, name, p)
			}
			c.tensors[name] = t
		}
		for _, t := range f.Tensors() {
			if owner := idx.WeightMap[t.Name]; owner != s {
				if owner == "" {
					return fmt.Errorf("checkpoint index %s: tensor %q in shard %s is not listed in the index", idxPath, t.Name, p)
				}
				return fmt.Errorf("checkpoint index %s: tensor %q is in two shards: %s and %s (the index names %s)", idxPath, t.Name, p, filepath.Join(c.dir, owner), owner)
			}
		}
	}
	c.finish()
	return nil
}

func (c *Checkpoint) finish() {
	c.names = make([]string, 0, len(c.tensors))
	for n := range c.tensors {
		c.names = append(c.names, n)
	}
	slices.Sort(c.names)
}

// Dir returns the checkpoint directory.
func (c *Checkpoint) Dir() string { return c.dir }

// Get returns the named tensor.
func (c *Checkpoint) Get(name string) (Tensor, bool) {
	t, ok := c.tensors[name]
	return t, ok
}

// Names returns all tensor names, sorted (shared; do not modify).
func (c *Checkpoint) Names() []string { return c.names }

// Files returns the open shards in name order.
func (c *Checkpoint) Files() []*File { return c.files }

// Close unmaps every shard.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	c.files, c.tensors, c.names = nil, nil, nil
	return errors.Join(errs...)
}
