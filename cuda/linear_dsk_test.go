package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/cuda/cpuref"
)

// TestLinearDSKFixup: linear_fp8_dsk with its row groups split over CTAs
// (one and two token tiles, 1 and 2 K blocks a warp, a short last slice)
// writes every output within the CPU twin's bound, gives the same bits when
// launched again, in a graph replayed twice and on a stream whose first use
// of the counters is inside a capture, leaves the counters at zero, and its
// fp32 output (LinearFP8F32) is the bf16 output widened.
func TestLinearDSKFixup(t *testing.T) {
	ctx, s := testDevice(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	if err := ctx.SetKernelChoice(KernelChoice{Linear: PathDecSK}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ctx.SetKernelChoice(KernelChoice{}); err != nil {
			t.Error(err)
		}
	}()
	for _, c := range []struct{ m, n, k, kb, z int }{
		{5, 1032, 1280, 1, 3},
		{11, 1048, 2176, 2, 3},
	} {
		t.Run(fmt.Sprintf("%dx%dx%d", c.m, c.n, c.k), func(t *testing.T) {
			if p, ok := planDSK(c.m, c.n, c.k, ctx.dev.SMs); !ok || p != (dskPlan{c.kb, c.z}) {
				t.Skipf("planDSK on %d SMs = %+v, %v: not the split case (kb %d, z %d)", ctx.dev.SMs, p, ok, c.kb, c.z)
			}
			in := newDSKInputs(t, ctx, s, rng, c.m, c.n, c.k)
			want := in.run(t, s, false)
			in.check(t, want)
			for rep := range 2 {
				in.same(t, fmt.Sprintf("launch %d", rep), in.run(t, s, false), want)
			}
			in.same(t, "graph", in.graph(t, s), want)
			in.zero(t, s)
			s2, err := ctx.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := s2.Close(); err != nil {
					t.Error(err)
				}
			}()
			in.same(t, "graph on a fresh stream", in.graph(t, s2), want)
			in.zero(t, s2)
			wide := in.run(t, s, true)
			for i := 0; i < len(want); i += 2 {
				f := math.Float32frombits(uint32(want[i])<<16 | uint32(want[i+1])<<24)
				if g := math.Float32frombits(uint32(wide[2*i]) | uint32(wide[2*i+1])<<8 | uint32(wide[2*i+2])<<16 | uint32(wide[2*i+3])<<24); math.Float32bits(g) != math.Float32bits(f) {
					t.Fatalf("yf[%d] = %v, the bf16 output widened is %v", i/2, g, f)
				}
			}
		})
	}
}

type dskInputs struct {
	m, n, k                 int
	hxq, hxs, hw, hws       []byte
	y, yf, xq, xs, w, ws, p *Buffer
	scratch                 int
}

// newDSKInputs uploads random e4m3 activations and weights (no NaN codes)
// with e8m0 scales near 1.
func newDSKInputs(t *testing.T, ctx *Context, s *Stream, rng *rand.Rand, m, n, k int) *dskInputs {
	t.Helper()
	in := &dskInputs{m: m, n: n, k: k, scratch: LinearFP8ScratchBytes(s, m, n, k)}
	if in.scratch == 0 {
		t.Fatal("no scratch for the split")
	}
	fill := func(b []byte, f func() byte) []byte {
		for i := range b {
			b[i] = f()
		}
		return b
	}
	code := func() byte {
		b := byte(rng.IntN(256))
		if b&0x7f == 0x7f {
			b ^= 1
		}
		return b
	}
	scale := func() byte { return byte(122 + rng.IntN(8)) }
	in.hxq, in.hxs = fill(make([]byte, m*k), code), fill(make([]byte, m*k/128), scale)
	in.hw, in.hws = fill(make([]byte, n*k), code), fill(make([]byte, ceilDiv(n, 128)*k/128), scale)
	up := func(b []byte) *Buffer {
		buf, err := ctx.Alloc(len(b))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(buf.Free)
		if err := s.CopyHtoD(buf.Ptr, b); err != nil {
			t.Fatal(err)
		}
		return buf
	}
	in.xq, in.xs, in.w, in.ws = up(in.hxq), up(in.hxs), up(in.hw), up(in.hws)
	in.y, in.yf, in.p = up(make([]byte, 2*m*n)), up(make([]byte, 4*m*n)), up(make([]byte, in.scratch))
	return in
}

