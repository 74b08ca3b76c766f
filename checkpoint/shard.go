package checkpoint

import (
	"errors"
	"fmt"
	"slices"

	"github.com/megamoe/megamoe/safetensors"
)

// Part is one rank's slice of a model split over Size ranks.
type Part struct {
	Rank, Size         int
	ExpertLo, ExpertHi int // routed experts [lo, hi) this rank holds (global ids)
	VocabLo, VocabHi   int // head rows (vocabulary ids) this rank computes
}

// Shard returns rank's slice of w for size ranks, following DeepSeek's
// inference/convert.py: attention is tensor parallel over heads (wq_b rows,
// attn_sink) and output groups (wo_a rows, wo_b columns), the routed experts
// are expert parallel, and the head is split over the vocabulary. Everything
// else is replicated. Deliberate deviation: the embedding and the lightning
// indexer stay whole, so every rank embeds its tokens and selects the same
// top-k blocks without a collective.
//
// The result has its own Config with Heads and OGroups divided by size (the
// router and the token ids stay global) and shares every unsplit tensor with
// w. Row slices are views of w's data, column slices are copies; w itself is
// never modified (its data may be a read-only mmap).
func Shard(w *Weights, rank, size int) (*Weights, error) {
	if w == nil || w.Config == nil {
		return nil, errors.New("shard: nil weights or config")
	}
	if p := w.Part; p != nil {
		return nil, fmt.Errorf("shard: weights are already rank %d of %d (re-sharding is not supported)", p.Rank, p.Size)
	}
	if size < 1 {
		return nil, fmt.Errorf("shard: size = %d, want >= 1", size)
	}
	if rank < 0 || rank >= size {
		return nil, fmt.Errorf("shard: rank = %d outside [0, %d)", rank, size)
	}
	c := w.Config
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{{"Heads", c.Heads}, {"OGroups", c.OGroups}, {"Experts", c.Experts}, {"Vocab", c.Vocab}} {
		if f.v%size != 0 {
			errs = append(errs, fmt.Errorf("shard: %s = %d not divisible by size %d", f.name, f.v, size))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	ne, nv := c.Experts/size, c.Vocab/size
	p := &Part{Rank: rank, Size: size, ExpertLo: rank * ne, ExpertHi: (rank + 1) * ne,
		VocabLo: rank * nv, VocabHi: (rank + 1) * nv}
	out := *w
	out.Part = p
	if size == 1 {
		return &out, nil
	}

	nc := *c
	nc.CompressRatios = slices.Clone(c.CompressRatios)
	nc.Heads, nc.OGroups = c.Heads/size, c.OGroups/size
	out.Config = &nc
	out.Layers = slices.Clone(w.Layers)
	out.MTP = slices.Clone(w.MTP)
	for i := range out.Layers {
		if err := shardLayer(&out.Layers[i], c, p); err != nil {
			return nil, err
		}
	}
	for i := range out.MTP {
		if err := shardLayer(&out.MTP[i].Layer, c, p); err != nil {
			return nil, err
		}
	}
	var err error
	if out.Head, err = cutLinear(w.Head, true, p.VocabLo, p.VocabHi); err != nil {
		return nil, err
	}
	return &out, nil
}

// shardLayer replaces the split tensors of l (a copy) with rank p's slices;
// c is the unsharded config.
func shardLayer(l *Layer, c *Config, p *Part) error {
	a, r := &l.Attn, p.Rank
	hl, gl := c.Heads/p.Size, c.OGroups/p.Size
	q, o := hl*c.HeadDim, gl*c.OLoraRank
	var err error
	if a.WqB, err = cutLinear(a.WqB, true, r*q, (r+1)*q); err != nil {
		return err
	}
	if a.Sink, err = cutVector(a.Sink, c.Heads, r*hl, (r+1)*hl); err != nil {
		return fmt.Errorf("shard %s: %w", a.Sink.Name, err)
	}
	if a.WoA, err = cutLinear(a.WoA, true, r*o, (r+1)*o); err != nil {
		return err
	}
	if a.WoB, err = cutLinear(a.WoB, false, r*o, (r+1)*o); err != nil {
		return err
	}
	if n := len(l.FFN.Experts); n != c.Experts {
		return fmt.Errorf("shard layer %d: %d routed experts, config says %d", l.Index, n, c.Experts)
	}
	// A new slice, so appending to one rank's experts cannot touch w's.
	l.FFN.Experts = slices.Clone(l.FFN.Experts[p.ExpertLo:p.ExpertHi])
	return nil
}

// cutLinear returns rows (byRows) or columns [lo, hi) of l. FP8 block
// linears must be cut on their 128×128 scale blocks; FP4 linears (routed
// experts) are only ever distributed whole.
func cutLinear(l Linear, byRows bool, lo, hi int) (Linear, error) {
	s, err := cutLinear1(l, byRows, lo, hi)
	if err != nil {
		return Linear{}, fmt.Errorf("shard %s: %w", l.Name, err)
	}
	return s, nil
}

func cutLinear1(l Linear, byRows bool, lo, hi int) (Linear, error) {
	axis, n, block := "columns", l.In, "wide"
	if byRows {
		axis, n, block = "rows", l.Out, "tall"
	}
	if lo < 0 || lo >= hi || hi > n {
		return l, fmt.Errorf("%s [%d, %d) outside [0, %d)", axis, lo, hi, n)
	}
	var es int
	switch l.Format {
	case FormatBF16:
		es = 2
	case FormatF32:
		es = 4
	case FormatFP8Block:
		es = 1
		if lo%128 != 0 || (hi%128 != 0 && hi != n) {
			return l, fmt.Errorf("%s [%d, %d) not aligned to the 128-%s scale blocks", axis, lo, hi, block)
		}
		var err error
		l.Scale, err = cutMatrix(l.Scale, 1, ceilDiv(l.Out, 128), ceilDiv(l.In, 128), byRows, lo/128, ceilDiv(hi, 128))
		if err != nil {
			return l, err
		}
	default:
		return l, fmt.Errorf("%s linears are never sliced (routed experts are distributed whole)", l.Format)
	}
	var err error
	if l.Weight, err = cutMatrix(l.Weight, es, l.Out, l.In, byRows, lo, hi); err != nil {
		return l, err
	}
	if byRows {
		l.Out = hi - lo
	} else {
		l.In = hi - lo
	}
	return l, nil
}

// cutMatrix returns rows or columns [lo, hi) of t, a row-major [rows, cols]
// matrix of es-byte elements. Rows are contiguous, so they are a view (capped,
// so an append cannot write into the mapping); columns are copied.
func cutMatrix(t safetensors.Tensor, es, rows, cols int, byRows bool, lo, hi int) (safetensors.Tensor, error) {
	if t.DType.Size() != es || len(t.Data) != rows*cols*es {
		return t, fmt.Errorf("tensor %s is %s %v (%d bytes), want %d-byte elements [%d, %d]",
			t.Name, t.DType, t.Shape, len(t.Data), es, rows, cols)
	}
	stride := cols * es
	if byRows {
		t.Data = t.Data[lo*stride : hi*stride : hi*stride]
		t.Shape = []int{hi - lo, cols}
		return t, nil
	}
	data := make([]byte, 0, rows*(hi-lo)*es)
	for r := range rows {
		data = append(data, t.Data[r*stride+lo*es:r*stride+hi*es]...)
	}
	t.Data, t.Shape = data, []int{rows, hi - lo}
	return t, nil
}

// cutVector returns elements [lo, hi) of t, an f32 vector of n elements.
func cutVector(t safetensors.Tensor, n, lo, hi int) (safetensors.Tensor, error) {
	if t.DType != safetensors.F32 || t.Numel() != n || len(t.Data) != 4*n {
		return t, fmt.Errorf("tensor is %s %v (%d bytes), want F32 [%d]", t.DType, t.Shape, len(t.Data), n)
	}
	if lo < 0 || lo >= hi || hi > n {
		return t, fmt.Errorf("elements [%d, %d) outside [0, %d)", lo, hi, n)
	}
	t.Data = t.Data[4*lo : 4*hi : 4*hi]
	t.Shape = []int{hi - lo}
	return t, nil
}
