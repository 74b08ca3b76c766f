// Package moe is the DeepSeek-V4 mixture-of-experts sub-layer written against
// backend.Backend (spec §6): sqrt-softplus router with selection bias or hash
// routing (tid2eid), routed experts grouped by expert, the clamped SwiGLU, the
// shared expert and the fp32 combination.
package moe

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
)

// Layer is one prepared MoE sub-layer.
type Layer struct {
	Index         int
	TopK          int
	Scale         float32 // routed_scaling_factor
	Limit         float32 // swiglu_limit
	Gate          backend.Linear
	Bias          backend.Vec     // nil on hash layers
	Tid2Eid       backend.IDTable // non-nil on hash layers
	Experts       backend.Experts
	SW1, SW2, SW3 backend.Linear
	// Expert parallel (nil Reduce: all experts are here): Experts holds the
	// global ids [ExpertLo, ExpertLo+Count) and Reduce sums the routed outputs
	// over the ranks before the shared expert is added (model.py's all_reduce).
	ExpertLo int
	Reduce   func(backend.Tensor) error
}

// Prepare binds the MoE weights of layer l; part (nil: whole model) names the
// routed experts this rank holds.
func Prepare(be backend.Backend, c *checkpoint.Config, l *checkpoint.Layer, part *checkpoint.Part) (*Layer, error) {
	m := &l.FFN
	pre := fmt.Sprintf("layer %d ffn", l.Index)
	out := &Layer{Index: l.Index, TopK: c.TopK, Scale: float32(c.RouteScale), Limit: float32(c.SwigluLimit)}
	var err error
	if out.Gate, err = be.PrepareLinear(&m.Gate); err != nil {
		return nil, err
	}
	if out.Gate.Out() != c.Experts || out.Gate.In() != c.Dim {
		return nil, fmt.Errorf("%s gate: %dx%d, want %dx%d", pre, out.Gate.Out(), out.Gate.In(), c.Experts, c.Dim)
	}
	if m.Hash() {
		if out.Tid2Eid, err = be.PrepareIDTable(pre+" tid2eid", m.Tid2Eid, c.Vocab, c.TopK); err != nil {
			return nil, err
		}
	} else if out.Bias, err = be.PrepareVec(pre+" gate.bias", m.Bias, c.Experts); err != nil {
		return nil, err
	}
	want := c.Experts
	if part != nil {
		want, out.ExpertLo = part.ExpertHi-part.ExpertLo, part.ExpertLo
	}
	if len(m.Experts) != want {
		return nil, fmt.Errorf("%s: %d experts, want %d", pre, len(m.Experts), want)
	}
	if out.Experts, err = be.PrepareExperts(pre, m.Experts, c.Dim, c.MoEInter); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		dst  *backend.Linear
		src  *checkpoint.Linear
		o, i int
	}{{&out.SW1, &m.Shared.W1, c.MoEInter, c.Dim}, {&out.SW3, &m.Shared.W3, c.MoEInter, c.Dim}, {&out.SW2, &m.Shared.W2, c.Dim, c.MoEInter}} {
		if *p.dst, err = be.PrepareLinear(p.src); err != nil {
			return nil, err
		}
		if (*p.dst).Out() != p.o || (*p.dst).In() != p.i {
			return nil, fmt.Errorf("%s %s: %dx%d, want %dx%d", pre, p.src.Name, (*p.dst).Out(), (*p.dst).In(), p.o, p.i)
		}
	}
	return out, nil
}

// Route runs the router only: weights [N, k] and expert ids [N, k].
func (l *Layer) Route(be backend.Backend, f backend.Tensor, ids []int32) (backend.Tensor, backend.Tensor, error) {
	n := f.Rows()
	w := be.Empty(n, l.TopK, backend.F32)
	e := be.Empty(n, l.TopK, backend.I32)
	if err := be.Router(f, l.Gate, backend.RouterArgs{TopK: l.TopK, Scale: l.Scale, Bias: l.Bias, Tid2Eid: l.Tid2Eid, IDs: ids}, w, e); err != nil {
		return nil, nil, fmt.Errorf("moe router: %w", err)
	}
	return w, e, nil
}

