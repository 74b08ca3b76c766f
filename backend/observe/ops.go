package observe

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
)

// The compute ops: each passes its call to the hook.

// Embed implements backend.Backend.
func (o *Backend) Embed(e backend.Embedding, ids []int32, streams int, t backend.Tensor) error {
	return o.op(Call{Op: "Embed", Outs: out("embed", t)}, func() error { return o.be.Embed(e, ids, streams, t) })
}

// RMSNorm implements backend.Backend.
func (o *Backend) RMSNorm(x backend.Tensor, w backend.Vec, eps float32, t backend.Tensor) error {
	return o.op(Call{Op: "RMSNorm", Outs: out("norm", t), Ins: ins(x)}, func() error { return o.be.RMSNorm(x, w, eps, t) })
}

// HeadNorm implements backend.Backend.
func (o *Backend) HeadNorm(x backend.Tensor, headDim int, eps float32) error {
	return o.op(Call{Op: "HeadNorm", Outs: out("head norm", x)}, func() error { return o.be.HeadNorm(x, headDim, eps) })
}

// HcPre implements backend.Backend.
func (o *Backend) HcPre(x backend.Tensor, hc backend.HC, a backend.HcArgs, t, mix backend.Tensor) error {
	return o.op(Call{Op: "HcPre", Outs: []Out{{"hc_pre", t}, {"hc_pre mix", mix}}, Ins: ins(x)},
		func() error { return o.be.HcPre(x, hc, a, t, mix) })
}

// HcPost implements backend.Backend.
func (o *Backend) HcPost(y, x, mix backend.Tensor, a backend.HcArgs, t backend.Tensor) error {
	return o.op(Call{Op: "HcPost", Outs: out("hc_post", t), Ins: ins(y)}, func() error { return o.be.HcPost(y, x, mix, a, t) })
}

// HcHead implements backend.Backend.
func (o *Backend) HcHead(x backend.Tensor, hc backend.HC, a backend.HcArgs, t backend.Tensor) error {
	return o.op(Call{Op: "HcHead", Outs: out("hc_head", t), Ins: ins(x)}, func() error { return o.be.HcHead(x, hc, a, t) })
}

// AddStreams implements backend.Backend.
func (o *Backend) AddStreams(x, e backend.Tensor) error {
	return o.op(Call{Op: "AddStreams", Outs: out("add streams", x), Ins: ins(e)}, func() error { return o.be.AddStreams(x, e) })
}

// Linear implements backend.Backend.
func (o *Backend) Linear(x backend.Tensor, w backend.Linear, t backend.Tensor) error {
	return o.op(Call{Op: "Linear", Key: linKey("Linear", w), Outs: out(WeightName(w), t), Ins: ins(x)},
		func() error { return o.be.Linear(x, w, t) })
}

// LinearF32 implements backend.Backend.
func (o *Backend) LinearF32(x backend.Tensor, w backend.Linear, t backend.Tensor) error {
	return o.op(Call{Op: "LinearF32", Key: linKey("LinearF32", w), Outs: out(WeightName(w), t), Ins: ins(x)},
		func() error { return o.be.LinearF32(x, w, t) })
}

// GroupedOutProj implements backend.Backend.
func (o *Backend) GroupedOutProj(x backend.Tensor, w backend.Linear, groups int, t backend.Tensor) error {
	return o.op(Call{Op: "GroupedOutProj", Key: linKey("GroupedOutProj", w), Outs: out(WeightName(w), t), Ins: ins(x)},
		func() error { return o.be.GroupedOutProj(x, w, groups, t) })
}

// Scale implements backend.Backend.
func (o *Backend) Scale(x backend.Tensor, s float32) error {
	return o.op(Call{Op: "Scale", Outs: out("scale", x)}, func() error { return o.be.Scale(x, s) })
}

// Rope implements backend.Backend.
func (o *Backend) Rope(x backend.Tensor, a backend.RopeArgs, b *backend.Batch) error {
	return o.op(Call{Op: "Rope", Outs: out("rope", x)}, func() error { return o.be.Rope(x, a, b) })
}

