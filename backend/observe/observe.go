// Package observe decorates a backend.Backend so that a Hook sees every op:
// the NaN tracer and the profiler are hooks. The decorator implements each op
// of the interface, fused ones included, by handing the wrapped backend's
// call to the hook, so a decorated model runs exactly the ops it runs
// undecorated. It runs them one after another: Fork runs its function at
// once and RecordStep runs the step eagerly, so that a hook can read each
// op's outputs or time it alone.
package observe

import (
	"fmt"
	"strings"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/safetensors"
)

// Out is a tensor an op writes, with the name a hook reports it under
// ("router ids", or a linear's weight name such as "attn.wq_a").
type Out struct {
	Name string
	T    backend.Tensor
}

// Call describes one op.
type Call struct {
	Op   string // the Backend method, as in backend.Ops
	Key  string // a label for profiles: Op in snake case, with the weights and shapes of linears
	Outs []Out  // what the op writes, in order (checked after the op)
	Ins  []backend.Tensor
}

// Hook sees every op: run issues it on the wrapped backend.
type Hook interface {
	Op(c *Call, run func() error) error
}

// Backend is the decorated backend.
type Backend struct {
	be    backend.Backend
	hook  Hook
	trace bool
}

var _ backend.Backend = (*Backend)(nil)

// Wrap returns be decorated with h.
func Wrap(be backend.Backend, h Hook) *Backend { return &Backend{be: be, hook: h} }

// WrapTracing is Wrap that also asks the ops with internal stages (the
// routed experts, the indexer's scores) to check them, so that a
// non-finite value comes back as a *backend.OpNonFinite naming the stage.
func WrapTracing(be backend.Backend, h Hook) *Backend {
	return &Backend{be: be, hook: h, trace: true}
}

// Unwrap implements backend.Wrapper.
func (o *Backend) Unwrap() backend.Backend { return o.be }

func (o *Backend) op(c Call, run func() error) error {
	if c.Key == "" {
		c.Key = Snake(c.Op)
	}
	return o.hook.Op(&c, run)
}

