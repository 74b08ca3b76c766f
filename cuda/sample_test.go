package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
)

// sampleLogits makes rows of logits with NaN, -inf and exact ties sprinkled in
// (and some rows with a shared maximum).
func sampleLogits(rng *rand.Rand, rows, vocab int) []float32 {
	x := make([]float32, rows*vocab)
	for r := 0; r < rows; r++ {
		row := x[r*vocab : (r+1)*vocab]
		scale := 1 + 3*rng.Float64()
		for i := range row {
			row[i] = float32(rng.NormFloat64() * scale)
			switch rng.IntN(300) {
			case 0:
				row[i] = float32(math.NaN())
			case 1:
				row[i] = float32(math.Inf(-1))
			case 2, 3:
				if i > 0 {
					row[i] = row[rng.IntN(i)]
				}
			}
		}
		switch r % 8 {
		case 3: // tied maximum
			a, b := rng.IntN(vocab), rng.IntN(vocab)
			row[a], row[b] = 40, 40
		case 5: // all NaN / -inf
			if vocab <= 1000 {
				for i := range row {
					row[i] = float32(math.Inf(-1))
					if i%3 == 0 {
						row[i] = float32(math.NaN())
					}
				}
			}
		}
	}
	return x
}

func sliceBytes[T int32 | uint32 | float32](v []T) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// devBufs uploads host slices and frees them at cleanup.
type devBufs struct {
	t   *testing.T
	ctx *cuda.Context
	s   *cuda.Stream
}

func (d devBufs) up(b []byte) cuda.DevicePtr {
	d.t.Helper()
	buf, err := d.ctx.Alloc(max(len(b), 4))
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(buf.Free)
	if len(b) > 0 {
		if err := d.s.CopyHtoD(buf.Ptr, b); err != nil {
			d.t.Fatal(err)
		}
	}
	return buf.Ptr
}

// poisonedIDs allocates rows int32 set to -7.
func (d devBufs) poisonedIDs(rows int) cuda.DevicePtr {
	d.t.Helper()
	p := d.up(make([]byte, 4*rows))
	if err := d.s.Memset32(p, uint32(0xfffffff9), rows); err != nil { // -7
		d.t.Fatal(err)
	}
	return p
}

func (d devBufs) ids(p cuda.DevicePtr, rows int) []int32 {
	d.t.Helper()
	out := make([]int32, rows)
	if err := d.s.CopyDtoH(sliceBytes(out), p); err != nil {
		d.t.Fatal(err)
	}
	if err := d.s.Synchronize(); err != nil {
		d.t.Fatal(err)
	}
	return out
}

// TestSampleGreedyVsCPU: sample_draw's greedy rows (temp 0: the argmax, NaN
// as -inf, ties to the lowest id) against the twin, from one token up.
func TestSampleGreedyVsCPU(t *testing.T) {
	ctx, s := gpu(t)
	d := devBufs{t, ctx, s}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	for _, vocab := range []int{1, 1000, 129280} {
		for _, rows := range []int{1, 7, 64} {
			t.Run(fmt.Sprintf("rows%d_vocab%d", rows, vocab), func(t *testing.T) {
				x := sampleLogits(rng, rows, vocab)
				zf, zi, u := make([]float32, rows), make([]int32, rows), make([]float32, rows)
				for r := range u {
					u[r] = cuda.Uniform32(rng.Float64())
				}
				ids := d.poisonedIDs(rows)
				z, zk := d.up(sliceBytes(zf)), d.up(sliceBytes(zi))
				if err := cuda.SampleDraw(s, ids, d.up(sliceBytes(x)), z, zk, z, z, d.up(sliceBytes(u)), 0, rows, vocab); err != nil {
					t.Fatal(err)
				}
				got, want := d.ids(ids, rows), cpuref.SampleDraw(x, rows, vocab, zf, zi, zf, zf, u)
				for r := range got {
					if got[r] != want[r] {
						t.Errorf("row %d: got %d, want %d", r, got[r], want[r])
					}
				}
			})
		}
	}
}

