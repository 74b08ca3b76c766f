package cuda

import (
	"cmp"
	"fmt"
)

// Launchers of kernels/attn_f32.cu: the KV-store ops of the GPU backend.
// seqs/pos/seqOf/blocks are the device batch layout of backend/gpu (six int32
// fields per sequence: slot, start, row0, rows, block offset, block count).
//
// A store keeps its cache as fp32 or in the compact formats of
// kvcache/format.go (kernels/kvfmt.cuh): an entry of d values is nope e4m3
// codes, d-nope bf16 values and one scale byte per 64 codes, padded to a
// multiple of 8 bytes; an index key of d values is d/2 bytes of e2m1 pairs
// and one scale byte per 32, padded to a multiple of 4.

// entryBytesOK reports whether eb bytes hold a compact entry of d values with
// nope e4m3 codes, 8-byte aligned, as the kernels address it.
func entryBytesOK(d, nope, eb int) bool {
	return nope > 0 && nope <= d && nope%4 == 0 && eb%8 == 0 && eb >= nope+2*(d-nope)+ceilDiv(nope, 64)
}

// indexBytesOK reports whether kb bytes hold a compact index key of d values
// (d % 8 == 0: the indexer decodes one 32-bit code word at a time).
func indexBytesOK(d, kb int) bool { return d > 0 && d%8 == 0 && kb%4 == 0 && kb >= d/2+ceilDiv(d, 32) }

