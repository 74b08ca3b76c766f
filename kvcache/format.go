package kvcache

import (
	"fmt"
	"math"

	"github.com/megamoe/megamoe/num"
)

const (
	// EntryScaleBlock is the number of nope values sharing one scale (spec §3.3, KV block 64).
	EntryScaleBlock = 64
	// IndexScaleBlock is the number of index-key values sharing one scale (fp4_act_quant block 32).
	IndexScaleBlock = 32

	entryAlign = 8
	indexAlign = 4
	// nanScale is the e8m0 NaN byte, used for blocks with a non-finite input.
	nanScale = 0xff
	// fp8AmaxFloor is act_quant's amax clamp (spec §3.3).
	fp8AmaxFloor = float32(1e-4)
	inv448       = float32(1.0 / 448)
	inv6         = float32(1.0 / 6)
)

func alignUp(n, a int) int { return (n + a - 1) / a * a }

func ceilDiv(n, d int) int { return (n + d - 1) / d }

// EntryFormat is the compact main KV entry: Nope e4m3 values with one
// power-of-two scale per 64, then Rope bf16 values (layout in the package doc).
type EntryFormat struct {
	Nope, Rope int
}

// NewEntryFormat returns the entry format of a layer with the given head and
// rope dims (checkpoint.Config.HeadDim, RopeDim).
func NewEntryFormat(headDim, ropeDim int) (EntryFormat, error) {
	if ropeDim < 0 || headDim <= ropeDim {
		return EntryFormat{}, fmt.Errorf("kvcache: entry format: head dim %d, rope dim %d", headDim, ropeDim)
	}
	return EntryFormat{Nope: headDim - ropeDim, Rope: ropeDim}, nil
}

// Dim is the number of values of one entry.
func (f EntryFormat) Dim() int { return f.Nope + f.Rope }

// Scales is the number of scale bytes.
func (f EntryFormat) Scales() int { return ceilDiv(f.Nope, EntryScaleBlock) }

// RopeOffset is the byte offset of the bf16 rope values.
func (f EntryFormat) RopeOffset() int { return f.Nope }

// ScaleOffset is the byte offset of the scale bytes.
func (f EntryFormat) ScaleOffset() int { return f.Nope + 2*f.Rope }

// Bytes is the stored size of one entry, padding included.
func (f EntryFormat) Bytes() int { return alignUp(f.ScaleOffset()+f.Scales(), entryAlign) }

// Encode stores x (Dim values) into dst (Bytes bytes): the nope dims are
// rounded as the reference's act_quant simulation (block 64) and the rope dims
// to bf16 (round to nearest even).
func (f EntryFormat) Encode(dst []byte, x []float32) error {
	if len(x) != f.Dim() || len(dst) != f.Bytes() {
		return fmt.Errorf("kvcache: encode entry: %d values into %d bytes, want %d into %d", len(x), len(dst), f.Dim(), f.Bytes())
	}
	sc := dst[f.ScaleOffset():]
	for b := range f.Scales() {
		lo, hi := b*EntryScaleBlock, min(f.Nope, (b+1)*EntryScaleBlock)
		amax, finite := blockAmax(x[lo:hi])
		if !finite {
			sc[b] = nanScale
			clear(dst[lo:hi])
			continue
		}
		// The same fp32 steps as the simulation, so that the scale is identical.
		e := num.CeilLog2(max(amax, fp8AmaxFloor) * inv448)
		s := num.Pow2F32(e)
		sc[b] = uint8(e + 127)
		for i := lo; i < hi; i++ {
			dst[i] = num.F32ToE4M3(x[i] / s) // x/s is exact; F32ToE4M3 clamps to ±448
		}
	}
	num.EncodeBF16(x[f.Nope:], dst[f.RopeOffset():])
	clear(dst[f.ScaleOffset()+f.Scales():])
	return nil
}