// TestSampleDrawVsCPU runs every (temp, top_k, top_p, min_p) of the grid,
// spread over the rows of each shape, against the twin. The twin is exact
// (integer masses); a mismatch is tolerated only where the twin's margin to a
// threshold is below 1e-5 (reported), which covers a last-bit difference of
// the double exp between CUDA and Go.
func TestSampleDrawVsCPU(t *testing.T) {
	ctx, s := gpu(t)
	d := devBufs{t, ctx, s}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 4))
	temps := []float32{0.3, 1, 2}
	topKs := []int32{0, 1, 50, 4096}
	topPs := []float32{0, 0.5, 0.95}
	minPs := []float32{0, 0.05}
	type combo struct {
		T      float32
		k      int32
		tp, mp float32
	}
	var grid []combo
	for _, T := range temps {
		for _, k := range topKs {
			for _, tp := range topPs {
				for _, mp := range minPs {
					grid = append(grid, combo{T, k, tp, mp})
				}
			}
		}
	}
	next := 0
	for _, vocab := range []int{1000, 129280} {
		for _, rows := range []int{1, 7, 64} {
			for rep := 0; rep < 2; rep++ {
				t.Run(fmt.Sprintf("rows%d_vocab%d_%d", rows, vocab, rep), func(t *testing.T) {
					x := sampleLogits(rng, rows, vocab)
					temp, topP, minP, u := make([]float32, rows), make([]float32, rows), make([]float32, rows), make([]float32, rows)
					topK := make([]int32, rows)
					for r := 0; r < rows; r++ {
						c := grid[next%len(grid)]
						next++
						temp[r], topK[r], topP[r], minP[r] = c.T, c.k, c.tp, c.mp
						u[r] = cuda.Uniform32(rng.Float64())
						if r%16 == 9 {
							temp[r] = 0 // greedy rows in the mix
						}
					}
					ids := d.poisonedIDs(rows)
					err := cuda.SampleDraw(s, ids, d.up(sliceBytes(x)), d.up(sliceBytes(temp)), d.up(sliceBytes(topK)),
						d.up(sliceBytes(topP)), d.up(sliceBytes(minP)), d.up(sliceBytes(u)), 0, rows, vocab)
					if err != nil {
						t.Fatal(err)
					}
					got := d.ids(ids, rows)
					want, margin := cpuref.SampleDrawMargin(x, rows, vocab, temp, topK, topP, minP, u)
					skipped := 0
					for r := range got {
						if got[r] == want[r] {
							continue
						}
						if margin[r] < 1e-5 {
							skipped++
							continue
						}
						t.Errorf("row %d (T=%v k=%d top_p=%v min_p=%v u=%v): got %d, want %d (margin %.3g)",
							r, temp[r], topK[r], topP[r], minP[r], u[r], got[r], want[r], margin[r])
					}
					if skipped > 0 {
						t.Logf("%d of %d rows differ within 1e-5 of a threshold (tolerated)", skipped, rows)
					}
				})
			}
		}
	}
}

// randomMask allows each token with probability density, and at least one.
func randomMask(rng *rand.Rand, vocab int, density float64) []uint32 {
	m := make([]uint32, cuda.SampleMaskWords(vocab))
	for i := range vocab {
		if rng.Float64() < density {
			m[i>>5] |= 1 << (i & 31)
		}
	}
	one := rng.IntN(vocab)
	m[one>>5] |= 1 << (one & 31)
	return m
}

// TestSampleMaskedVsCPU: with an allow mask (structured outputs), every row
// draws an allowed token, the one the twin draws from the logits with the
// disallowed tokens set to -inf (within the twin's margin), for masks from a
// single token to nearly all, under greedy and sampled rules.
func TestSampleMaskedVsCPU(t *testing.T) {
	ctx, s := gpu(t)
	d := devBufs{t, ctx, s}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	densities := []float64{0, 0.001, 0.05, 0.5, 1}
	type rule struct {
		T      float32
		k      int32
		tp, mp float32
	}
	rules := []rule{{0, 0, 0, 0}, {1, 0, 0, 0}, {0.7, 0, 0.9, 0}, {1.5, 40, 0, 0.02}, {2, 0, 0, 0.1}}
	for _, vocab := range []int{1000, 129280} {
		t.Run(fmt.Sprintf("vocab%d", vocab), func(t *testing.T) {
			rows := len(densities) * 2
			x := sampleLogits(rng, rows, vocab)
			words := cuda.SampleMaskWords(vocab)
			mask := make([]uint32, 0, rows*words)
			temp, topP, minP, u := make([]float32, rows), make([]float32, rows), make([]float32, rows), make([]float32, rows)
			topK := make([]int32, rows)
			for r := range rows {
				mask = append(mask, randomMask(rng, vocab, densities[r%len(densities)])...)
				c := rules[(r+r/len(densities))%len(rules)]
				temp[r], topK[r], topP[r], minP[r], u[r] = c.T, c.k, c.tp, c.mp, cuda.Uniform32(rng.Float64())
			}
			ids := d.poisonedIDs(rows)
			err := cuda.SampleDraw(s, ids, d.up(sliceBytes(x)), d.up(sliceBytes(temp)), d.up(sliceBytes(topK)),
				d.up(sliceBytes(topP)), d.up(sliceBytes(minP)), d.up(sliceBytes(u)), d.up(sliceBytes(mask)), rows, vocab)
			if err != nil {
				t.Fatal(err)
			}
			got := d.ids(ids, rows)
			masked := append([]float32(nil), x...)
			for r := range rows {
				cpuref.SampleMask(masked[r*vocab:(r+1)*vocab], mask[r*words:(r+1)*words])
			}
			want, margin := cpuref.SampleDrawMargin(masked, rows, vocab, temp, topK, topP, minP, u)
			for r := range got {
				if id := got[r]; id < 0 || int(id) >= vocab || mask[r*words+int(id)>>5]>>(id&31)&1 == 0 {
					// A row whose allowed logits are all NaN or -inf draws 0, as unmasked.
					if !(id == 0 && want[r] == 0) {
						t.Errorf("row %d: drew %d, which the mask disallows", r, id)
					}
				}
				if got[r] != want[r] && margin[r] >= 1e-5 {
					t.Errorf("row %d (T=%v k=%d top_p=%v min_p=%v, density %v): got %d, want %d (margin %.3g)",
						r, temp[r], topK[r], topP[r], minP[r], densities[r%len(densities)], got[r], want[r], margin[r])
				}
			}
		})
	}
}