// WriteWindowF32 copies the last w rows of every sequence of kv [rows, d] into
// its ring [slots][w][d] at slot pos mod w (w: the ring's entries, the
// window and the store's slack).
func WriteWindowF32(s *Stream, ring, kv, seqs, seqOf DevicePtr, rows, w, d int) error {
	if rows < 0 || w <= 0 || d <= 0 {
		return fmt.Errorf("cuda: write_window_f32: bad shape rows=%d w=%d d=%d", rows, w, d)
	}
	n := int64(rows) * int64(d)
	if n == 0 {
		return nil
	}
	a := new(Args).Ptr(ring).Ptr(kv).Ptr(seqs).Ptr(seqOf).I32(rows).I32(w).I32(d)
	return launch(s, "attn_f32", "write_window_f32", Dim3{uint32(ceilDiv(int(n), 256)), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// WriteWindowKV8 is WriteWindowF32 into a compact ring [slots][w] of eb-byte
// entries: each row of kv [rows, d] is encoded with nope e4m3 values.
func WriteWindowKV8(s *Stream, ring, kv, seqs, seqOf DevicePtr, rows, w, d, nope, eb int) error {
	if rows < 0 || w <= 0 || d <= 0 || !entryBytesOK(d, nope, eb) {
		return fmt.Errorf("cuda: write_window_kv8: bad shape rows=%d w=%d d=%d nope=%d entry bytes=%d", rows, w, d, nope, eb)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(ring).Ptr(kv).Ptr(seqs).Ptr(seqOf).I32(rows).I32(w).I32(d).I32(nope).I32(eb)
	return launch(s, "attn_f32", "write_window_kv8", Dim3{uint32(ceilDiv(rows, 4)), 1, 1}, Dim3{128, 1, 1}, 0, a)
}

// CompressShape describes one compressor: ratio r, entry width dc, state
// factor c (2 for ratio 4), entries per block, rope dims, kind (0 FP8, 1
// Hadamard+FP4), and Bytes per stored entry: 0 for fp32, else the compact
// entry (kind 0, dc-RopeDim e4m3 values) or index key (kind 1). Rows is the
// state's ring rows per slot (position p at row p mod Rows; 0: C·R).
type CompressShape struct {
	R, Dc, C, Per, RopeDim, Kind, Bytes int
	Rows                                int
	Eps                                 float32
}

// rows is the state's ring rows per slot.
func (sh CompressShape) rows() int {
	if sh.Rows == 0 {
		return sh.C * sh.R
	}
	return sh.Rows
}

// CompressF32 pools every entry the step's rows complete (the row at position
// p completes entry (p+1)/r - 1 when (p+1) % r == 0) into dst
// [blocks][per][dc] (or [blocks][per] compact entries of sh.Bytes, faithful
// only); st{A,Z} is the pre-step state.
func CompressF32(s *Stream, dst, A, Z, ape, stA, stZ, norm, rf32, rf64, seqs, blocks, pos, seqOf DevicePtr, rows int, sh CompressShape, faithful bool) error {
	if rows < 0 || sh.R <= 0 || sh.Dc <= 0 || sh.Dc%32 != 0 || (sh.C != 1 && sh.C != 2) || sh.Per <= 0 || sh.RopeDim > sh.Dc || (sh.Kind == 1 && sh.Dc&(sh.Dc-1) != 0) ||
		sh.rows() < sh.C*sh.R {
		return fmt.Errorf("cuda: compress_f32: bad shape %+v", sh)
	}
	if sh.Bytes != 0 {
		ok := faithful && sh.RopeDim%2 == 0 && entryBytesOK(sh.Dc, sh.Dc-sh.RopeDim, sh.Bytes)
		if sh.Kind == 1 {
			ok = faithful && indexBytesOK(sh.Dc, sh.Bytes)
		}
		if !ok {
			return fmt.Errorf("cuda: compress_f32: compact store of %+v (faithful %v)", sh, faithful)
		}
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(dst).Ptr(A).Ptr(Z).Ptr(ape).Ptr(stA).Ptr(stZ).Ptr(norm).Ptr(rf32).Ptr(rf64).Ptr(seqs).Ptr(blocks).Ptr(pos).Ptr(seqOf).
		I32(sh.R).I32(sh.Dc).I32(sh.C).I32(sh.Per).I32(sh.RopeDim).F32(sh.Eps).I32(sh.Kind).I32(b2i(faithful)).I32(sh.Bytes).I32(sh.rows())
	return launch(s, "attn_f32", "compress_f32", Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 4*sh.Dc, a)
}

// CompressStateF32 writes the post-step compressor state of nseq sequences
// (run after CompressF32, which reads the pre-step state).
func CompressStateF32(s *Stream, stA, stZ, A, Z, ape, seqs DevicePtr, nseq int, sh CompressShape) error {
	if nseq < 0 || sh.R <= 0 || sh.Dc <= 0 || (sh.C != 1 && sh.C != 2) || sh.rows() < sh.C*sh.R {
		return fmt.Errorf("cuda: compress_state_f32: bad shape %+v", sh)
	}
	if nseq == 0 {
		return nil
	}
	n := sh.rows() * sh.C * sh.Dc
	a := new(Args).Ptr(stA).Ptr(stZ).Ptr(A).Ptr(Z).Ptr(ape).Ptr(seqs).I32(sh.R).I32(sh.Dc).I32(sh.C).I32(sh.rows())
	return launch(s, "attn_f32", "compress_state_f32", Dim3{uint32(ceilDiv(n, 256)), uint32(nseq), 1}, Dim3{256, 1, 1}, 0, a)
}

// IndexerScoresF32 writes scores [rows][ld] for the (pos+1)/ratio available
// entries of every row (ld ≥ the largest count). keyBytes is 0 for fp32 keys
// ik [blocks][per][hd], else the size of a compact key. Compact keys in
// faithful numerics at hd 128 and a multiple of 16 heads run on tensor cores
// (indexer_scores_mma, the same scores bit for bit), the rest on
// indexer_scores_f32/kv8.
func IndexerScoresF32(s *Stream, scores, q, w, ik, seqs, pos, seqOf, blocks DevicePtr, rows, ld, heads, hd, ratio, per, keyBytes int, faithful bool) error {
	return indexerScores(s, scores, q, w, ik, seqs, pos, seqOf, blocks, rows, ld, heads, hd, ratio, per, keyBytes, faithful, true)
}

// IndexerScoresSIMT is IndexerScoresF32 on the CUDA-core kernels only (the
// reference of indexer_scores_mma's checks).
func IndexerScoresSIMT(s *Stream, scores, q, w, ik, seqs, pos, seqOf, blocks DevicePtr, rows, ld, heads, hd, ratio, per, keyBytes int, faithful bool) error {
	return indexerScores(s, scores, q, w, ik, seqs, pos, seqOf, blocks, rows, ld, heads, hd, ratio, per, keyBytes, faithful, false)
}

func indexerScores(s *Stream, scores, q, w, ik, seqs, pos, seqOf, blocks DevicePtr, rows, ld, heads, hd, ratio, per, keyBytes int, faithful, mma bool) error {
	if rows < 0 || ld < 0 || heads <= 0 || hd <= 0 || ratio <= 0 || per <= 0 || (keyBytes != 0 && !indexBytesOK(hd, keyBytes)) {
		return fmt.Errorf("cuda: indexer_scores_f32: bad shape rows=%d ld=%d heads=%d hd=%d key bytes=%d", rows, ld, heads, hd, keyBytes)
	}
	if rows == 0 || ld == 0 {
		return nil
	}
	// q of a row must fit in the device's shared memory per block, less the
	// kernel's static koff[].
	maxSmem := s.ctx.dev.SmemOptin - 1024
	name, stride := "indexer_scores_f32", 4*hd
	if keyBytes != 0 {
		name, stride = "indexer_scores_kv8", keyBytes
	}
	a := new(Args).Ptr(scores).Ptr(q).Ptr(w).Ptr(ik).Ptr(seqs).Ptr(pos).Ptr(seqOf).Ptr(blocks).
		I32(ld).I32(heads).I32(hd).I32(ratio).I32(per).I32(stride).I32(b2i(faithful))
	if smem := indexerMMASmem(heads); mma && keyBytes != 0 && faithful && hd == indexerMMADim && heads%16 == 0 && s.ctx.dev.Major >= 8 && smem <= maxSmem && rows <= 1<<31-1 {
		// One block per (row, group of 64-entry tiles), about indexerMMAPerSM
		// blocks an SM in all: a long row is split over the whole device.
		gy := min(ceilDiv(ld, indexerMMATile), max(1, indexerMMAPerSM*s.ctx.dev.SMs/rows), 65535)
		return launch(s, "attn_f32", "indexer_scores_mma", Dim3{uint32(rows), uint32(gy), 1}, Dim3{128, 1, 1}, smem, a)
	}
	smem := indexerScoresSmem(heads, hd)
	if heads > 1<<16 || hd > 1<<16 || smem > maxSmem || rows > 1<<31-1 {
		return fmt.Errorf("cuda: indexer_scores_f32: shape rows=%d heads=%d hd=%d needs %d bytes of shared memory (at most %d)", rows, heads, hd, smem, maxSmem)
	}
	// One block per (row, group of 16-entry tiles): q of the row is staged
	// once per block, so a long row is split over at most about one wave of
	// indexerScoresPerSM blocks on each SM in all, each walking several tiles.
	tiles := ceilDiv(ld, indexerScoresTile)
	gy := min(tiles, max(1, indexerScoresPerSM*s.ctx.dev.SMs/rows))
	return launch(s, "attn_f32", name, Dim3{uint32(rows), uint32(gy), 1}, Dim3{128, 1, 1}, smem, a)
}

// indexer_scores_mma geometry (kernels/attn_f32.cu IXM_*): head dim, entries
// a tile, padded smem row bytes, blocks an SM a step aims for.
const (
	indexerMMADim   = 128
	indexerMMATile  = 64
	indexerMMARow   = 144
	indexerMMAPerSM = 4
)

// indexerMMASmem is indexer_scores_mma's dynamic shared memory: q and a
// tile's key codes, their block exponents, w and the per-(entry, head) terms.
// 37,376 bytes for 64 heads.
func indexerMMASmem(heads int) int {
	return (heads+indexerMMATile)*indexerMMARow + 4*4*(heads+indexerMMATile) + 4*heads + 4*indexerMMATile*(heads+1)
}

const (
	indexerScoresTile  = 16 // IX_TE of attn_f32.cu
	indexerScoresPerSM = 4  // blocks an SM the scores of one step aim for
)

// indexerScoresSmem is indexer_scores_f32's dynamic shared memory: q of a row
// and the keys of a tile at a padded row stride hdp, w, and the tile's
// per-(entry, head) terms. 46656 bytes for 64 heads of 128.
func indexerScoresSmem(heads, hd int) int {
	hd4 := (hd + 3) &^ 3
	hdp := ((hd4 / 4) | 1) * 4
	return 4 * ((heads+indexerScoresTile)*hdp + heads + indexerScoresTile*(heads+1))
}

// TopKMax is the largest top-k IndexerTopKF32 sorts in shared memory.
const TopKMax = 4096

// IndexerTopKF32 writes out [rows][topk] from scores [rows][ld].
func IndexerTopKF32(s *Stream, out, scores, pos DevicePtr, rows, ld, topk, ratio int) error {
	if rows < 0 || topk <= 0 || topk > TopKMax || ratio <= 0 {
		return fmt.Errorf("cuda: indexer_topk_f32: bad shape rows=%d topk=%d", rows, topk)
	}
	if rows == 0 {
		return nil
	}
	p := 1
	for p < topk {
		p *= 2
	}
	a := new(Args).Ptr(out).Ptr(scores).Ptr(pos).I32(ld).I32(topk).I32(ratio).I32(p)
	return launch(s, "attn_f32", "indexer_topk_f32", Dim3{uint32(rows), 1, 1}, Dim3{1024, 1, 1}, 8*p, a)
}

// AttnShape describes one sparse attention call. EntryBytes is 0 when the
// cache (ring, ent) is fp32, else the size of a compact entry of Nope e4m3
// and D-Nope bf16 values. MaxKeys bounds the keys of a row (window and
// compressed part; 0: Window + SelCols) and LiveKeys the keys of a row that
// can hold an entry (the window's positions so far and the available
// compressed entries; 0: MaxKeys); they only steer how the keys are split
// over CTAs. Ring is the window ring's entries per slot (position p at
// entry p mod Ring; 0: Window).
type AttnShape struct {
	Rows, Heads, D, Window, Ratio, Per, SelCols int
	Ring                                        int
	Nope, EntryBytes                            int
	MaxKeys, LiveKeys                           int
	Scale                                       float32
}

// SparseAttnF32 runs sparse MQA with sink into out [rows][heads·d]. part
// holds AttnScratchBytes(s, sh) bytes when that is not zero (the split
// path's partial results).
func SparseAttnF32(s *Stream, out, q, kv, ring, ent, sel, sink, seqs, pos, seqOf, blocks, part DevicePtr, sh AttnShape, faithful bool) error {
	if sh.Rows < 0 || sh.Heads <= 0 || sh.D <= 0 || sh.D%32 != 0 || sh.D > 1024 || sh.Window <= 0 || (sh.Ring != 0 && sh.Ring < sh.Window) || sh.Per <= 0 || ceilDiv(sh.Heads, attnHeads) > 65535 ||
		sh.MaxKeys < 0 || sh.LiveKeys < 0 || (sh.EntryBytes != 0 && !entryBytesOK(sh.D, sh.Nope, sh.EntryBytes)) {
		return fmt.Errorf("cuda: sparse_attn_f32: bad shape %+v", sh)
	}
	if sh.Rows == 0 {
		return nil
	}
	pl, err := s.ctx.planAttn(sh)
	if err != nil {
		return err
	}
	name, es := "f32", 4*sh.D
	if sh.EntryBytes != 0 {
		name, es = "kv8", sh.EntryBytes
	}
	a := new(Args).Ptr(out).Ptr(q).Ptr(kv).Ptr(ring).Ptr(ent).Ptr(sel).I32(sh.SelCols).Ptr(sink).Ptr(seqs).Ptr(pos).Ptr(seqOf).Ptr(blocks).
		I32(sh.Rows).I32(sh.Heads).I32(sh.D).I32(sh.Window).I32(cmp.Or(sh.Ring, sh.Window)).I32(sh.Ratio).I32(sh.Per).I32(sh.Nope).I32(es).F32(sh.Scale).I32(b2i(faithful))
	groups := ceilDiv(sh.Heads, attnHeads)
	smem := 4 * attnHeads * sh.D // the group's q rows
	switch pl.path {
	case PathAttnCluster:
		grid := Dim3{uint32(attnCluster * groups), uint32(sh.Rows), 1}
		return launch(s, "attn_f32", "sparse_attn_split_"+name, grid, Dim3{256, 1, 1}, smem, a)
	case PathAttnSplit:
		if part == 0 {
			return fmt.Errorf("cuda: sparse_attn_dec_%s: %d splits need a partial buffer", name, pl.splits)
		}
		counters, err := s.fixupCounters()
		if err != nil {
			return err
		}
		recs := sh.Rows * groups * pl.splits
		a.Ptr(part).Ptr(part + DevicePtr(4*recs*attnRecord(sh.D))).Ptr(counters).I32(pl.splits)
		grid := Dim3{uint32(pl.splits * groups), uint32(sh.Rows), 1}
		if faithful { // the splits' score maxima first: each split starts from the running max before it
			if err := launch(s, "attn_f32", "sparse_attn_max_"+name, grid, Dim3{256, 1, 1}, smem, a); err != nil {
				return err
			}
		}
		return launch(s, "attn_f32", "sparse_attn_dec_"+name, grid, Dim3{256, 1, 1}, smem, a)
	}
	return launch(s, "attn_f32", "sparse_attn_"+name, Dim3{uint32(sh.Rows), uint32(groups), 1}, Dim3{256, 1, 1}, smem, a)
}

// AttnScratchBytes is the partial buffer SparseAttnF32 needs for sh on s's
// device (0: none): per (row, head group, split) a record of attnRecord
// floats and attnHeads maxima.
func AttnScratchBytes(s *Stream, sh AttnShape) int {
	pl, err := s.ctx.planAttn(sh)
	if err != nil || pl.path != PathAttnSplit {
		return 0
	}
	return 4 * sh.Rows * ceilDiv(sh.Heads, attnHeads) * pl.splits * (attnRecord(sh.D) + attnHeads)
}

// Sparse attention geometry (kernels/attn_f32.cu AT_HG, AT_NC, AT_SMAX): one
// CTA per (row, group of attnHeads heads), or a cluster of attnCluster CTAs
// that split the row's keys, or up to attnMaxSplits CTAs of a plain grid
// that do. attnCTAsPerSM: 256 threads of 128 registers (ptxas), two CTAs an
// SM; a split grid is sized to one such wave.
const (
	attnHeads     = 8
	attnCluster   = 8
	attnMaxSplits = 64
	attnBlock     = 64
	attnCTAsPerSM = 2
	attnRowLive   = 1 // live key blocks a row up to which one CTA per (row, group) runs them (2 measured no faster on the H100)
)

// attnRecord is the floats of a split's partial result: m and l of every
// head of the group, then its unnormalised output rows.
func attnRecord(d int) int { return 2*attnHeads + attnHeads*d }

type attnPlan struct {
	path   Path // PathAttnRow, PathAttnCluster or PathAttnSplit
	splits int  // PathAttnSplit's CTAs per (row, head group)
}

// planAttn picks the sparse attention path of sh (the choice only steers
// speed). One CTA per (row, head group) when those fill the SMs, a row has
// one block of keys, or at most attnRowLive blocks' worth of keys can hold
// an entry (a short context: that CTA skips the empty blocks, where a split
// path pays its faithful max pass, the combine and the barriers for one
// block a CTA). Otherwise the keys are split: over 8-CTA clusters
// or over as many CTAs as one wave of the device holds (at most a block of
// keys each), whichever leaves fewer blocks in a row on one CTA counting
// the cluster grid's waves (the cluster on a tie). A forced path
// (KernelChoice.Attn, AttnSplits) is taken where the device has it.
func (c *Context) planAttn(sh AttnShape) (attnPlan, error) {
	dev, k := c.dev, c.kernelChoice()
	groups := ceilDiv(sh.Heads, attnHeads)
	rg := sh.Rows * groups
	keys := sh.MaxKeys
	if keys == 0 {
		keys = sh.Window + sh.SelCols
	}
	nb := max(1, ceilDiv(keys, attnBlock))
	liveKeys := sh.LiveKeys
	if liveKeys == 0 {
		liveKeys = keys
	}
	live := ceilDiv(liveKeys, attnBlock)
	wave := attnCTAsPerSM * dev.SMs
	clusterOK := dev.Major >= 9 && sh.Rows <= 65535
	splitOK := sh.Rows <= 65535 && rg <= c.fixupSlots()
	splits := min(nb, max(1, wave/max(rg, 1)), attnMaxSplits)
	switch k.Attn {
	case PathAttnRow:
		return attnPlan{path: PathAttnRow}, nil
	case PathAttnCluster:
		if !clusterOK {
			return attnPlan{}, fmt.Errorf("cuda: sparse attention path %q needs sm_90 and at most 65535 rows (device %d.%d, %d rows)", k.Attn, dev.Major, dev.Minor, sh.Rows)
		}
		return attnPlan{path: PathAttnCluster}, nil
	case PathAttnSplit:
		if !splitOK {
			return attnPlan{}, fmt.Errorf("cuda: sparse attention path %q: %d rows x %d head groups exceed the stream's %d counters or 65535 rows", k.Attn, sh.Rows, groups, c.fixupSlots())
		}
		if k.AttnSplits > 0 {
			splits = k.AttnSplits
		}
		return attnPlan{path: PathAttnSplit, splits: splits}, nil
	}
	if rg >= dev.SMs || nb == 1 || live <= attnRowLive || !splitOK {
		return attnPlan{path: PathAttnRow}, nil
	}
	splitCost := ceilDiv(nb, splits)
	if clusterOK && ceilDiv(rg*attnCluster, wave)*ceilDiv(nb, attnCluster) <= splitCost {
		return attnPlan{path: PathAttnCluster}, nil
	}
	if splits < 2 {
		return attnPlan{path: PathAttnRow}, nil
	}
	return attnPlan{path: PathAttnSplit, splits: splits}, nil
}
