package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/kcheck"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/num"
)

// Lightning-indexer geometry of both presets (spec §5.5): 64 heads of 128,
// ratio 4, compact FP4 keys in blocks of 64 entries (256 tokens).
const (
	ixHeads, ixDim, ixRatio, ixPer = 64, 128, 4, 64
)

// ixTopK is index_topk per model.
var ixTopK = map[string]int{"flash": 512, "pro": 1024}

// indexerCase is one decode step of the indexer: batch sequences at depth
// tokens, every row scoring the depth/4 entries of its sequence.
type indexerCase struct {
	depth, batch, topk int
}

// indexerBufs are one case's device buffers.
type indexerBufs struct {
	keys, q, w, seqs, pos, seqOf, blocks, scores, out *cuda.Buffer
	entries, keyBytes                                 int
}

func (b *indexerBufs) free() {
	for _, p := range []*cuda.Buffer{b.keys, b.q, b.w, b.seqs, b.pos, b.seqOf, b.blocks, b.scores, b.out} {
		if p != nil {
			p.Free()
		}
	}
}

// newIndexerBufs uploads random compact keys (blocks of each sequence in a
// shuffled order, as a cache hands them out), FP4-simulated queries and
// bf16 weights, and the batch layout of backend/gpu.
func newIndexerBufs(ctx *cuda.Context, s *cuda.Stream, c indexerCase, rng *rand.Rand) (*indexerBufs, error) {
	f, err := kvcache.NewIndexKeyFormat(ixDim)
	if err != nil {
		return nil, err
	}
	b := &indexerBufs{entries: c.depth / ixRatio, keyBytes: f.Bytes()}
	nb := (b.entries + ixPer - 1) / ixPer
	keys := make([]byte, c.batch*nb*ixPer*b.keyBytes)
	for i := range keys {
		keys[i] = byte(rng.Uint32())
	}
	for k := 0; k < len(keys); k += b.keyBytes { // scales near 1, not NaN
		for j := f.ScaleOffset(); j < f.ScaleOffset()+f.Scales(); j++ {
			keys[k+j] = byte(124 + rng.IntN(6))
		}
	}
	q := make([]float32, c.batch*ixHeads*ixDim)
	for i := range q {
		q[i] = num.E2M1ToF32(byte(rng.IntN(16))) * num.Pow2F32(rng.IntN(4)-2)
	}
	w := make([]float32, c.batch*ixHeads)
	for i := range w {
		w[i] = num.RoundBF16(float32(rng.NormFloat64() * 0.01))
	}
	seqs := make([]int32, 6*c.batch)
	pos, seqOf := make([]int32, c.batch), make([]int32, c.batch)
	blocks := make([]int32, c.batch*nb)
	for i, p := range rng.Perm(len(blocks)) {
		blocks[i] = int32(p)
	}
	for i := range c.batch {
		copy(seqs[6*i:], []int32{int32(i), int32(c.depth - 1), int32(i), 1, int32(i * nb), int32(nb)})
		pos[i], seqOf[i] = int32(c.depth-1), int32(i)
	}
	up := func(dst **cuda.Buffer, data []byte) error {
		if *dst, err = ctx.Alloc(max(len(data), 4)); err != nil {
			return err
		}
		return s.CopyHtoD((*dst).Ptr, data)
	}
	for _, u := range []struct {
		dst  **cuda.Buffer
		data []byte
	}{{&b.keys, keys}, {&b.q, cuda.Bytes(q)}, {&b.w, cuda.Bytes(w)}, {&b.seqs, cuda.Bytes(seqs)}, {&b.pos, cuda.Bytes(pos)},
		{&b.seqOf, cuda.Bytes(seqOf)}, {&b.blocks, cuda.Bytes(blocks)}} {
		if err := up(u.dst, u.data); err != nil {
			b.free()
			return nil, err
		}
	}
	if b.scores, err = ctx.Alloc(4 * max(c.batch*b.entries, 1)); err == nil {
		b.out, err = ctx.Alloc(4 * c.batch * c.topk)
	}
	if err != nil {
		b.free()
		return nil, err
	}
	return b, s.Synchronize()
}

func (b *indexerBufs) scoresOp(s *cuda.Stream, c indexerCase) error {
	return cuda.IndexerScoresF32(s, b.scores.Ptr, b.q.Ptr, b.w.Ptr, b.keys.Ptr, b.seqs.Ptr, b.pos.Ptr, b.seqOf.Ptr, b.blocks.Ptr,
		c.batch, b.entries, ixHeads, ixDim, ixRatio, ixPer, b.keyBytes, true)
}