// launch poisons the outputs and the partials and runs LinearFP8 (wide:
// LinearFP8F32 into yf).
func (in *dskInputs) launch(s *Stream, wide bool) error {
	for _, b := range []struct {
		p *Buffer
		n int
	}{{in.y, 2 * in.m * in.n}, {in.yf, 4 * in.m * in.n}, {in.p, in.scratch}} {
		if err := s.Memset8(b.p.Ptr, 0xff, b.n); err != nil {
			return err
		}
	}
	if wide {
		return LinearFP8F32(s, in.yf.Ptr, in.y.Ptr, in.xq.Ptr, in.xs.Ptr, in.w.Ptr, in.ws.Ptr, in.m, in.n, in.k, in.p.Ptr)
	}
	return LinearFP8(s, in.y.Ptr, in.xq.Ptr, in.xs.Ptr, in.w.Ptr, in.ws.Ptr, in.m, in.n, in.k, in.p.Ptr)
}

func (in *dskInputs) download(t *testing.T, s *Stream, wide bool) []byte {
	t.Helper()
	b, src := make([]byte, 2*in.m*in.n), in.y
	if wide {
		b, src = make([]byte, 4*in.m*in.n), in.yf
	}
	if err := s.CopyDtoH(b, src.Ptr); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return b
}

func (in *dskInputs) run(t *testing.T, s *Stream, wide bool) []byte {
	t.Helper()
	if err := in.launch(s, wide); err != nil {
		t.Fatal(err)
	}
	return in.download(t, s, wide)
}

// graph captures the launch on s and replays it twice; the second replay's
// output is returned.
func (in *dskInputs) graph(t *testing.T, s *Stream) []byte {
	t.Helper()
	return replayTwice(t, s, func() error { return in.launch(s, false) }, func() []byte { return in.download(t, s, false) })
}

// check holds every bf16 output to the float64 twin: within one bf16
// rounding (2^-8 relative) plus 2^-20 of the sum of the products'
// magnitudes (the fp32 sums' order).
func (in *dskInputs) check(t *testing.T, got []byte) {
	t.Helper()
	ref, mag := make([]float64, in.m*in.n), make([]float64, in.m*in.n)
	cpuref.LinearFP8(ref, in.hxq, in.hxs, in.hw, in.hws, in.m, in.n, in.k, nil)
	abs := func(b []byte) []byte { // e4m3 magnitudes: the sign bit cleared
		a := make([]byte, len(b))
		for i, v := range b {
			a[i] = v & 0x7f
		}
		return a
	}
	cpuref.LinearFP8(mag, abs(in.hxq), in.hxs, abs(in.hw), in.hws, in.m, in.n, in.k, nil)
	for i, r := range ref {
		g := float64(math.Float32frombits(uint32(got[2*i])<<16 | uint32(got[2*i+1])<<24))
		if !(math.Abs(g-r) <= math.Abs(r)/256+mag[i]/(1<<20)) {
			t.Fatalf("y[%d, %d] = %v, the CPU twin %v (products' magnitudes %v)", i/in.n, i%in.n, g, r, mag[i])
		}
	}
}

// same requires identical bytes.
func (in *dskInputs) same(t *testing.T, what string, got, want []byte) {
	t.Helper()
	for i := 0; i < len(got); i += 2 {
		if got[i] != want[i] || got[i+1] != want[i+1] {
			t.Fatalf("%s: y[%d, %d] = %02x%02x, the first launch gave %02x%02x", what, i/2/in.n, i/2%in.n, got[i+1], got[i], want[i+1], want[i])
		}
	}
}

// zero requires the stream's counters back at zero.
func (in *dskInputs) zero(t *testing.T, s *Stream) {
	t.Helper()
	countersZero(t, s)
}
