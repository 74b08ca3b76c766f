package synth

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/safetensors"
)

// Tensors lists every tensor of w under its checkpoint name.
func Tensors(w *checkpoint.Weights) []safetensors.Tensor {
	var out []safetensors.Tensor
	add := func(ts ...safetensors.Tensor) {
		for _, t := range ts {
			if t.Valid() {
				out = append(out, t)
			}
		}
	}
	lin := func(l *checkpoint.Linear) { add(l.Weight, l.Scale) }
	hc := func(h *checkpoint.HC) { add(h.Fn, h.Base, h.Scale) }
	comp := func(c *checkpoint.Compressor) {
		lin(&c.WKV)
		lin(&c.WGate)
		add(c.APE, c.Norm)
	}
	layer := func(l *checkpoint.Layer) {
		hc(&l.HcAttn)
		hc(&l.HcFFN)
		add(l.AttnNorm, l.FFNNorm, l.Attn.Sink, l.Attn.QNorm, l.Attn.KVNorm)
		for _, p := range []*checkpoint.Linear{&l.Attn.WqA, &l.Attn.WqB, &l.Attn.WKV, &l.Attn.WoA, &l.Attn.WoB} {
			lin(p)
		}
		if l.Attn.Compressor != nil {
			comp(l.Attn.Compressor)
		}
		if ix := l.Attn.Indexer; ix != nil {
			lin(&ix.WqB)
			lin(&ix.WeightsProj)
			comp(&ix.Compressor)
		}
		lin(&l.FFN.Gate)
		add(l.FFN.Bias, l.FFN.Tid2Eid)
		for _, e := range append([]checkpoint.Expert{l.FFN.Shared}, l.FFN.Experts...) {
			lin(&e.W1)
			lin(&e.W2)
			lin(&e.W3)
		}
	}
	add(w.Embed)
	lin(&w.Head)
	add(w.Norm)
	hc(&w.HcHead)
	for i := range w.Layers {
		layer(&w.Layers[i])
	}
	for i := range w.MTP {
		m := &w.MTP[i]
		layer(&m.Layer)
		lin(&m.EProj)
		lin(&m.HProj)
		add(m.ENorm, m.HNorm, m.Norm)
		hc(&m.HcHead)
	}
	return out
}

// Save writes w as a checkpoint directory (config.json + model.safetensors).
func Save(dir string, w *checkpoint.Weights) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg, err := json.MarshalIndent(w.Config, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		return err
	}
	wr := safetensors.NewWriter()
	for _, t := range Tensors(w) {
		if err := wr.Add(t.Name, t.DType, t.Shape, t.Data); err != nil {
			return fmt.Errorf("synth save: %w", err)
		}
	}
	return wr.WriteFile(filepath.Join(dir, "model.safetensors"), nil)
}
