package cpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/kvcache"
)

// layerFormat is the compact encoding of one layer's entries and index keys
// (KVSpec.Compact): window slots and compressed entries as kvcache.EntryFormat,
// index keys as kvcache.IndexKeyFormat. Writes encode (which applies the FP8
// and FP4 rounding itself, so a compact store holds rounded values in either
// numerics); reads decode only the entries an op touches.
type layerFormat struct {
	entry kvcache.EntryFormat
	index kvcache.IndexKeyFormat // Dim 0: no indexer
}

// compactFormats returns the per-layer formats of a compact spec, nil for an fp32 one.
func compactFormats(spec backend.KVSpec) ([]layerFormat, error) {
	if !spec.Compact {
		return nil, nil
	}
	fs := make([]layerFormat, len(spec.Layers))
	for i, l := range spec.Layers {
		e, err := kvcache.NewEntryFormat(l.HeadDim, l.RopeDim)
		if err != nil {
			return nil, fmt.Errorf("kv store: layer %d: %w", i, err)
		}
		fs[i].entry = e
		if l.IndexDim > 0 {
			if fs[i].index, err = kvcache.NewIndexKeyFormat(l.IndexDim); err != nil {
				return nil, fmt.Errorf("kv store: layer %d: %w", i, err)
			}
		}
	}
	return fs, nil
}

// loc finds compressed entry j of a layer: its block's storage and its index there.
func (k *kvStore) loc(sq *backend.SeqInfo, layer, j int) (*blockLayer, int, error) {
	per := k.spec.BlockTokens / k.spec.Layers[layer].Ratio
	bi := j / per
	if bi >= len(sq.Blocks) {
		return nil, 0, fmt.Errorf("kv store: entry %d of layer %d beyond %d reserved blocks", j, layer, len(sq.Blocks))
	}
	bd, err := k.block(sq.Blocks[bi])
	if err != nil {
		return nil, 0, err
	}
	return &bd.layers[layer], j % per, nil
}

// entryBytes returns the stored bytes of compressed entry j (index key when idx) of a compact store.
func (k *kvStore) entryBytes(sq *backend.SeqInfo, layer, j int, idx bool) ([]byte, error) {
	bl, o, err := k.loc(sq, layer, j)
	if err != nil {
		return nil, err
	}
	if idx {
		n := k.fmts[layer].index.Bytes()
		return bl.ikC[o*n : (o+1)*n], nil
	}
	n := k.fmts[layer].entry.Bytes()
	return bl.kvC[o*n : (o+1)*n], nil
}

// readEntry returns the values of compressed entry j: the stored slice of an
// fp32 store, or the entry decoded into buf (its width) for a compact one.
func (k *kvStore) readEntry(sq *backend.SeqInfo, layer, j int, idx bool, buf []float32) ([]float32, error) {
	if k.fmts == nil {
		return k.entry(sq, layer, j, idx)
	}
	src, err := k.entryBytes(sq, layer, j, idx)
	if err != nil {
		return nil, err
	}
	if idx {
		err = k.fmts[layer].index.Decode(buf, src)
	} else {
		err = k.fmts[layer].entry.Decode(buf, src)
	}
	if err != nil {
		return nil, fmt.Errorf("kv store: layer %d entry %d: %w", layer, j, err)
	}
	return buf, nil
}

// writeEntry stores x as compressed entry j (index key when idx).
func (k *kvStore) writeEntry(sq *backend.SeqInfo, layer, j int, idx bool, x []float32) error {
	if k.fmts == nil {
		dst, err := k.entry(sq, layer, j, idx)
		if err != nil {
			return err
		}
		copy(dst, x)
		return nil
	}
	dst, err := k.entryBytes(sq, layer, j, idx)
	if err != nil {
		return err
	}
	if idx {
		err = k.fmts[layer].index.Encode(dst, x)
	} else {
		err = k.fmts[layer].entry.Encode(dst, x)
	}
	if err != nil {
		return fmt.Errorf("kv store: layer %d entry %d: %w", layer, j, err)
	}
	return nil
}

// ringSlot returns window slot i of a layer's ring in a compact store.
func (k *kvStore) ringSlot(ls *layerState, layer, i int) []byte {
	n := k.fmts[layer].entry.Bytes()
	return ls.winC[i*n : (i+1)*n]
}

// readRing returns the ring's values for position p: the stored slice of an
// fp32 store, or the slot decoded into buf for a compact one.
func (k *kvStore) readRing(ls *layerState, layer, p int, buf []float32) ([]float32, error) {
	l := k.spec.Layers[layer]
	i := p % k.spec.RingLen(layer)
	if k.fmts == nil {
		return ls.win[i*l.HeadDim : (i+1)*l.HeadDim], nil
	}
	if err := k.fmts[layer].entry.Decode(buf, k.ringSlot(ls, layer, i)); err != nil {
		return nil, fmt.Errorf("kv store: layer %d window position %d: %w", layer, p, err)
	}
	return buf, nil
}

// writeRing stores x as the ring's entry for position p.
func (k *kvStore) writeRing(ls *layerState, layer, p int, x []float32) error {
	l := k.spec.Layers[layer]
	i := p % k.spec.RingLen(layer)
	if k.fmts == nil {
		copy(ls.win[i*l.HeadDim:(i+1)*l.HeadDim], x)
		return nil
	}
	if err := k.fmts[layer].entry.Encode(k.ringSlot(ls, layer, i), x); err != nil {
		return fmt.Errorf("kv store: layer %d window position %d: %w", layer, p, err)
	}
	return nil
}

// decodeBufs hands out one row's decode buffers of width dim; for an fp32
// store (reads return stored slices) it hands out nil.
type decodeBufs struct {
	buf    []float32
	n, dim int
	on     bool
}

// reset makes room for up to slots buffers.
func (d *decodeBufs) reset(slots, dim int) {
	d.n, d.dim = 0, dim
	if d.on && len(d.buf) < slots*dim {
		d.buf = make([]float32, slots*dim)
	}
}

func (d *decodeBufs) next() []float32 {
	if !d.on {
		return nil
	}
	s := d.buf[d.n*d.dim : (d.n+1)*d.dim : (d.n+1)*d.dim]
	d.n++
	return s
}