// KVQuant implements backend.Backend.
func (o *Backend) KVQuant(x backend.Tensor, nope, block int) error {
	return o.op(Call{Op: "KVQuant", Outs: out("kv quant", x)}, func() error { return o.be.KVQuant(x, nope, block) })
}

// HadamardFP4 implements backend.Backend.
func (o *Backend) HadamardFP4(x backend.Tensor, headDim int) error {
	return o.op(Call{Op: "HadamardFP4", Outs: out("hadamard fp4", x)}, func() error { return o.be.HadamardFP4(x, headDim) })
}

// Compress implements backend.Backend.
func (o *Backend) Compress(s backend.KVStore, A, Z backend.Tensor, a backend.CompressArgs, b *backend.Batch) error {
	return o.op(Call{Op: "Compress", Key: fmt.Sprintf("compress ratio %d", a.Ratio), Ins: ins(A, Z)},
		func() error { return o.be.Compress(s, A, Z, a, b) })
}

// IndexerTopK implements backend.Backend.
func (o *Backend) IndexerTopK(s backend.KVStore, q, w backend.Tensor, a backend.IndexerArgs, b *backend.Batch, t backend.Tensor) error {
	return o.op(Call{Op: "IndexerTopK", Outs: out("indexer top-k", t), Ins: ins(q, w)}, func() error {
		a.Trace = a.Trace || o.trace
		return o.be.IndexerTopK(s, q, w, a, b, t)
	})
}

// SparseAttention implements backend.Backend.
func (o *Backend) SparseAttention(s backend.KVStore, q, kv, sel backend.Tensor, a backend.AttnArgs, b *backend.Batch, t backend.Tensor) error {
	return o.op(Call{Op: "SparseAttention", Outs: out("sparse attention", t), Ins: ins(q, kv)},
		func() error { return o.be.SparseAttention(s, q, kv, sel, a, b, t) })
}

// WriteWindow implements backend.Backend.
func (o *Backend) WriteWindow(s backend.KVStore, layer int, kv backend.Tensor, b *backend.Batch) error {
	return o.op(Call{Op: "WriteWindow", Ins: ins(kv)}, func() error { return o.be.WriteWindow(s, layer, kv, b) })
}

// Router implements backend.Backend.
func (o *Backend) Router(f backend.Tensor, gate backend.Linear, a backend.RouterArgs, weights, ids backend.Tensor) error {
	return o.op(Call{Op: "Router", Outs: []Out{{"router weights", weights}, {"router ids", ids}}, Ins: ins(f)},
		func() error { return o.be.Router(f, gate, a, weights, ids) })
}

// Experts implements backend.Backend.
func (o *Backend) Experts(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, acc backend.Tensor) error {
	return o.op(Call{Op: "Experts", Outs: out("routed experts", acc), Ins: ins(f)}, func() error {
		a.Trace = a.Trace || o.trace
		return o.be.Experts(f, e, weights, ids, a, acc)
	})
}

// SwiGLU implements backend.Backend.
func (o *Backend) SwiGLU(g, u backend.Tensor, limit float32, t backend.Tensor) error {
	return o.op(Call{Op: "SwiGLU", Outs: out("swiglu", t), Ins: ins(g, u)}, func() error { return o.be.SwiGLU(g, u, limit, t) })
}

// Combine implements backend.Backend.
func (o *Backend) Combine(acc, shared, t backend.Tensor) error {
	return o.op(Call{Op: "Combine", Outs: out("combine", t), Ins: ins(acc, shared)}, func() error { return o.be.Combine(acc, shared, t) })
}

// GatherRows implements backend.Backend.
func (o *Backend) GatherRows(x backend.Tensor, rows []int, t backend.Tensor) error {
	return o.op(Call{Op: "GatherRows", Outs: out("gather", t), Ins: ins(x)}, func() error { return o.be.GatherRows(x, rows, t) })
}

