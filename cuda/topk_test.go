package cuda_test

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
)

// topKRef is the CPU's selection (backend/cpu indexTopK): the k best of
// scores, descending, ties (-0 equal to +0) to the lower index, -1 padded.
func topKRef(scores []float32, k, topk int) []int32 {
	idx := make([]int32, len(scores))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(x, y int32) int { return cmp.Compare(scores[y], scores[x]) })
	out := make([]int32, topk)
	for i := range out {
		out[i] = -1
		if i < k {
			out[i] = idx[i]
		}
	}
	return out
}

// topKScores fills a row of n scores in one of several regimes: bf16-rounded
// scores with long runs of ties (zeros of both signs, a few repeated values),
// or unrounded fp32 ones (every radix digit pass runs).
func topKScores(rng *rand.Rand, n, regime int) []float32 {
	x := make([]float32, n)
	for i := range x {
		v := float32(rng.NormFloat64())
		switch regime {
		case 0: // bf16, a quarter exact zeros
			v = cpuref.BF16ToF32(cpuref.F32ToBF16(v))
			if rng.IntN(4) == 0 {
				v = 0
				if rng.IntN(2) == 0 {
					v = float32(math.Copysign(0, -1))
				}
			}
		case 1: // few distinct values: ties at the k-th score
			v = float32(rng.IntN(5)) - 1
		case 2: // fp32, distinct low bits
		case 3: // all equal
			v = 0.5
		}
		x[i] = v
	}
	return x
}

// TestIndexerTopKVsCPU: indexer_topk_f32 against the CPU's rule on scores
// written directly (rows of different depths in one launch, output poisoned).
func TestIndexerTopKVsCPU(t *testing.T) {
	ctx, s := gpu(t)
	d := devBufs{t, ctx, s}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 31))
	const ratio = 4
	depths := []int{0, 3, 40, 700, 5000}
	if testing.Short() {
		depths = []int{0, 3, 40, 700}
	}
	for _, topk := range []int{1, 12, 512} {
		for regime := range 4 {
			t.Run(fmt.Sprintf("topk%d_regime%d", topk, regime), func(t *testing.T) {
				rows := len(depths)
				ld := slices.Max(depths)
				pos := make([]int32, rows)
				sc := make([]float32, rows*ld)
				for r, n := range depths {
					pos[r] = int32(n*ratio + rng.IntN(ratio) - 1) // sees n entries
					if n == 0 {
						pos[r] = int32(rng.IntN(ratio - 1))
					}
					copy(sc[r*ld:], topKScores(rng, n, regime))
					for j := n; j < ld; j++ {
						sc[r*ld+j] = float32(math.NaN()) // past the available entries: never read
					}
				}
				out := d.poisonedIDs(rows * topk)
				if err := cuda.IndexerTopKF32(s, out, d.up(sliceBytes(sc)), d.up(sliceBytes(pos)), rows, ld, topk, ratio); err != nil {
					t.Fatal(err)
				}
				got := d.ids(out, rows*topk)
				for r, n := range depths {
					want := topKRef(sc[r*ld:r*ld+n], min(n, topk), topk)
					if g := got[r*topk : (r+1)*topk]; !slices.Equal(g, want) {
						t.Errorf("row %d (%d entries): got %v\nwant %v", r, n, g, want)
					}
				}
			})
		}
	}
}