func (b *indexerBufs) topkOp(s *cuda.Stream, c indexerCase) error {
	return cuda.IndexerTopKF32(s, b.out.Ptr, b.scores.Ptr, b.pos.Ptr, c.batch, b.entries, c.topk, ixRatio)
}

// check compares the selection of the last row with the CPU's rule
// (backend/cpu indexTopK: descending score, ties to the lower index) over the
// scores the GPU wrote.
func (b *indexerBufs) check(s *cuda.Stream, c indexerCase) error {
	row := c.batch - 1
	sc := make([]float32, b.entries)
	got := make([]int32, c.topk)
	if err := s.CopyDtoH(cuda.Bytes(sc), b.scores.Ptr.Add(4*row*b.entries)); err != nil {
		return err
	}
	if err := s.CopyDtoH(cuda.Bytes(got), b.out.Ptr.Add(4*row*c.topk)); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	idx := make([]int32, len(sc))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(x, y int32) int { return cmp.Compare(sc[y], sc[x]) })
	for i, g := range got {
		want := int32(-1)
		if i < len(idx) {
			want = idx[i]
		}
		if g != want {
			return fmt.Errorf("top-k of row %d: slot %d is entry %d, the CPU's rule picks %d", row, i, g, want)
		}
	}
	return nil
}

// indexerRecord is one --json line of the indexer cases.
type indexerRecord struct {
	Kind    string  `json:"kind"` // "indexer"
	Model   string  `json:"model"`
	Part    string  `json:"part"` // scores, topk, or scores+topk
	Context int     `json:"context"`
	Batch   int     `json:"batch"`
	Bytes   int64   `json:"key_bytes"` // index keys, queries and weights read
	Us      float64 `json:"us"`
	GBs     float64 `json:"gbs"`      // Bytes / time
	FloorUs float64 `json:"floor_us"` // Bytes at the copy rate
	Pass    bool    `json:"pass"`
	Err     string  `json:"error,omitempty"`
}

// runIndexerCases times the indexer's decode step (scores, top-k, both)
// at each depth and batch; GB/s counts the keys, queries and weights read
// once, the read floor of bench stack --context.
func runIndexerCases(env *kcheck.Env, model string, depths, batches []int, copyGBs float64, only string, stdout io.Writer, enc *json.Encoder) (failed int, err error) {
	rng := rand.New(rand.NewPCG(env.Seed, 5))
	s := env.S
	for _, depth := range depths {
		for _, batch := range batches {
			c := indexerCase{depth: depth, batch: batch, topk: ixTopK[model]}
			b, err := newIndexerBufs(env.Ctx, s, c, rng)
			if err != nil {
				return failed, fmt.Errorf("indexer at %d tokens, batch %d: %w", depth, batch, err)
			}
			bytes := int64(batch) * (int64(b.entries)*int64(b.keyBytes) + 4*ixHeads*(ixDim+1))
			floor := float64(bytes) / (copyGBs * 1e3)
			if err := b.scoresOp(s, c); err != nil { // the scores top-k alone reads
				b.free()
				return failed, fmt.Errorf("indexer at %d tokens, batch %d: %w", depth, batch, err)
			}
			for _, part := range []struct {
				name string
				run  func() error
			}{
				{"scores", func() error { return b.scoresOp(s, c) }},
				{"topk", func() error { return b.topkOp(s, c) }},
				{"scores+topk", func() error {
					if err := b.scoresOp(s, c); err != nil {
						return err
					}
					return b.topkOp(s, c)
				}},
			} {
				if !matchOnly(only, "indexer "+part.name) {
					continue
				}
				rec := indexerRecord{Kind: "indexer", Model: model, Part: part.name, Context: depth, Batch: batch, Bytes: bytes, FloorUs: floor}
				us, terr := kcheck.Time(env, part.run)
				if terr == nil && part.name != "scores" {
					terr = b.check(s, c)
				}
				rec.Us, rec.Pass = us, terr == nil
				if us > 0 {
					rec.GBs = float64(bytes) / us / 1e3
				}
				status := "PASS"
				if terr != nil {
					rec.Err, status = terr.Error(), "FAIL "+terr.Error()
					failed++
				}
				fmt.Fprintf(stdout, "%-5s indexer    %-12s context %8d batch %2d  entries %7d  %9.1f us %7.0f GB/s (%5.1f%% of copy) %6.1fx floor  %s\n",
					model, part.name, depth, batch, b.entries, us, rec.GBs, 100*rec.GBs/copyGBs, us/floor, status)
				if err := enc.Encode(rec); err != nil {
					b.free()
					return failed, err
				}
			}
			b.free()
		}
	}
	return failed, nil
}

// matchOnly reports whether a case named name runs under --only.
func matchOnly(only, name string) bool { return only == "" || strings.Contains(name, only) }
