package model

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/megamoe/megamoe/attention"
	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/kvcache"
)

// fillChunk is the rows of one cache-writing op of FillCache.
const fillChunk = 8192

// FillCache puts every one of seqs, empty, at depth tokens without running
// the layers, for benchmarks and tests at long context (a real prefill of a
// million tokens takes minutes). For every attention layer (the MTP block's
// too) it hands the cache-writing ops the model's prefill calls random
// inputs for positions [0, tokens), in order and in chunks: Compress (main
// and indexer compressors) gets random compressor projections A and gates
// Z, NormRopeKVQuant and WriteWindow random wkv rows for the last window. So
// the cache holds what a prefill writes when the projections give those
// values: compressed entries, indexer keys, the compressors' pending state
// and the window ring, in the store's own formats. The same seed on the same
// model gives the same cache. On an error the sequences hold part of it:
// free them.
func (m *Model) FillCache(seqs []*kvcache.Sequence, tokens int, seed uint64) error {
	if tokens < 1 {
		return fmt.Errorf("model: fill cache: %d tokens, want >= 1", tokens)
	}
	if m.sharded() {
		return errors.New("model: fill cache: not on a model split over ranks")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[*kvcache.Sequence]bool{}
	for i, s := range seqs {
		switch {
		case s == nil:
			return fmt.Errorf("model: fill cache: sequence %d is nil", i)
		case seen[s]:
			return fmt.Errorf("model: fill cache: sequence %d appears twice", s.ID)
		case s.Len() != 0:
			return fmt.Errorf("model: fill cache: sequence %d holds %d tokens, want an empty one", s.ID, s.Len())
		}
		seen[s] = true
	}
	if err := m.runCopies(); err != nil {
		return fmt.Errorf("model: fill cache: %w", err)
	}
	for _, s := range seqs {
		if err := m.cache.Reserve(s, tokens); err != nil {
			return fmt.Errorf("model: fill cache: %w", err)
		}
		if m.cache.TakeFresh(s) {
			if err := m.be.ResetSlot(m.store, s.Slot()); err != nil {
				return fmt.Errorf("model: fill cache: %w", err)
			}
		}
	}
	layers := make([]*attention.Layer, 0, len(m.blocks)+1)
	for _, b := range m.blocks {
		layers = append(layers, b.attn)
	}
	if m.mtp != nil {
		layers = append(layers, m.mtp.attn)
	}
	f := &filler{be: m.be, st: m.store, rng: rand.New(rand.NewPCG(seed, 0x66696c6c))}
	for _, l := range layers {
		if err := f.layer(l, seqs, tokens); err != nil {
			return fmt.Errorf("model: fill cache: layer %d: %w", l.Index, err)
		}
	}
	for _, s := range seqs {
		m.cache.Advance(s, tokens)
	}
	return nil
}

// filler writes random but well-formed cache state through backend ops.
type filler struct {
	be  backend.Backend
	st  backend.KVStore
	rng *rand.Rand
}

// random returns a rows×cols F32 tensor of standard normal values.
func (f *filler) random(rows, cols int) (backend.Tensor, error) {
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(f.rng.NormFloat64())
	}
	t := f.be.Alloc(rows, cols, backend.F32)
	if err := f.be.Upload(t, v); err != nil {
		f.be.Free(t)
		return nil, err
	}
	return t, nil
}

// batch is the rows [start, start+rows) of sequence s.
func batch(s *kvcache.Sequence, start, rows int) *backend.Batch {
	bt := &backend.Batch{Seqs: []backend.SeqInfo{{Slot: s.Slot(), Blocks: s.Blocks(), Start: start, Rows: rows}},
		Pos: make([]int32, rows), Seq: make([]int32, rows)}
	for i := range bt.Pos {
		bt.Pos[i] = int32(start + i)
	}
	return bt
}

func (f *filler) layer(l *attention.Layer, seqs []*kvcache.Sequence, tokens int) error {
	if l.Comp != nil {
		if err := f.compress(l, l.Comp, backend.CompressKV, seqs, tokens); err != nil {
			return fmt.Errorf("compressor: %w", err)
		}
	}
	if l.Idx != nil {
		if err := f.compress(l, &l.Idx.Comp, backend.CompressIndex, seqs, tokens); err != nil {
			return fmt.Errorf("indexer compressor: %w", err)
		}
	}
	return f.window(l, seqs, tokens)
}

// compress runs one compressor over positions [0, tokens) of every sequence.
// One random pair of inputs (A, Z) per chunk length serves every chunk of
// that length: before each use, RoPE rotates all its values (in pairs of
// dims, 64-wide heads) in place by angles of the chunk's positions, so that
// no two chunks give the same entries.
func (f *filler) compress(l *attention.Layer, c *attention.Compressor, kind backend.CompressKind, seqs []*kvcache.Sequence, tokens int) error {
	be := f.be
	w := backend.CompressCoff(c.Ratio) * c.Dim
	args := backend.CompressArgs{Layer: l.Index, Kind: kind, Ratio: c.Ratio, Dim: c.Dim, APE: c.APE, Norm: c.Norm, NormEps: l.Eps, Rope: l.Rope}
	spin := backend.RopeArgs{Freqs: l.Rope, HeadDim: l.Rope.Dim()}
	if w%spin.HeadDim != 0 {
		return fmt.Errorf("inputs of width %d are no whole number of %d-wide rope heads", w, spin.HeadDim)
	}
	pools := map[int][]backend.Tensor{} // by rows: A, Z
	defer func() {
		for _, p := range pools {
			freeAll(be, p)
		}
	}()
	for _, s := range seqs {
		for start := 0; start < tokens; start += fillChunk {
			rows := min(fillChunk, tokens-start)
			bt := batch(s, start, rows)
			in := pools[rows]
			for len(in) < 2 {
				t, err := f.random(rows, w)
				if err != nil {
					return err
				}
				in = append(in, t)
				pools[rows] = in
			}
			for _, t := range in {
				if err := be.Rope(t, spin, bt); err != nil {
					return err
				}
			}
			if err := be.Compress(f.st, in[0], in[1], args, bt); err != nil {
				return fmt.Errorf("positions %d..%d: %w", start, start+rows-1, err)
			}
		}
	}
	return nil
}

// window writes the window ring's last entries as the layer's kv epilogue
// (NormRopeKVQuant) makes them from random wkv rows.
func (f *filler) window(l *attention.Layer, seqs []*kvcache.Sequence, tokens int) error {
	be := f.be
	rows := min(l.Window, tokens)
	kv := be.Empty(rows, l.HeadDim, backend.F32)
	defer be.Free(kv)
	for _, s := range seqs {
		kvr, err := f.random(rows, l.HeadDim)
		if err != nil {
			return err
		}
		bt := batch(s, tokens-rows, rows)
		ra := backend.RopeArgs{Freqs: l.Rope, HeadDim: l.HeadDim}
		err = be.NormRopeKVQuant(kvr, l.KVNorm, l.Eps, ra, l.HeadDim-l.RopeDim, 64, bt, kv)
		be.Free(kvr)
		if err == nil {
			err = be.WriteWindow(f.st, l.Index, kv, bt)
		}
		if err != nil {
			return fmt.Errorf("window: %w", err)
		}
	}
	return nil
}

// freeAll frees the non-nil tensors of ts.
func freeAll(be backend.Backend, ts []backend.Tensor) {
	for _, t := range ts {
		if t != nil {
			be.Free(t)
		}
	}
}
