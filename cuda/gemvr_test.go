package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/cuda/cpuref"
)

// TestGemvRowsBits: the decode GEMV of bf16 weights over 1-8 rows (gemv1 at
// one row, gemvr above: the planner's pick through LinearF32Kernel and
// every variant LinearF32Rows takes) gives, on fresh random inputs with
// the outputs poisoned first, exactly the bits of cpuref.GemvBF16 (the CPU
// twin of gemv1's summation order), and each row the bits gemv1 gives for
// that row alone. Shapes: 8 K slices a row with ragged tails, whole steps
// after a tail, 2 slices with the last CTA half empty, 1 slice with 32-row
// CTAs and the last one partial, groups, fp32 and bf16-rounded outputs; on
// a GPU also the head (129280 x 4096, the twin on sampled outputs).
func TestGemvRowsBits(t *testing.T) {
	ctx, s := testDevice(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 32))
	type shape struct {
		n, k, r int
		rnd     bool
		rows    []int // rows computed together (the first of max(rows) random ones)
		sample  int   // check the twin on every sample-th output (r == n)
	}
	all := []int{2, 3, 4, 5, 6, 7, 8}
	shapes := []shape{
		{200, 1032, 200, false, all, 1},         // 8 slices of 136: tails only, lanes 17-31 idle
		{8, 8200, 8, false, all, 1},             // 8 slices of 1032: a one-lane tail, then a whole step
		{512, 64, 128, true, all, 1},            // 4 groups of 128 rows, each its own 64 columns of x
		{4100, 40, 4100, false, []int{3, 8}, 1}, // 2 slices; 8-row CTAs (4 a warp), the last one half empty
		{4098, 48, 4098, true, []int{2, 5}, 1},  // 4098 % 4 != 0: only the 2-a-warp variants; bf16 out
		{16392, 16, 16392, false, []int{4}, 1},  // 1 slice; 32-row CTAs, the last one partial
	}
	if !ctx.Device().Emulated() {
		shapes[3].rows, shapes[4].rows, shapes[5].rows = all, all, all
		shapes = append(shapes, shape{129280, 4096, 129280, false, all, 4099})
	}
	for _, sh := range shapes {
		tag := fmt.Sprintf("%dx%d_r%d", sh.n, sh.k, sh.r)
		if sh.rnd {
			tag += "_bf16"
		}
		t.Run(tag, func(t *testing.T) { gemvRowsShape(t, ctx, s, rng, sh.n, sh.k, sh.r, sh.rnd, sh.rows, sh.sample) })
	}
}

// gemvRowsShape runs TestGemvRowsBits on one shape: n outputs in groups of
// r over k columns each, the twin on every sample-th output (r == n).
func gemvRowsShape(t *testing.T, ctx *Context, s *Stream, rng *rand.Rand, n, k, r int, rnd bool, mrows []int, sample int) {
	rows := slices.Max(mrows)
	ldx := n / r * k
	hw := make([]uint16, n*k)
	for i := range hw {
		hw[i] = cpuref.F32ToBF16(float32(rng.NormFloat64() * 0.05))
	}
	hx := make([]float32, rows*ldx)
	for i := range hx {
		hx[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(9)-4))
	}
	w, x := upload(t, ctx, s, u16bytes(hw)), upload(t, ctx, s, f32bytes(hx))
	y := alloc(t, ctx, 4*rows*n)
	ls := 3 - gemvLogRowsPerCTA(n)
	lsh := LinearShape{M: 1, N: n, K: k, R: r, LdX: ldx, Format: WeightBF16}
	// The twin, and each row alone on gemv1.
	want := make([]float32, rows*n)
	if sample == 1 {
		cpuref.GemvBF16(want, hx, ldx, hw, rows, n, k, r, ls, rnd)
	} else {
		col := make([]float32, rows)
		for o := 0; o < n; o += sample {
			cpuref.GemvBF16(col, hx, ldx, hw[o*k:], rows, 1, k, 1, ls, rnd)
			for i := range rows {
				want[i*n+o] = col[i]
			}
		}
	}
	alone := make([]float32, rows*n)
	for i := range rows {
		runGemv(t, s, y, n, alone[i*n:], func() error {
			return LinearF32Kernel(s, y.Ptr, x.Ptr.Add(4*i*ldx), w.Ptr, 0, lsh, rnd)
		})
	}
	sameBits(t, "gemv1 vs twin", alone, want, n, sample)
	for _, m := range mrows {
		t.Run(fmt.Sprint(m), func(t *testing.T) {
			msh := lsh
			msh.M = m
			type launcher struct {
				name string
				run  func() error
			}
			runs := []launcher{{"auto", func() error { return LinearF32Kernel(s, y.Ptr, x.Ptr, w.Ptr, 0, msh, rnd) }}}
			for _, g := range GemvRowsVariants(m) {
				if gemvRowsFits(g, msh) {
					runs = append(runs, launcher{g.String(), func() error { return LinearF32Rows(s, y.Ptr, x.Ptr, w.Ptr, msh, rnd, g) }})
				} else if err := LinearF32Rows(s, y.Ptr, x.Ptr, w.Ptr, msh, rnd, g); err == nil {
					t.Errorf("gemvr %v took %+v", g, msh)
				}
			}
			if len(runs) < 2 {
				t.Fatalf("no gemvr variant takes %+v", msh)
			}
			got := make([]float32, m*n)
			for _, l := range runs {
				runGemv(t, s, y, m*n, got, l.run)
				sameBits(t, l.name+" vs twin", got, want[:m*n], n, sample)
				sameBits(t, l.name+" vs gemv1 row by row", got, alone[:m*n], n, 1)
			}
		})
	}
}

// runGemv poisons y, runs the launch and downloads the n outputs into out.
func runGemv(t *testing.T, s *Stream, y *Buffer, n int, out []float32, launch func() error) {
	t.Helper()
	if err := s.Memset8(y.Ptr, 0xff, 4*n); err != nil {
		t.Fatal(err)
	}
	if err := launch(); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4*n)
	if err := s.CopyDtoH(b, y.Ptr); err != nil {
		t.Fatal(err)
	}
	for i := range out[:n] {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// sameBits fails at the first output (of every sample-th column) whose
// bits differ.
func sameBits(t *testing.T, what string, got, want []float32, n, sample int) {
	t.Helper()
	for i := range want {
		if i%n%sample != 0 {
			continue
		}
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: y[%d, %d] = %g (%#08x), want %g (%#08x)", what, i/n, i%n, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

func alloc(t *testing.T, ctx *Context, n int) *Buffer {
	t.Helper()
	b, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Free)
	return b
}

func upload(t *testing.T, ctx *Context, s *Stream, h []byte) *Buffer {
	t.Helper()
	b := alloc(t, ctx, len(h))
	if err := s.CopyHtoD(b.Ptr, h); err != nil {
		t.Fatal(err)
	}
	return b
}

func u16bytes(v []uint16) []byte {
	b := make([]byte, 2*len(v))
	for i, h := range v {
		binary.LittleEndian.PutUint16(b[2*i:], h)
	}
	return b
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}
