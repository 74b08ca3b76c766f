// Package attention is the DeepSeek-V4 attention sub-layer written against
// backend.Backend (spec §5): low-rank queries with per-head RMS normalisation,
// the shared K=V entry, the compressors, the lightning indexer, sparse MQA with
// sink over window + compressed entries, inverse RoPE and the grouped low-rank
// output projection.
package attention

import (
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/rope"
)

// Compressor is a prepared compressor (main or indexer).
type Compressor struct {
	WKV, WGate backend.Linear
	APE        backend.Mat
	Norm       backend.Vec
	Ratio, Dim int
}

// Indexer is a prepared lightning indexer.
type Indexer struct {
	WqB, WeightsProj backend.Linear
	Comp             Compressor
	Heads, Dim, TopK int
}

// Layer is one prepared attention sub-layer.
type Layer struct {
	Index, Ratio            int
	Heads, HeadDim, RopeDim int
	Groups, Window          int
	Eps                     float32
	WqA, WqB, WKV, WoA, WoB backend.Linear
	QNorm, KVNorm, Sink     backend.Vec
	Rope                    *rope.Freqs
	Comp                    *Compressor
	Idx                     *Indexer
}

func prepComp(be backend.Backend, name string, c *checkpoint.Compressor, d int) (*Compressor, error) {
	cc := 1
	if c.Ratio == 4 {
		cc = 2
	}
	out := &Compressor{Ratio: c.Ratio, Dim: c.Dim}
	var err error
	if out.WKV, err = be.PrepareLinear(&c.WKV); err != nil {
		return nil, err
	}
	if out.WGate, err = be.PrepareLinear(&c.WGate); err != nil {
		return nil, err
	}
	if out.WKV.Out() != cc*c.Dim || out.WKV.In() != d || out.WGate.Out() != cc*c.Dim {
		return nil, fmt.Errorf("%s: wkv %dx%d, want %dx%d", name, out.WKV.Out(), out.WKV.In(), cc*c.Dim, d)
	}
	if out.APE, err = be.PrepareMat(name+".ape", c.APE, c.Ratio, cc*c.Dim); err != nil {
		return nil, err
	}
	if out.Norm, err = be.PrepareVec(name+".norm.weight", c.Norm, c.Dim); err != nil {
		return nil, err
	}
	return out, nil
}

// Prepare binds the attention weights of layer l.
func Prepare(be backend.Backend, c *checkpoint.Config, l *checkpoint.Layer) (*Layer, error) {
	a := &l.Attn
	pre := fmt.Sprintf("layer %d attn", l.Index)
	if l.Index >= c.Layers {
		pre = "mtp attn"
	}
	out := &Layer{Index: l.Index, Ratio: l.Ratio, Heads: c.Heads, HeadDim: c.HeadDim, RopeDim: c.RopeDim,
		Groups: c.OGroups, Window: c.Window, Eps: float32(c.NormEps)}
	var err error
	lin := func(dst *backend.Linear, cl *checkpoint.Linear, o, i int) {
		if err != nil {
			return
		}
		if *dst, err = be.PrepareLinear(cl); err != nil {
			return
		}
		if (*dst).Out() != o || (*dst).In() != i {
			err = fmt.Errorf("%s %s: shape %dx%d, want %dx%d", pre, cl.Name, (*dst).Out(), (*dst).In(), o, i)
		}
	}
	lin(&out.WqA, &a.WqA, c.QLoraRank, c.Dim)
	lin(&out.WqB, &a.WqB, c.Heads*c.HeadDim, c.QLoraRank)
	lin(&out.WKV, &a.WKV, c.HeadDim, c.Dim)
	lin(&out.WoA, &a.WoA, c.OGroups*c.OLoraRank, c.Heads/c.OGroups*c.HeadDim)
	lin(&out.WoB, &a.WoB, c.Dim, c.OGroups*c.OLoraRank)
	if err != nil {
		return nil, err
	}
	if out.QNorm, err = be.PrepareVec(pre+" q_norm", a.QNorm, c.QLoraRank); err != nil {
		return nil, err
	}
	if out.KVNorm, err = be.PrepareVec(pre+" kv_norm", a.KVNorm, c.HeadDim); err != nil {
		return nil, err
	}
	if out.Sink, err = be.PrepareVec(pre+" attn_sink", a.Sink, c.Heads); err != nil {
		return nil, err
	}
	if out.Rope, err = rope.ForLayer(c, l.Ratio); err != nil {
		return nil, err
	}
	if l.Ratio > 0 {
		if a.Compressor == nil {
			return nil, fmt.Errorf("%s: ratio %d without compressor", pre, l.Ratio)
		}
		if out.Comp, err = prepComp(be, pre+" compressor", a.Compressor, c.Dim); err != nil {
			return nil, err
		}
	}
	if l.Ratio == 4 {
		if a.Indexer == nil {
			return nil, fmt.Errorf("%s: CSA layer without indexer", pre)
		}
		ix := &Indexer{Heads: c.IndexHeads, Dim: c.IndexHeadDim, TopK: c.IndexTopK}
		lin(&ix.WqB, &a.Indexer.WqB, c.IndexHeads*c.IndexHeadDim, c.QLoraRank)
		lin(&ix.WeightsProj, &a.Indexer.WeightsProj, c.IndexHeads, c.Dim)
		if err != nil {
			return nil, err
		}
		ic, err := prepComp(be, pre+" indexer compressor", &a.Indexer.Compressor, c.Dim)
		if err != nil {
			return nil, err
		}
		ix.Comp = *ic
		out.Idx = ix
	}
	return out, nil
}