// Forward runs the MoE on the normed input f [N, d] for tokens ids. The
// shared expert depends on nothing of the routed path: the backend may run
// it beside the router and the routed experts, and add it while combining
// them (Backend.ExpertsCombine). With expert parallel the routed sum is
// all-reduced over the ranks before the shared expert is added.
func (l *Layer) Forward(be backend.Backend, f backend.Tensor, ids []int32) (backend.Tensor, error) {
	return l.forward(be, f, ids, nil)
}

// Post is the hc post that follows a block's MoE (spec §4.2): the streams X
// updated in place from the MoE's output with the site's Mix.
type Post struct {
	X, Mix backend.Tensor
	Args   backend.HcArgs
}

// ForwardPost is Forward, then the hc post p of its output
// (Backend.ExpertsCombinePost, where no all-reduce comes between them).
func (l *Layer) ForwardPost(be backend.Backend, f backend.Tensor, ids []int32, p *Post) (backend.Tensor, error) {
	if p == nil {
		return nil, fmt.Errorf("moe: no hc post")
	}
	return l.forward(be, f, ids, p)
}

func (l *Layer) forward(be backend.Backend, f backend.Tensor, ids []int32, p *Post) (backend.Tensor, error) {
	n, d := f.Rows(), f.Cols()
	var s backend.Tensor
	defer func() {
		if s != nil {
			be.Free(s)
		}
	}()
	defer be.Join() // error paths
	if err := be.Fork(n, nil, func() (err error) { s, err = l.shared(be, f); return err }); err != nil {
		return nil, err
	}
	w, e, err := l.Route(be, f, ids)
	if err != nil {
		return nil, err
	}
	defer be.Free(w)
	defer be.Free(e)
	out := be.Empty(n, d, backend.F32)
	if err := l.combine(be, f, w, e, s, out, p); err != nil {
		be.Free(out)
		return nil, fmt.Errorf("moe: %w", err)
	}
	return out, nil
}

// combine writes out = bf16(Σ routed experts + s), then runs p if set.
func (l *Layer) combine(be backend.Backend, f, w, e, s, out backend.Tensor, p *Post) error {
	ea := backend.ExpertsArgs{Limit: l.Limit, Offset: l.ExpertLo, Partial: l.Reduce != nil}
	if l.Reduce == nil && p != nil {
		return be.ExpertsCombinePost(f, l.Experts, w, e, ea, s, out, p.X, p.Mix, p.Args)
	}
	if l.Reduce == nil {
		return be.ExpertsCombine(f, l.Experts, w, e, ea, s, out)
	}
	acc := be.Empty(out.Rows(), out.Cols(), backend.F32)
	defer be.Free(acc)
	if err := be.Experts(f, l.Experts, w, e, ea, acc); err != nil {
		return err
	}
	if err := be.Join(); err != nil {
		return err
	}
	if err := l.Reduce(acc); err != nil {
		return fmt.Errorf("all-reduce: %w", err)
	}
	if err := be.Combine(acc, s, out); err != nil || p == nil {
		return err
	}
	if err := be.HcPost(out, p.X, p.Mix, p.Args, p.X); err != nil {
		return fmt.Errorf("hc_post: %w", err)
	}
	return nil
}

// shared runs the shared expert on f: w2(SwiGLU(w1 f, w3 f)) [N, d].
func (l *Layer) shared(be backend.Backend, f backend.Tensor) (backend.Tensor, error) {
	n, I := f.Rows(), l.SW1.Out()
	g := be.Empty(n, I, backend.F32)
	u := be.Empty(n, I, backend.F32)
	h := be.Empty(n, I, backend.F32)
	defer func() {
		for _, t := range []backend.Tensor{g, u, h} {
			be.Free(t)
		}
	}()
	if err := be.Linears(f, []backend.Linear{l.SW1, l.SW3}, []backend.Tensor{g, u}); err != nil {
		return nil, fmt.Errorf("moe shared w1|w3: %w", err)
	}
	s := be.Empty(n, f.Cols(), backend.F32)
	if err := be.SwiGLULinear(g, u, l.Limit, h, l.SW2, s); err != nil {
		be.Free(s)
		return nil, fmt.Errorf("moe shared swiglu+w2: %w", err)
	}
	return s, nil
}