// Linears implements backend.Backend.
func (o *Backend) Linears(x backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	return o.op(Call{Op: "Linears", Key: linKey("Linears", ws...), Outs: linOuts(ws, outs), Ins: ins(x)},
		func() error { return o.be.Linears(x, ws, outs) })
}

// NormLinears implements backend.Backend.
func (o *Backend) NormLinears(x backend.Tensor, w backend.Vec, eps float32, normed backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	c := Call{Op: "NormLinears", Key: linKey("NormLinears", ws...), Outs: append(out("norm", normed), linOuts(ws, outs)...), Ins: ins(x)}
	return o.op(c, func() error { return o.be.NormLinears(x, w, eps, normed, ws, outs) })
}

// HcPreNormLinears implements backend.Backend.
func (o *Backend) HcPreNormLinears(x backend.Tensor, hc backend.HC, a backend.HcArgs, norm backend.Vec, eps float32, normed, mix backend.Tensor, ws []backend.Linear, outs []backend.Tensor) error {
	c := Call{Op: "HcPreNormLinears", Key: linKey("HcPreNormLinears", ws...),
		Outs: append([]Out{{"hc_pre mix", mix}, {"norm", normed}}, linOuts(ws, outs)...), Ins: ins(x)}
	return o.op(c, func() error { return o.be.HcPreNormLinears(x, hc, a, norm, eps, normed, mix, ws, outs) })
}

// SwiGLULinear implements backend.Backend.
func (o *Backend) SwiGLULinear(g, u backend.Tensor, limit float32, h backend.Tensor, w backend.Linear, t backend.Tensor) error {
	c := Call{Op: "SwiGLULinear", Key: linKey("SwiGLULinear", w), Outs: []Out{{"swiglu", h}, {WeightName(w), t}}, Ins: ins(g, u)}
	return o.op(c, func() error { return o.be.SwiGLULinear(g, u, limit, h, w, t) })
}

// HeadNormRope implements backend.Backend.
func (o *Backend) HeadNormRope(x backend.Tensor, eps float32, a backend.RopeArgs, b *backend.Batch) error {
	return o.op(Call{Op: "HeadNormRope", Outs: out("head norm rope", x)}, func() error { return o.be.HeadNormRope(x, eps, a, b) })
}

// RopeHadamardFP4 implements backend.Backend.
func (o *Backend) RopeHadamardFP4(x backend.Tensor, a backend.RopeArgs, b *backend.Batch) error {
	return o.op(Call{Op: "RopeHadamardFP4", Outs: out("rope hadamard fp4", x)}, func() error { return o.be.RopeHadamardFP4(x, a, b) })
}

// NormRopeKVQuant implements backend.Backend.
func (o *Backend) NormRopeKVQuant(x backend.Tensor, w backend.Vec, eps float32, a backend.RopeArgs, nope, block int, b *backend.Batch, t backend.Tensor) error {
	return o.op(Call{Op: "NormRopeKVQuant", Outs: out("kv", t), Ins: ins(x)},
		func() error { return o.be.NormRopeKVQuant(x, w, eps, a, nope, block, b, t) })
}

// ExpertsCombinePost implements backend.Backend.
func (o *Backend) ExpertsCombinePost(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, shared, t, x, mix backend.Tensor, h backend.HcArgs) error {
	return o.op(Call{Op: "ExpertsCombinePost", Outs: []Out{{"experts combine", t}, {"hc_post", x}}, Ins: ins(f, shared)}, func() error {
		a.Trace = a.Trace || o.trace
		return o.be.ExpertsCombinePost(f, e, weights, ids, a, shared, t, x, mix, h)
	})
}

// ExpertsCombine implements backend.Backend.
func (o *Backend) ExpertsCombine(f backend.Tensor, e backend.Experts, weights, ids backend.Tensor, a backend.ExpertsArgs, shared, t backend.Tensor) error {
	return o.op(Call{Op: "ExpertsCombine", Outs: out("experts combine", t), Ins: ins(f, shared)}, func() error {
		a.Trace = a.Trace || o.trace
		return o.be.ExpertsCombine(f, e, weights, ids, a, shared, t)
	})
}