func TestSampleLaunchErrors(t *testing.T) {
	ctx, s := gpu(t)
	d := devBufs{t, ctx, s}
	p := d.up(make([]byte, 64))
	if err := cuda.SampleDraw(s, p, p, p, p, p, p, p, 0, 1, 0); err == nil {
		t.Error("vocab 0 accepted")
	}
	if err := cuda.SampleDraw(s, p, p, p, p, p, 0, p, 0, 1, 10); err == nil {
		t.Error("nil min_p accepted")
	}
	if err := cuda.SampleDraw(s, p, p, p, p, p, p, p, 0, 0, 10); err != nil {
		t.Errorf("rows 0: %v", err)
	}
}

func TestUniform32(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want float32
	}{{0, 0}, {0.5, 0.5}, {math.Nextafter(1, 0), math.Nextafter32(1, 0)}, {math.NaN(), 0}} {
		if got := cuda.Uniform32(tc.in); got != tc.want || got >= 1 {
			t.Errorf("Uniform32(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestAddArgmaxVsCPU: add_argmax (a row, lda floats apart, plus a bias row,
// summed in fp32, then the greedy rule) against the twin's greedy draw of
// the sums; stride_i32 picks every stride-th id.
func TestAddArgmaxVsCPU(t *testing.T) {
	ctx, s := gpu(t)
	d := devBufs{t, ctx, s}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	for _, tc := range []struct{ rows, vocab, stride int }{{1, 1, 1}, {3, 1000, 4}, {7, 129280, 2}, {64, 1000, 1}} {
		t.Run(fmt.Sprintf("rows%d_vocab%d_stride%d", tc.rows, tc.vocab, tc.stride), func(t *testing.T) {
			a := sampleLogits(rng, tc.rows*tc.stride, tc.vocab)
			b := sampleLogits(rng, tc.rows, tc.vocab)
			sum := make([]float32, tc.rows*tc.vocab)
			for r := range tc.rows {
				for v := range tc.vocab {
					sum[r*tc.vocab+v] = a[r*tc.stride*tc.vocab+v] + b[r*tc.vocab+v]
				}
			}
			ids := d.poisonedIDs(tc.rows)
			if err := cuda.AddArgmax(s, ids, d.up(sliceBytes(a)), tc.stride*tc.vocab, d.up(sliceBytes(b)), tc.rows, tc.vocab); err != nil {
				t.Fatal(err)
			}
			z, zi := make([]float32, tc.rows), make([]int32, tc.rows)
			got, want := d.ids(ids, tc.rows), cpuref.SampleDraw(sum, tc.rows, tc.vocab, z, zi, z, z, z)
			for r := range got {
				if got[r] != want[r] {
					t.Errorf("row %d: got %d, want %d", r, got[r], want[r])
				}
			}
			src := make([]int32, tc.rows*tc.stride)
			for i := range src {
				src[i] = int32(rng.IntN(1 << 20))
			}
			dst := d.poisonedIDs(tc.rows)
			if err := cuda.StrideI32(s, dst, d.up(sliceBytes(src)), tc.stride, tc.rows); err != nil {
				t.Fatal(err)
			}
			for r, id := range d.ids(dst, tc.rows) {
				if id != src[r*tc.stride] {
					t.Errorf("stride_i32 row %d: got %d, want %d", r, id, src[r*tc.stride])
				}
			}
		})
	}
}