// Snake spells an op's method name in snake case: "ExpertsCombine" is
// "experts_combine", "NormRopeKVQuant" "norm_rope_kv_quant".
func Snake(op string) string {
	op = strings.ReplaceAll(op, "SwiGLU", "Swiglu")
	upper := func(i int) bool { return i >= 0 && i < len(op) && op[i] >= 'A' && op[i] <= 'Z' }
	lower := func(i int) bool { return i >= 0 && i < len(op) && op[i] >= 'a' && op[i] <= 'z' }
	var b []byte
	for i := 0; i < len(op); i++ {
		c := op[i]
		if upper(i) {
			// A word starts after a lower-case letter, or where an
			// acronym ("KV") meets the next word ("Quant").
			if lower(i-1) || (upper(i-1) && lower(i+1)) {
				b = append(b, '_')
			}
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return string(b)
}

func out(name string, t backend.Tensor) []Out { return []Out{{name, t}} }

func ins(ts ...backend.Tensor) []backend.Tensor { return ts }

// WeightName is a linear's weight name without the layer prefix and the
// ".weight" suffix: "attn.wq_a" for "layers.3.attn.wq_a.weight".
func WeightName(w backend.Linear) string {
	if w == nil {
		return "nil"
	}
	name := w.Name()
	for _, p := range []string{"layers.", "mtp."} {
		if rest, ok := strings.CutPrefix(name, p); ok {
			if _, after, found := strings.Cut(rest, "."); found {
				name = after
			}
			break
		}
	}
	return strings.TrimSuffix(name, ".weight")
}

func linKey(op string, ws ...backend.Linear) string {
	k := Snake(op)
	for _, w := range ws {
		if w != nil {
			k += fmt.Sprintf(" %s %dx%d", WeightName(w), w.Out(), w.In())
		}
	}
	return k
}

func linOuts(ws []backend.Linear, outs []backend.Tensor) []Out {
	var r []Out
	for i, t := range outs {
		name := "linear"
		if i < len(ws) && ws[i] != nil {
			name = WeightName(ws[i])
		}
		r = append(r, Out{name, t})
	}
	return r
}

// Name implements backend.Backend.
func (o *Backend) Name() string { return o.be.Name() }

// SetNumerics implements backend.Backend.
func (o *Backend) SetNumerics(n backend.Numerics) { o.be.SetNumerics(n) }

// Numerics implements backend.Backend.
func (o *Backend) Numerics() backend.Numerics { return o.be.Numerics() }

// Alloc implements backend.Backend.
func (o *Backend) Alloc(rows, cols int, dt backend.DType) backend.Tensor {
	return o.be.Alloc(rows, cols, dt)
}

// Empty implements backend.Backend.
func (o *Backend) Empty(rows, cols int, dt backend.DType) backend.Tensor {
	return o.be.Empty(rows, cols, dt)
}

// Slice implements backend.Backend.
func (o *Backend) Slice(t backend.Tensor, row0, rows int) (backend.Tensor, error) {
	return o.be.Slice(t, row0, rows)
}

// View implements backend.Backend.
func (o *Backend) View(t backend.Tensor, rows, cols int) (backend.Tensor, error) {
	return o.be.View(t, rows, cols)
}

// Free implements backend.Backend.
func (o *Backend) Free(t backend.Tensor) { o.be.Free(t) }

// Upload implements backend.Backend.
func (o *Backend) Upload(t backend.Tensor, data []float32) error { return o.be.Upload(t, data) }

// Download implements backend.Backend.
func (o *Backend) Download(t backend.Tensor, dst []float32) error { return o.be.Download(t, dst) }

// DownloadI32 implements backend.Backend.
func (o *Backend) DownloadI32(t backend.Tensor, dst []int32) error { return o.be.DownloadI32(t, dst) }

// Stats implements backend.Backend.
func (o *Backend) Stats(t backend.Tensor) backend.Stats { return o.be.Stats(t) }

// PrepareLinear implements backend.Backend.
func (o *Backend) PrepareLinear(l *checkpoint.Linear) (backend.Linear, error) {
	return o.be.PrepareLinear(l)
}

// PrepareVec implements backend.Backend.
func (o *Backend) PrepareVec(name string, t safetensors.Tensor, n int) (backend.Vec, error) {
	return o.be.PrepareVec(name, t, n)
}

// PrepareMat implements backend.Backend.
func (o *Backend) PrepareMat(name string, t safetensors.Tensor, rows, cols int) (backend.Mat, error) {
	return o.be.PrepareMat(name, t, rows, cols)
}

// PrepareHC implements backend.Backend.
func (o *Backend) PrepareHC(name string, hc checkpoint.HC, mix, width int) (backend.HC, error) {
	return o.be.PrepareHC(name, hc, mix, width)
}

// PrepareEmbedding implements backend.Backend.
func (o *Backend) PrepareEmbedding(t safetensors.Tensor, vocab, dim int) (backend.Embedding, error) {
	return o.be.PrepareEmbedding(t, vocab, dim)
}

// PrepareIDTable implements backend.Backend.
func (o *Backend) PrepareIDTable(name string, t safetensors.Tensor, rows, cols int) (backend.IDTable, error) {
	return o.be.PrepareIDTable(name, t, rows, cols)
}

// PrepareExperts implements backend.Backend.
func (o *Backend) PrepareExperts(name string, experts []checkpoint.Expert, dim, inter int) (backend.Experts, error) {
	return o.be.PrepareExperts(name, experts, dim, inter)
}

// NewKVStore implements backend.Backend.
func (o *Backend) NewKVStore(spec backend.KVSpec) (backend.KVStore, error) {
	return o.be.NewKVStore(spec)
}

// ResetSlot implements backend.Backend.
func (o *Backend) ResetSlot(s backend.KVStore, slot int) error { return o.be.ResetSlot(s, slot) }

// CopySlot implements backend.Backend.
func (o *Backend) CopySlot(s backend.KVStore, cs ...backend.SlotCopy) error {
	return o.be.CopySlot(s, cs...)
}

// CopyBlock implements backend.Backend.
func (o *Backend) CopyBlock(s backend.KVStore, dst, src int32) error {
	return o.be.CopyBlock(s, dst, src)
}

// Fork implements backend.Backend: fn runs at once.
func (o *Backend) Fork(rows int, bt *backend.Batch, fn func() error) error { return fn() }

// Join implements backend.Backend.
func (o *Backend) Join() error { return nil }

// RecordStep implements backend.Backend: the step runs eagerly.
func (o *Backend) RecordStep(bt *backend.Batch, ids []int32, forward func() ([]backend.Tensor, error)) ([]backend.Tensor, error) {
	return forward()
}