// Decode widens an entry stored by Encode into dst (Dim values).
func (f EntryFormat) Decode(dst []float32, src []byte) error {
	if len(dst) != f.Dim() || len(src) != f.Bytes() {
		return fmt.Errorf("kvcache: decode entry: %d bytes into %d values, want %d into %d", len(src), len(dst), f.Bytes(), f.Dim())
	}
	sc := src[f.ScaleOffset():]
	for b := range f.Scales() {
		lo, hi := b*EntryScaleBlock, min(f.Nope, (b+1)*EntryScaleBlock)
		s := scaleF32(sc[b])
		for i := lo; i < hi; i++ {
			dst[i] = num.E4M3Table[src[i]] * s
		}
	}
	num.DecodeBF16(src[f.RopeOffset():f.ScaleOffset()], dst[f.Nope:])
	return nil
}

// IndexKeyFormat is the compact indexer key: Dim e2m1 values with one
// power-of-two scale per 32 (layout in the package doc).
type IndexKeyFormat struct {
	Dim int
}

// NewIndexKeyFormat returns the index-key format for checkpoint.Config.IndexHeadDim.
func NewIndexKeyFormat(dim int) (IndexKeyFormat, error) {
	if dim <= 0 {
		return IndexKeyFormat{}, fmt.Errorf("kvcache: index key format: dim %d", dim)
	}
	return IndexKeyFormat{Dim: dim}, nil
}

// Scales is the number of scale bytes.
func (f IndexKeyFormat) Scales() int { return ceilDiv(f.Dim, IndexScaleBlock) }

// ScaleOffset is the byte offset of the scale bytes.
func (f IndexKeyFormat) ScaleOffset() int { return ceilDiv(f.Dim, 2) }

// Bytes is the stored size of one key, padding included.
func (f IndexKeyFormat) Bytes() int { return alignUp(f.ScaleOffset()+f.Scales(), indexAlign) }

// Encode stores x (Dim values) into dst (Bytes bytes), rounded as the
// reference's fp4_act_quant simulation (block 32, e2m1 ties to the even code).
func (f IndexKeyFormat) Encode(dst []byte, x []float32) error {
	if len(x) != f.Dim || len(dst) != f.Bytes() {
		return fmt.Errorf("kvcache: encode index key: %d values into %d bytes, want %d into %d", len(x), len(dst), f.Dim, f.Bytes())
	}
	clear(dst)
	floor := 6 * num.Pow2F32(-126)
	sc := dst[f.ScaleOffset():]
	for b := range f.Scales() {
		lo, hi := b*IndexScaleBlock, min(f.Dim, (b+1)*IndexScaleBlock)
		amax, finite := blockAmax(x[lo:hi])
		if !finite {
			sc[b] = nanScale
			continue
		}
		e := num.CeilLog2(max(amax, floor) * inv6)
		s := num.Pow2F32(e)
		sc[b] = uint8(e + 127)
		for i := lo; i < hi; i++ {
			dst[i/2] |= num.F32ToE2M1(x[i]/s) << (4 * uint(i&1))
		}
	}
	return nil
}

// Decode widens a key stored by Encode into dst (Dim values).
func (f IndexKeyFormat) Decode(dst []float32, src []byte) error {
	if len(dst) != f.Dim || len(src) != f.Bytes() {
		return fmt.Errorf("kvcache: decode index key: %d bytes into %d values, want %d into %d", len(src), len(dst), f.Bytes(), f.Dim)
	}
	sc := src[f.ScaleOffset():]
	for b := range f.Scales() {
		lo, hi := b*IndexScaleBlock, min(f.Dim, (b+1)*IndexScaleBlock)
		s := scaleF32(sc[b])
		for i := lo; i < hi; i++ {
			dst[i] = num.E2M1Table[src[i/2]>>(4*uint(i&1))&0xf] * s
		}
	}
	return nil
}

// blockAmax returns max |x| and whether every value is finite. The simulation
// turns a block with a NaN or an infinity into NaNs (its scale becomes +Inf),
// so such a block needs no amax.
func blockAmax(x []float32) (float32, bool) {
	var m float32
	for _, v := range x {
		a := float32(math.Abs(float64(v)))
		if a > math.MaxFloat32 || a != a {
			return 0, false
		}
		m = max(m, a)
	}
	return m, true
}

// scaleF32 decodes an e8m0 scale byte; the NaN byte yields NaN, so the whole
// block decodes to NaN as in the simulation.
func scaleF32(b uint8) float32 {
	if b == 0 || b == nanScale {
		return num.E8M0ToF32(b)
	}
	return math.Float32frombits(uint32(b) << 23)
}
