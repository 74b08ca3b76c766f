package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/megamoe/megamoe/backend"
)

// timedBackend wraps a backend and charges the wall time of every compute op,
// synchronised before and after (sync), to an op name: a per-op breakdown of
// a step without a profiler on the device. Linears are keyed by weight name
// without the layer index. Timing serialises the device, so a profiled step is
// slower than a plain one; the shares, not the sum, are the reading.
type timedBackend struct {
	backend.Backend
	sync  func() error
	total map[string]time.Duration
	calls map[string]int
	err   error // first sync failure
}

func newTimed(be backend.Backend, sync func() error) *timedBackend {
	return &timedBackend{Backend: be, sync: sync, total: map[string]time.Duration{}, calls: map[string]int{}}
}

func (t *timedBackend) reset() { clear(t.total); clear(t.calls) }

// op runs f between two syncs and charges its time to name.
func (t *timedBackend) op(name string, f func() error) error {
	if err := t.sync(); err != nil && t.err == nil {
		t.err = err
	}
	t0 := time.Now()
	err := f()
	if serr := t.sync(); serr != nil && t.err == nil {
		t.err = serr
	}
	t.total[name] += time.Since(t0)
	t.calls[name]++
	return err
}

// linearKey is "linear <name without layers.N.> NxK".
func linearKey(kind string, w backend.Linear) string {
	name := w.Name()
	if rest, ok := strings.CutPrefix(name, "layers."); ok {
		if i := strings.IndexByte(rest, '.'); i >= 0 {
			name = rest[i+1:]
		}
	}
	return fmt.Sprintf("%s %s %dx%d", kind, name, w.Out(), w.In())
}

// print writes the ops by total time over steps steps, with the share of wall.
func (t *timedBackend) print(out io.Writer, what string, steps int, wall time.Duration) {
	type row struct {
		name string
		d    time.Duration
	}
	var rows []row
	var sum time.Duration
	for k, d := range t.total {
		rows = append(rows, row{k, d})
		sum += d
	}
	slices.SortFunc(rows, func(a, b row) int { return int(b.d - a.d) })
	fmt.Fprintf(out, "profile %s: %d steps, %.3f ms/step wall (profiled), ops %.3f ms/step, host and transfers %.3f ms/step\n",
		what, steps, ms(wall)/float64(steps), ms(sum)/float64(steps), ms(wall-sum)/float64(steps))
	for _, r := range rows {
		fmt.Fprintf(out, "  %-58s %8.3f ms/step %5.1f%%  %6.1f calls/step\n", r.name, ms(r.d)/float64(steps),
			100*float64(r.d)/float64(max(wall, 1)), float64(t.calls[r.name])/float64(steps))
	}
}

