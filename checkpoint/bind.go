package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/megamoe/megamoe/safetensors"
)

// QuantConfigFile is ModelOpt's quantisation metadata file (spec §9).
const QuantConfigFile = "hf_quant_config.json"

// QuantConfig is hf_quant_config.json. Both published revisions parse: the
// current one (quant_algo MIXED_PRECISION, one "layers.X.ffn.experts" key per
// main layer) and the older one (quant_algo null, one key per projection
// "layers.X.ffn.experts.Y.wN" with awq_block_size).
type QuantConfig struct {
	Producer struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"producer"`
	Quantization struct {
		QuantAlgo        *string               `json:"quant_algo"`
		KVCacheQuantAlgo *string               `json:"kv_cache_quant_algo"`
		GroupSize        int                   `json:"group_size"`
		QuantizedLayers  map[string]QuantLayer `json:"quantized_layers"`
		ExcludeModules   []string              `json:"exclude_modules"`
	} `json:"quantization"`
}

// QuantLayer is one entry of quantized_layers.
type QuantLayer struct {
	QuantAlgo    string `json:"quant_algo"`
	GroupSize    int    `json:"group_size"`
	AWQBlockSize int    `json:"awq_block_size"`
}

// ParseQuantConfig decodes and validates hf_quant_config.json.
func ParseQuantConfig(data []byte) (*QuantConfig, error) {
	q := &QuantConfig{}
	if err := json.Unmarshal(data, q); err != nil {
		return nil, fmt.Errorf("%s: %w", QuantConfigFile, err)
	}
	var errs []error
	if a := q.Quantization.QuantAlgo; a != nil && *a != "MIXED_PRECISION" && *a != "NVFP4" {
		errs = append(errs, fmt.Errorf("%s: quantization.quant_algo %q unsupported (want MIXED_PRECISION, NVFP4 or null)", QuantConfigFile, *a))
	}
	for _, k := range slices.Sorted(maps.Keys(q.Quantization.QuantizedLayers)) {
		l := q.Quantization.QuantizedLayers[k]
		if l.QuantAlgo != "NVFP4" {
			errs = append(errs, fmt.Errorf("%s: quantized_layers[%q].quant_algo %q unsupported (want NVFP4)", QuantConfigFile, k, l.QuantAlgo))
		}
		if g := max(l.GroupSize, l.AWQBlockSize); g != 0 && g != 16 {
			errs = append(errs, fmt.Errorf("%s: quantized_layers[%q] group size %d unsupported (want 16)", QuantConfigFile, k, g))
		}
		if !strings.Contains(k, ".ffn.experts") {
			errs = append(errs, fmt.Errorf("%s: quantized_layers[%q]: only routed experts may be NVFP4", QuantConfigFile, k))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return q, nil
}

// LoadQuantConfig reads dir/hf_quant_config.json; it returns nil, nil if the
// file does not exist.
func LoadQuantConfig(dir string) (*QuantConfig, error) {
	path := filepath.Join(dir, QuantConfigFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load quant config: %w", err)
	}
	q, err := ParseQuantConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return q, nil
}

// NVFP4 reports whether the quant config declares linear (a name prefix such
// as "layers.3.ffn.experts.7.w1") as NVFP4, by a per-layer or a
// per-projection key.
func (q *QuantConfig) NVFP4(linear string) bool {
	if q == nil {
		return false
	}
	for k, l := range q.Quantization.QuantizedLayers {
		if l.QuantAlgo == "NVFP4" && (linear == k || strings.HasPrefix(linear, k+".")) {
			return true
		}
	}
	return false
}

// Load reads config.json, the optional hf_quant_config.json and the
// safetensors shards of dir and binds every tensor. The returned Checkpoint
// owns the memory maps the Weights point into: close it when done.
func Load(dir string) (*Weights, *safetensors.Checkpoint, error) {
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	q, err := LoadQuantConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	st, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("load %s: %w", dir, err)
	}
	w, err := Bind(c, q, st)
	if err != nil {
		st.Close()
		return nil, nil, fmt.Errorf("load %s: %w", dir, err)
	}
	return w, st, nil
}

// maxReported caps each category of problems so that a checkpoint of the wrong
// model does not produce a megabyte error.
const maxReported = 100

type problems struct {
	errs  []error
	count map[string]int
}

// add records err under kind ("missing", "dtype", ...); beyond maxReported of a
// kind only the count is kept.
func (p *problems) add(kind string, err error) {
	if p.count == nil {
		p.count = map[string]int{}
	}
	p.count[kind]++
	if p.count[kind] <= maxReported {
		p.errs = append(p.errs, err)
	}
}

func (p *problems) err() error {
	errs := p.errs
	kinds := make([]string, 0, len(p.count))
	for k := range p.count {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		if n := p.count[k]; n > maxReported {
			errs = append(errs, fmt.Errorf("%s: %d more problems of this kind not shown (%d in all)", k, n-maxReported, n))
		}
	}
	return errors.Join(errs...)
}

// detectFormat picks the format of linear l from the dtype of its weight
// tensor (spec §9: detect per tensor, never from global metadata). A missing
// weight gets the format the quant config (or the official release) implies,
// so that the error names the tensors one would expect.
func detectFormat(l LinearSpec, st *safetensors.Checkpoint, q *QuantConfig) Format {
	t, ok := st.Get(l.Name + ".weight")
	if !ok {
		if l.Kind == KindExpert && q.NVFP4(l.Name) {
			return FormatNVFP4
		}
		return l.Kind.official()
	}
	var f Format
	switch t.DType {
	case safetensors.BF16:
		f = FormatBF16
	case safetensors.F32:
		f = FormatF32
	case safetensors.F8E4M3:
		f = FormatFP8Block
	case safetensors.I8:
		f = FormatMXFP4
	case safetensors.U8:
		f = FormatNVFP4
	default:
		return l.Kind.official()
	}
	if !l.Kind.allowed(f) {
		return l.Kind.official() // reported as a dtype mismatch
	}
	return f
}

// Bind checks the tensors of st against the name table of c (formats detected
// per linear) and binds them to typed structs. Every missing, unexpected,
// wrongly typed or wrongly shaped tensor and every bad value (tid2eid out of
// range, non-finite NVFP4 scalars) is reported in one joined error. q may be
// nil; when present, a routed expert it declares NVFP4 must be stored as
// NVFP4 and vice versa.
func Bind(c *Config, q *QuantConfig, st *safetensors.Checkpoint) (*Weights, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var p problems
	formats := map[string]Format{}
	for _, l := range Linears(c) {
		f := detectFormat(l, st, q)
		formats[l.Name] = f
		if l.Kind != KindExpert || q == nil {
			continue
		}
		switch decl := q.NVFP4(l.Name); {
		case decl && f == FormatMXFP4:
			p.add("format", fmt.Errorf("format: %s is MXFP4 but %s declares it NVFP4", l.Name, QuantConfigFile))
		case !decl && f == FormatNVFP4:
			p.add("format", fmt.Errorf("format: %s is NVFP4 but %s does not list it in quantized_layers", l.Name, QuantConfigFile))
		}
	}
	specs := Tensors(c, func(l LinearSpec) Format { return formats[l.Name] })
	want := make(map[string]bool, len(specs))
	for _, s := range specs {
		want[s.Name] = true
		t, ok := st.Get(s.Name)
		if !ok {
			p.add("missing", fmt.Errorf("missing tensor %s (want %s)", s.Name, s))
			continue
		}
		if t.DType != s.DType {
			p.add("dtype", fmt.Errorf("dtype: tensor %s in %s is %s, want %s", s.Name, t.File, t.DType, s.DType))
			continue
		}
		if !shapeOK(t.Shape, s.Shape) {
			p.add("shape", fmt.Errorf("shape: tensor %s in %s has shape %v, want %v", s.Name, t.File, t.Shape, s.Shape))
			continue
		}
		if err := checkValues(c, t); err != nil {
			p.add("value", fmt.Errorf("value: tensor %s in %s: %w", s.Name, t.File, err))
		}
	}
	for _, n := range st.Names() {
		if !want[n] {
			t, _ := st.Get(n)
			p.add("unexpected", fmt.Errorf("unexpected tensor %s in %s (%s %v)", n, t.File, t.DType, t.Shape))
		}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return walk(c, &bindVisitor{st: st, formats: formats}), nil
}

func shapeOK(got, want []int) bool {
	if len(want) == 0 { // scalar: [] or [1]
		return len(got) == 0 || (len(got) == 1 && got[0] == 1)
	}
	return slices.Equal(got, want)
}

// checkValues validates the contents of the few tensors whose values the
// engine trusts as indices or divisors. dtype and shape are already checked.
func checkValues(c *Config, t safetensors.Tensor) error {
	switch {
	case strings.HasSuffix(t.Name, ".tid2eid"):
		ids, err := t.Int64s()
		if err != nil {
			return err
		}
		for i, id := range ids {
			if id < 0 || id >= int64(c.Experts) {
				return fmt.Errorf("entry [%d, %d] = %d outside [0, %d)", i/c.TopK, i%c.TopK, id, c.Experts)
			}
		}
	case strings.HasSuffix(t.Name, ".weight_scale_2"), strings.HasSuffix(t.Name, ".input_scale"):
		v := scalarF32(t)
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || v < 0 || (v == 0 && strings.HasSuffix(t.Name, "_2")) {
			return fmt.Errorf("scalar %g must be finite and positive", v)
		}
	}
	return nil
}

func scalarF32(t safetensors.Tensor) float32 {
	if len(t.Data) < 4 {
		return float32(math.NaN())
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(t.Data))
}

// bindVisitor hands out the (already validated) tensors of a checkpoint, or
// of GenWeights' in-memory set.
type bindVisitor struct {
	st interface {
		Get(name string) (safetensors.Tensor, bool)
	}
	formats map[string]Format
}

func (b *bindVisitor) tensor(name string, _ safetensors.DType, _ ...int) safetensors.Tensor {
	t, _ := b.st.Get(name)
	return t
}

func (b *bindVisitor) linear(l LinearSpec) Linear {
	f := b.formats[l.Name]
	out := Linear{Name: l.Name, Format: f, Out: l.Out, In: l.In}
	out.Weight, _ = b.st.Get(l.Name + ".weight")
	switch f {
	case FormatFP8Block, FormatMXFP4:
		out.Scale, _ = b.st.Get(l.Name + ".scale")
	case FormatNVFP4:
		out.Scale, _ = b.st.Get(l.Name + ".weight_scale")
		s2, _ := b.st.Get(l.Name + ".weight_scale_2")
		in, _ := b.st.Get(l.Name + ".input_scale")
		out.Scale2, out.InputScale = scalarF32(s2), scalarF32(in)
	}
	return out
}