// InputLinears are the linears that read the layer's input as it is (wq_a
// and wkv): the caller runs them with the norm that makes the input
// (Backend.HcPreNormLinears) and hands Forward their outputs.
func (l *Layer) InputLinears() []backend.Linear { return []backend.Linear{l.WqA, l.WKV} }

func (l *Layer) compress(be backend.Backend, st backend.KVStore, x backend.Tensor, c *Compressor, kind backend.CompressKind, b *backend.Batch) error {
	n := x.Rows()
	A := be.Empty(n, c.WKV.Out(), backend.F32)
	Z := be.Empty(n, c.WGate.Out(), backend.F32)
	defer be.Free(A)
	defer be.Free(Z)
	if err := be.LinearF32(x, c.WKV, A); err != nil {
		return err
	}
	if err := be.LinearF32(x, c.WGate, Z); err != nil {
		return err
	}
	args := backend.CompressArgs{Layer: l.Index, Kind: kind, Ratio: c.Ratio, Dim: c.Dim,
		APE: c.APE, Norm: c.Norm, NormEps: l.Eps, Rope: l.Rope}
	return be.Compress(st, A, Z, args, b)
}

// Forward runs the attention sub-layer on the normed input a [N, d], given
// first, the outputs of InputLinears on a (wq_a·a, wkv·a; nil: Forward runs
// them), and returns its output [N, d]; it updates the layer's cache state
// in st.
func (l *Layer) Forward(be backend.Backend, st backend.KVStore, a backend.Tensor, first []backend.Tensor, b *backend.Batch) (backend.Tensor, error) {
	n := a.Rows()
	H, D := l.Heads, l.HeadDim
	// Every tensor but the output goes back when the sub-layer returns, error
	// or not (on the GPU an unfreed tensor is pool memory lost for good).
	var tmp []backend.Tensor
	defer func() {
		for _, t := range tmp {
			be.Free(t)
		}
	}()
	empty := func(rows, cols int, dt backend.DType) backend.Tensor {
		t := be.Empty(rows, cols, dt)
		tmp = append(tmp, t)
		return t
	}
	if first == nil {
		first = []backend.Tensor{empty(n, l.WqA.Out(), backend.F32), empty(n, D, backend.F32)}
		if err := be.Linears(a, l.InputLinears(), first); err != nil {
			return nil, fmt.Errorf("attn wq_a|wkv: %w", err)
		}
	}
	if len(first) != 2 {
		return nil, fmt.Errorf("attn: %d input linear outputs, want 2 (wq_a, wkv)", len(first))
	}
	qa, kvr := first[0], first[1]
	wrap := func(name string, err error) error {
		if err != nil {
			return fmt.Errorf("attn %s: %w", name, err)
		}
		return nil
	}
	// The kv epilogue, the compressors and the indexer's weights depend on
	// nothing of the q path below: the backend may run them beside it.
	ra := backend.RopeArgs{Freqs: l.Rope, HeadDim: D}
	kv := empty(n, D, backend.F32)
	var w backend.Tensor // the indexer's head weights
	kvSide := func() error {
		if err := wrap("kv", be.NormRopeKVQuant(kvr, l.KVNorm, l.Eps, ra, D-l.RopeDim, 64, b, kv)); err != nil {
			return err
		}
		if ix := l.Idx; ix != nil {
			if err := wrap("indexer compressor", l.compress(be, st, a, &ix.Comp, backend.CompressIndex, b)); err != nil {
				return err
			}
			w = empty(n, ix.Heads, backend.F32)
			err := be.Linear(a, ix.WeightsProj, w)
			if err == nil {
				err = be.Scale(w, float32(math.Pow(float64(ix.Dim), -0.5)*math.Pow(float64(ix.Heads), -0.5)))
			}
			if err := wrap("indexer weights", err); err != nil {
				return err
			}
		}
		if l.Comp != nil {
			return wrap("compressor", l.compress(be, st, a, l.Comp, backend.CompressKV, b))
		}
		return nil
	}
	defer be.Join() // error paths; runs before the frees above
	if err := be.Fork(n, b, kvSide); err != nil {
		return nil, err
	}
	// q_norm, then wq_b and the indexer's wq_b, which read its output.
	q := empty(n, H*D, backend.F32)
	ws, outs := []backend.Linear{l.WqB}, []backend.Tensor{q}
	var qi backend.Tensor
	if ix := l.Idx; ix != nil {
		qi = empty(n, ix.Heads*ix.Dim, backend.F32)
		ws, outs = append(ws, ix.WqB), append(outs, qi)
	}
	qr := empty(n, l.WqA.Out(), backend.F32)
	if err := wrap("q_norm+wq_b", be.NormLinears(qa, l.QNorm, l.Eps, qr, ws, outs)); err != nil {
		return nil, err
	}
	if err := wrap("q", be.HeadNormRope(q, l.Eps, ra, b)); err != nil {
		return nil, err
	}
	if ix := l.Idx; ix != nil {
		if err := wrap("indexer q", be.RopeHadamardFP4(qi, backend.RopeArgs{Freqs: l.Rope, HeadDim: ix.Dim}, b)); err != nil {
			return nil, err
		}
	}
	if err := be.Join(); err != nil {
		return nil, fmt.Errorf("attn: %w", err)
	}
	var sel backend.Tensor
	if ix := l.Idx; ix != nil {
		sel = empty(n, ix.TopK, backend.I32)
		if err := be.IndexerTopK(st, qi, w, backend.IndexerArgs{Layer: l.Index, Heads: ix.Heads, HeadDim: ix.Dim,
			TopK: ix.TopK, Ratio: l.Ratio}, b, sel); err != nil {
			return nil, fmt.Errorf("attn indexer: %w", err)
		}
	}
	o := empty(n, H*D, backend.F32)
	scale := float32(1 / math.Sqrt(float64(D)))
	err := be.SparseAttention(st, q, kv, sel, backend.AttnArgs{Layer: l.Index, Heads: H, HeadDim: D, Window: l.Window,
		Ratio: l.Ratio, Scale: scale, Sink: l.Sink}, b, o)
	if err == nil {
		err = be.WriteWindow(st, l.Index, kv, b)
	}
	if err == nil {
		err = be.Rope(o, backend.RopeArgs{Freqs: l.Rope, HeadDim: D, Inverse: true}, b)
	}
	if err := wrap("sparse attention", err); err != nil {
		return nil, err
	}
	z := empty(n, l.WoA.Out(), backend.F32)
	if err := wrap("wo_a", be.GroupedOutProj(o, l.WoA, l.Groups, z)); err != nil {
		return nil, err
	}
	out := be.Empty(n, l.WoB.Out(), backend.F32)
	if err := wrap("wo_b", be.Linear(z, l.WoB, out)); err != nil {
		be.Free(out)
		return nil, err
	}
	return out, nil
}