func (t *timedBackend) Embed(e backend.Embedding, ids []int32, streams int, out backend.Tensor) error {
	return t.op("embed", func() error { return t.Backend.Embed(e, ids, streams, out) })
}
func (t *timedBackend) RMSNorm(x backend.Tensor, w backend.Vec, eps float32, out backend.Tensor) error {
	return t.op("rmsnorm", func() error { return t.Backend.RMSNorm(x, w, eps, out) })
}
func (t *timedBackend) HeadNorm(x backend.Tensor, headDim int, eps float32) error {
	return t.op("head_norm", func() error { return t.Backend.HeadNorm(x, headDim, eps) })
}
func (t *timedBackend) HcPre(x backend.Tensor, hc backend.HC, a backend.HcArgs, out, mix backend.Tensor) error {
	return t.op("hc_pre", func() error { return t.Backend.HcPre(x, hc, a, out, mix) })
}
func (t *timedBackend) HcPost(o, x, mix backend.Tensor, a backend.HcArgs, out backend.Tensor) error {
	return t.op("hc_post", func() error { return t.Backend.HcPost(o, x, mix, a, out) })
}
func (t *timedBackend) HcHead(x backend.Tensor, hc backend.HC, a backend.HcArgs, out backend.Tensor) error {
	return t.op("hc_head", func() error { return t.Backend.HcHead(x, hc, a, out) })
}
func (t *timedBackend) AddStreams(x, e backend.Tensor) error {
	return t.op("add_streams", func() error { return t.Backend.AddStreams(x, e) })
}
func (t *timedBackend) Linear(x backend.Tensor, w backend.Linear, out backend.Tensor) error {
	return t.op(linearKey("linear", w), func() error { return t.Backend.Linear(x, w, out) })
}
func (t *timedBackend) LinearF32(x backend.Tensor, w backend.Linear, out backend.Tensor) error {
	return t.op(linearKey("linear_f32", w), func() error { return t.Backend.LinearF32(x, w, out) })
}
func (t *timedBackend) GroupedOutProj(x backend.Tensor, w backend.Linear, groups int, out backend.Tensor) error {
	return t.op(linearKey("grouped_out_proj", w), func() error { return t.Backend.GroupedOutProj(x, w, groups, out) })
}
func (t *timedBackend) Scale(x backend.Tensor, s float32) error {
	return t.op("scale", func() error { return t.Backend.Scale(x, s) })
}
func (t *timedBackend) Rope(x backend.Tensor, a backend.RopeArgs, b *backend.Batch) error {
	return t.op("rope", func() error { return t.Backend.Rope(x, a, b) })
}
func (t *timedBackend) KVQuant(x backend.Tensor, nope, block int) error {
	return t.op("kv_quant", func() error { return t.Backend.KVQuant(x, nope, block) })
}
func (t *timedBackend) HadamardFP4(x backend.Tensor, headDim int) error {
	return t.op("hadamard_fp4", func() error { return t.Backend.HadamardFP4(x, headDim) })
}
func (t *timedBackend) Compress(s backend.KVStore, A, Z backend.Tensor, a backend.CompressArgs, b *backend.Batch) error {
	return t.op(fmt.Sprintf("compress ratio %d", a.Ratio), func() error { return t.Backend.Compress(s, A, Z, a, b) })
}
func (t *timedBackend) IndexerTopK(s backend.KVStore, q, w backend.Tensor, a backend.IndexerArgs, b *backend.Batch, out backend.Tensor) error {
	return t.op("indexer_topk", func() error { return t.Backend.IndexerTopK(s, q, w, a, b, out) })
}
func (t *timedBackend) SparseAttention(s backend.KVStore, q, kv, sel backend.Tensor, a backend.AttnArgs, b *backend.Batch, out backend.Tensor) error {
	return t.op("sparse_attention", func() error { return t.Backend.SparseAttention(s, q, kv, sel, a, b, out) })
}
func (t *timedBackend) WriteWindow(s backend.KVStore, layer int, kv backend.Tensor, b *backend.Batch) error {
	return t.op("write_window", func() error { return t.Backend.WriteWindow(s, layer, kv, b) })
}
func (t *timedBackend) Router(f backend.Tensor, gate backend.Linear, a backend.RouterArgs, weights, ids backend.Tensor) error {
	return t.op("router", func() error { return t.Backend.Router(f, gate, a, weights, ids) })
}
func (t *timedBackend) Experts(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, acc backend.Tensor) error {
	return t.op("experts", func() error { return t.Backend.Experts(f, e, weights, ids, a, acc) })
}
func (t *timedBackend) SwiGLU(g, u backend.Tensor, limit float32, out backend.Tensor) error {
	return t.op("swiglu", func() error { return t.Backend.SwiGLU(g, u, limit, out) })
}
func (t *timedBackend) Combine(acc, shared, out backend.Tensor) error {
	return t.op("combine", func() error { return t.Backend.Combine(acc, shared, out) })
}
func (t *timedBackend) GatherRows(x backend.Tensor, rows []int, out backend.Tensor) error {
	return t.op("gather_rows", func() error { return t.Backend.GatherRows(x, rows, out) })
}
