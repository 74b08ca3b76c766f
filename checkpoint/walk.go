package checkpoint

import "github.com/megamoe/megamoe/safetensors"

// Walk calls linear for every linear of w (the shared and routed experts
// included) and tensor for every other bound tensor, skipping empty ones:
// embedding, head, final norm and hc_head, then the layers, then the MTP
// blocks.
func (w *Weights) Walk(linear func(*Linear), tensor func(safetensors.Tensor)) {
	add := func(ts ...safetensors.Tensor) {
		for _, t := range ts {
			if t.Valid() {
				tensor(t)
			}
		}
	}
	hc := func(h *HC) { add(h.Fn, h.Base, h.Scale) }
	comp := func(c *Compressor) {
		linear(&c.WKV)
		linear(&c.WGate)
		add(c.APE, c.Norm)
	}
	layer := func(l *Layer) {
		hc(&l.HcAttn)
		hc(&l.HcFFN)
		a := &l.Attn
		add(l.AttnNorm, l.FFNNorm, a.Sink, a.QNorm, a.KVNorm)
		for _, p := range []*Linear{&a.WqA, &a.WqB, &a.WKV, &a.WoA, &a.WoB} {
			linear(p)
		}
		if a.Compressor != nil {
			comp(a.Compressor)
		}
		if ix := a.Indexer; ix != nil {
			linear(&ix.WqB)
			linear(&ix.WeightsProj)
			comp(&ix.Compressor)
		}
		f := &l.FFN
		linear(&f.Gate)
		add(f.Bias, f.Tid2Eid)
		for _, e := range append([]*Expert{&f.Shared}, expertPtrs(f.Experts)...) {
			linear(&e.W1)
			linear(&e.W2)
			linear(&e.W3)
		}
	}
	add(w.Embed)
	linear(&w.Head)
	add(w.Norm)
	hc(&w.HcHead)
	for i := range w.Layers {
		layer(&w.Layers[i])
	}
	for i := range w.MTP {
		m := &w.MTP[i]
		layer(&m.Layer)
		linear(&m.EProj)
		linear(&m.HProj)
		add(m.ENorm, m.HNorm, m.Norm)
		hc(&m.HcHead)
	}
	if ds := w.DSpark; ds != nil {
		for i := range ds.Layers {
			layer(&ds.Layers[i])
		}
		linear(&ds.MainProj)
		add(ds.MainNorm, ds.Norm)
		hc(&ds.HcHead)
		linear(&ds.MarkovW1)
		linear(&ds.MarkovW2)
		linear(&ds.Confidence)
	}
}

func expertPtrs(es []Expert) []*Expert {
	out := make([]*Expert, len(es))
	for i := range es {
		out[i] = &es[i]
	}
	return out
}

// Tensors lists every tensor of w under its checkpoint name: the linears'
// weights and scales in place, and the rest.
func (w *Weights) Tensors() []safetensors.Tensor {
	var out []safetensors.Tensor
	add := func(t safetensors.Tensor) { out = append(out, t) }
	w.Walk(func(l *Linear) {
		for _, t := range []safetensors.Tensor{l.Weight, l.Scale} {
			if t.Valid() {
				add(t)
			}
		}
	}, add)
	return out
}

// Linears lists every linear of w.
func (w *Weights) Linears() []*Linear {
	var out []*Linear
	w.Walk(func(l *Linear) { out = append(out, l) }, func(safetensors.Tensor) {})
	return out
}
