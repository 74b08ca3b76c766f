package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestHcOneLaunch: a one-row hc pre (plain, with the norm, with the norm and
// its FP8 quantisation) and hc head in one launch give every output byte of
// the two launches (the partials left in out included), launched again, in
// a graph replayed twice (its last CTA zeroes the counter) and on a stream
// whose first use of the counters is inside a capture, and leave the
// counters at zero.
func TestHcOneLaunch(t *testing.T) {
	ctx, s := testDevice(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 37))
	for _, c := range []struct{ n, d, iters, splits int }{
		{4, 512, 20, 16},
		{2, 256, 3, 4},
		{8, 128, 1, 1},
		{1, 64, 0, 1},
	} {
		mix := (2 + c.n) * c.n
		if p, ok := planHcPre(1, c.n, mix, c.d, ctx.dev.SMs); !ok || p.splits != c.splits {
			t.Fatalf("planHcPre(1, %d, %d, %d) on %d SMs = %+v, %v: want %d splits", c.n, mix, c.d, ctx.dev.SMs, p, ok, c.splits)
		}
		in := newHcInputs(t, ctx, s, rng, c.n, c.d)
		for _, op := range []string{"pre", "pre norm", "pre norm quant", "head"} {
			if op == "pre norm quant" && c.d%128 != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%s n=%d d=%d", op, c.n, c.d), func(t *testing.T) {
				run := func(s *Stream, two bool) error { return in.launch(s, op, c.iters, two) }
				want := in.eager(t, s, run, true)
				for rep := range 2 {
					in.same(t, fmt.Sprintf("one launch, %d", rep), in.eager(t, s, run, false), want)
				}
				in.same(t, "graph", in.graph(t, s, run), want)
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
				in.same(t, "graph on a fresh stream", in.graph(t, s2, run), want)
				in.zero(t, s2)
			})
		}
	}
}

type hcInputs struct {
	n, d                             int
	x, fnPre, fnHead, base, w        *Buffer
	out, mix, y, q, qs               *Buffer
	outBytes, mixBytes, qBytes, qsSz int
}

func newHcInputs(t *testing.T, ctx *Context, s *Stream, rng *rand.Rand, n, d int) *hcInputs {
	t.Helper()
	up := func(v []float32) *Buffer {
		b := make([]byte, 4*len(v))
		for i, f := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
		}
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
	randv := func(k int, sd float64) []float32 {
		v := make([]float32, k)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * sd)
		}
		return v
	}
	mix := (2 + n) * n
	in := &hcInputs{n: n, d: d, outBytes: 4 * d, mixBytes: 4 * (n + n*n), qBytes: d, qsSz: max(d/128, 1)}
	in.x = up(randv(n*d, 1))
	in.fnPre, in.fnHead = up(randv(mix*n*d, 0.05)), up(randv(n*n*d, 0.05))
	in.base, in.w = up(randv(mix, 0.5)), up(randv(d, 1))
	in.out, in.mix, in.y = up(make([]float32, d)), up(make([]float32, n+n*n)), up(make([]float32, d))
	in.q, in.qs = up(make([]float32, ceilDiv(in.qBytes, 4))), up(make([]float32, 1+in.qsSz/4))
	return in
}

// launch poisons the outputs and runs op on the one row (two: the partial
// and final kernels as two launches).
func (in *hcInputs) launch(s *Stream, op string, iters int, two bool) error {
	for _, b := range []struct {
		p *Buffer
		n int
	}{{in.out, in.outBytes}, {in.mix, in.mixBytes}, {in.y, in.outBytes}, {in.q, in.qBytes}, {in.qs, in.qsSz}} {
		if err := s.Memset8(b.p.Ptr, 0xff, b.n); err != nil {
			return err
		}
	}
	sc := [3]float32{0.7, 1.3, 0.9}
	const eps, normEps = 1e-6, 1e-6
	switch op {
	case "pre":
		return HcPreF32(s, in.out.Ptr, in.mix.Ptr, in.x.Ptr, in.fnPre.Ptr, in.base.Ptr, 1, in.n, in.d, sc, iters, eps, normEps, true, two)
	case "head":
		return HcHeadF32(s, in.out.Ptr, in.x.Ptr, in.fnHead.Ptr, in.base.Ptr, 1, in.n, in.d, sc[0], eps, normEps, true, two)
	}
	var q, qs DevicePtr
	if op == "pre norm quant" {
		q, qs = in.q.Ptr, in.qs.Ptr
	}
	ok, err := HcPreNormF32(s, in.y.Ptr, in.out.Ptr, in.mix.Ptr, in.x.Ptr, in.fnPre.Ptr, in.base.Ptr, in.w.Ptr, q, qs, 1, in.n, in.d, sc, iters, eps, normEps, 1e-6, true, two)
	if err == nil && !ok {
		err = fmt.Errorf("hc pre norm n=%d d=%d: not launched", in.n, in.d)
	}
	return err
}

// download returns every output's bytes, one after another.
func (in *hcInputs) download(t *testing.T, s *Stream) []byte {
	t.Helper()
	var all []byte
	for _, b := range []struct {
		p *Buffer
		n int
	}{{in.out, in.outBytes}, {in.mix, in.mixBytes}, {in.y, in.outBytes}, {in.q, in.qBytes}, {in.qs, in.qsSz}} {
		h := make([]byte, b.n)
		if err := s.CopyDtoH(h, b.p.Ptr); err != nil {
			t.Fatal(err)
		}
		all = append(all, h...)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return all
}

func (in *hcInputs) eager(t *testing.T, s *Stream, run func(*Stream, bool) error, two bool) []byte {
	t.Helper()
	if err := run(s, two); err != nil {
		t.Fatal(err)
	}
	return in.download(t, s)
}

// graph captures the one launch on s and replays it twice; the second
// replay's outputs are returned.
func (in *hcInputs) graph(t *testing.T, s *Stream, run func(*Stream, bool) error) []byte {
	t.Helper()
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	err := run(s, false)
	g, cerr := s.EndCapture()
	if err != nil || cerr != nil {
		t.Fatalf("capture: %v, %v", err, cerr)
	}
	defer g.Close()
	exec, err := g.Instantiate()
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Close()
	var got []byte
	for range 2 {
		if err := exec.Launch(s); err != nil {
			t.Fatal(err)
		}
		got = in.download(t, s)
	}
	return got
}

// same requires the two launches' bytes; the outputs that a path leaves
// poisoned (0xff) must be poisoned in both.
func (in *hcInputs) same(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: byte %d of the outputs (out %d, mix %d, y %d, q %d bytes) is %#02x, the two launches gave %#02x", what, i, in.outBytes, in.mixBytes, in.outBytes, in.qBytes, got[i], want[i])
	}
	if bytes.Count(want[:in.outBytes], []byte{0xff}) == in.outBytes {
		t.Fatal("the two launches left out untouched")
	}
}

// zero requires the stream's counters back at zero.
func (in *hcInputs) zero(t *testing.T, s *Stream) {
	t.Helper()
	if s.fix == nil {
		t.Fatal("no split-K counters on the stream")
	}
	c := make([]byte, 4*s.ctx.fixupSlots())
	if err := s.CopyDtoH(c, s.fix.Ptr); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for i, b := range c {
		if b != 0 {
			t.Fatalf("counter %d not reset", i/4)
		}
	}
}
