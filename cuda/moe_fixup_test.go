package cuda

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestMoEFixupSlots: every decode launch that splits K fits the stream's
// counters on devices of several SM counts, and the counters on the
// H100/H200 are the 1056 they were sized at.
func TestMoEFixupSlots(t *testing.T) {
	if n := fixupSlots(132); n != 1056 {
		t.Errorf("fixupSlots(132) = %d, want 1056", n)
	}
	for _, sms := range []int{58, 108, 132, 148} {
		for _, E := range []int{1, 4, 8, 48, 256, 384} {
			for rows := 1; rows <= 16*E; rows += 1 + rows/7 {
				for _, nk := range [][2]int{{256, 512}, {264, 384}, {4096, 4096}, {4096, 2048}, {6144, 7168}, {7168, 3072}} {
					sh := MoEShape{Experts: E, Rows: rows, N: nk[0], K: nk[1]}
					if !moeDecode(sh) {
						continue
					}
					p := planMoE(sh, PathDec, sms)
					if ctas := ceilDiv(sh.N, p.colsPC) * p.maxTiles; p.splits > 1 && ctas > fixupSlots(sms) {
						t.Fatalf("%d SMs, %+v: %d CTAs split %d ways, %d counters", sms, sh, ctas, p.splits, fixupSlots(sms))
					}
				}
			}
		}
	}
}

// TestMoEDecFixup: moe_fp4_dec (and moe_fp4_decf16 on 8-row tiles) adding
// its split-K partials in the last CTA of each tile gives the bits of the
// kernel followed by linear_fp8_reduce, for 8- and 16-row tiles, MXFP4 and
// NVFP4, column tails, odd row counts and rows no expert owns. It runs twice eagerly and replays a graph twice
// (a counter left non-zero would leave tiles unsummed: still poisoned), and
// once on a stream whose first use of the counters is inside a capture.
func TestMoEDecFixup(t *testing.T) {
	ctx, s := testDevice(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	for i, c := range []struct {
		E, rows, n, k, lead, tail, bm int
		f                             FP4Format
	}{
		{8, 1, 256, 512, 0, 0, 8, MXFP4},
		{8, 3, 264, 384, 0, 0, 8, NVFP4},
		{16, 25, 256, 384, 3, 5, 8, MXFP4},
		{4, 41, 128, 512, 0, 0, 16, MXFP4},
		{4, 40, 136, 256, 3, 5, 16, NVFP4},
	} {
		sh := MoEShape{Experts: c.E, Rows: c.rows, N: c.n, K: c.k, Format: c.f}
		name := fmt.Sprintf("E%d_M%d_n%d_k%d_%v", c.E, c.rows, c.n, c.k, c.f)
		if p := planMoE(sh, PathDec, ctx.dev.SMs); !moeDecode(sh) || p.splits < 2 || p.bm != c.bm {
			t.Fatalf("%s: decode %v, %d splits, %d-row tiles: not a split-K case of %d-row tiles", name, moeDecode(sh), p.splits, p.bm, c.bm)
		}
		paths := []Path{PathDec}
		if decF16Fits(sh) {
			paths = append(paths, PathDecF16)
		}
		for _, path := range paths {
			t.Run(name+"/"+string(path), func(t *testing.T) {
				if err := ctx.SetKernelChoice(KernelChoice{MoE: path}); err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := ctx.SetKernelChoice(KernelChoice{}); err != nil {
						t.Error(err)
					}
				}()
				fixupCase(t, ctx, s, rng, sh, c.lead, c.tail, i == 0 && path == PathDec)
			})
		}
	}
}

// fixupCase is one case of TestMoEDecFixup on the context's kernel choice;
// fresh adds the run on a fresh stream.
func fixupCase(t *testing.T, ctx *Context, s *Stream, rng *rand.Rand, sh MoEShape, lead, tail int, fresh bool) {
	in := newFixupInputs(t, ctx, s, rng, sh, lead, tail)
	want := in.run(t, s, true)
	for i := 2 * lead * sh.N; i < 2*(sh.Rows-tail)*sh.N; i += 2 {
		if want[i] == 0xff && want[i+1] == 0xff {
			t.Fatalf("reduce path: y[%d, %d] still poisoned", i/2/sh.N, i/2%sh.N)
		}
	}
	for rep := range 2 {
		in.same(t, fmt.Sprintf("launch %d", rep), in.run(t, s, false), want)
	}
	in.same(t, "graph", in.graph(t, s), want)
	in.zero(t, s)
	if fresh { // fresh streams: the counters are zeroed before the capture, not in it
		fresh := func() *Stream {
			s2, err := ctx.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := s2.Close(); err != nil {
					t.Error(err)
				}
			})
			return s2
		}
		s2 := fresh()
		in.same(t, "graph on a fresh stream", in.graph(t, s2), want)
		in.same(t, "launch after the capture", in.run(t, s2, false), want)
		in.zero(t, s2)
		// The poisoning memsets of y and the scratch, then the GEMM's kernels.
		s3 := fresh()
		if got, want := in.nodes(t, s3), 2+in.kernels(s3); got != want {
			t.Errorf("graph on a fresh stream: %d nodes, want %d (no memset of the counters)", got, want)
		}
	}
}

// kernels is the launches of one MoEFP4 on s: the tile map unless the GEMM
// finds its tiles, and the GEMM.
func (in *fixupInputs) kernels(s *Stream) int {
	if decMapPath(s.moePath(in.sh)) {
		return 1
	}
	return 2
}

// nodes captures one fixup launch on s and returns the graph's node count.
func (in *fixupInputs) nodes(t *testing.T, s *Stream) int {
	t.Helper()
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	err := in.launch(s, false)
	g, cerr := s.EndCapture()
	if err != nil || cerr != nil {
		t.Fatalf("capture: %v, %v", err, cerr)
	}
	defer g.Close()
	n, err := g.Nodes()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type fixupInputs struct {
	ctx                                *Context
	sh                                 MoEShape
	y, xq, xs, off, w, ws, gs, scratch *Buffer
	ybytes, scratchBytes               int
	settled                            bool // mark the tile list Settled (the offsets came by copy)
}

// newFixupInputs uploads random FP8 activations and FP4 experts (no zero
// scales, no NaN codes) and offsets with lead and tail rows owned by none.
func newFixupInputs(t *testing.T, ctx *Context, s *Stream, rng *rand.Rand, sh MoEShape, lead, tail int) *fixupInputs {
	t.Helper()
	in := &fixupInputs{ctx: ctx, sh: sh, ybytes: 2 * sh.Rows * sh.N, scratchBytes: MoEScratchBytes(s, sh)}
	group := 32
	if sh.Format == NVFP4 {
		group = 16
	}
	fill := func(n int, f func() byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = f()
		}
		return b
	}
	off := make([]int32, sh.Experts+1)
	off[0] = int32(lead)
	counts := make([]int32, sh.Experts)
	for range sh.Rows - lead - tail {
		counts[rng.IntN(sh.Experts)]++
	}
	for e, c := range counts {
		off[e+1] = off[e] + c
	}
	scale := func() byte { return byte(118 + rng.IntN(8)) } // e8m0 near 2^-6
	if sh.Format == NVFP4 {
		scale = func() byte { return byte(0x30 + rng.IntN(0x10)) } // e4m3 0.125..0.23
	}
	gs := make([]float32, sh.Experts)
	for e := range gs {
		gs[e] = float32(1+e%3) / 1024
	}
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
	code := func() byte { // e4m3 without the NaN codes
		b := byte(rng.IntN(256))
		if b&0x7f == 0x7f {
			b ^= 1
		}
		return b
	}
	in.xq = up(fill(sh.Rows*sh.K, code))
	in.xs = up(fill(sh.Rows*sh.K/128, func() byte { return byte(120 + rng.IntN(8)) }))
	in.off = up(Bytes(off))
	in.w = up(fill(sh.Experts*sh.N*sh.K/2, func() byte { return byte(rng.IntN(256)) }))
	in.ws = up(fill(sh.Experts*sh.N*sh.K/group, scale))
	in.gs = up(Bytes(gs))
	in.y = up(make([]byte, in.ybytes))
	in.scratch = up(make([]byte, in.scratchBytes))
	return in
}

// launch poisons y and the scratch, then runs MoEFP4 (tile map and GEMM),
// with the fixup or (reduce) with linear_fp8_reduce.
func (in *fixupInputs) launch(s *Stream, reduce bool) error {
	if err := s.Memset8(in.y.Ptr, 0xff, in.ybytes); err != nil {
		return err
	}
	if err := s.Memset8(in.scratch.Ptr, 0xff, in.scratchBytes); err != nil {
		return err
	}
	var gs DevicePtr
	if in.sh.Format == NVFP4 {
		gs = in.gs.Ptr
	}
	tl, err := MoETiles(s, in.off.Ptr, in.sh, in.scratch.Ptr)
	if err != nil {
		return err
	}
	if in.settled {
		tl = tl.Settled()
	}
	return moeFP4Tiles(s, in.y.Ptr, in.xq.Ptr, in.xs.Ptr, in.w.Ptr, in.ws.Ptr, gs, in.sh, in.scratch.Ptr, tl, !reduce)
}

func (in *fixupInputs) download(t *testing.T, s *Stream) []byte {
	t.Helper()
	got := make([]byte, in.ybytes)
	if err := s.CopyDtoH(got, in.y.Ptr); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return got
}

// run launches eagerly, with linear_fp8_reduce (reduce) or the fixup.
func (in *fixupInputs) run(t *testing.T, s *Stream, reduce bool) []byte {
	t.Helper()
	if err := in.launch(s, reduce); err != nil {
		t.Fatal(err)
	}
	return in.download(t, s)
}

// graph captures the fixup launch on s and replays it twice; the second
// replay's output is returned.
func (in *fixupInputs) graph(t *testing.T, s *Stream) []byte {
	t.Helper()
	return replayTwice(t, s, func() error { return in.launch(s, false) }, func() []byte { return in.download(t, s) })
}

// replayTwice captures launch on s, replays the graph twice and returns
// read's result after the second replay (a counter left set by the first
// shows there).
func replayTwice(t *testing.T, s *Stream, launch func() error, read func() []byte) []byte {
	t.Helper()
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	err := launch()
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
		got = read()
	}
	return got
}

// same requires identical bytes.
func (in *fixupInputs) same(t *testing.T, what string, got, want []byte) {
	t.Helper()
	for i := 0; i < len(got); i += 2 {
		if got[i] != want[i] || got[i+1] != want[i+1] {
			row, col := i/2/in.sh.N, i/2%in.sh.N
			t.Fatalf("%s: y[%d, %d] = %02x%02x, the reduce path gives %02x%02x", what, row, col, got[i+1], got[i], want[i+1], want[i])
		}
	}
}

// zero requires the stream's counters back at zero.
func (in *fixupInputs) zero(t *testing.T, s *Stream) {
	t.Helper()
	countersZero(t, s)
}

// countersZero requires the split-K counters of s back at zero.
func countersZero(t *testing.T, s *Stream) {
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

// TestMoEDecMap: decmap (tiles found in the kernel, no tile_map launch) and
// decpre (the same with the lookup and first weight loads before the PDL
// wait, on settled lists; decmap's kernel on others) give moe_fp4_dec's bits,
// with and without split K, over column and token tails, experts without
// rows, unowned rows and more experts than the CTA has threads; MoETiles
// writes nothing for them, and a list left to the kernel is refused by
// another path.
func TestMoEDecMap(t *testing.T) {
	ctx, s := testDevice(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 5))
	for _, c := range []struct {
		E, rows, n, k, lead, tail int
		f                         FP4Format
	}{
		{8, 1, 256, 512, 0, 0, MXFP4},   // split K
		{8, 3, 264, 384, 0, 0, NVFP4},   // column tail
		{16, 25, 256, 384, 3, 5, MXFP4}, // unowned rows
		{4, 30, 128, 256, 0, 0, NVFP4},  // experts of several tiles, token tails
		{200, 7, 64, 256, 0, 0, MXFP4},  // two experts a thread, most without rows
		{384, 12, 128, 128, 2, 1, NVFP4},
	} {
		sh := MoEShape{Experts: c.E, Rows: c.rows, N: c.n, K: c.k, Format: c.f}
		t.Run(fmt.Sprintf("E%d_M%d_n%d_k%d_%v", c.E, c.rows, c.n, c.k, c.f), func(t *testing.T) {
			if !decF16Fits(sh) {
				t.Fatalf("%+v: not a list of 8-row decode tiles", sh)
			}
			choose := func(p Path) {
				t.Helper()
				if err := ctx.SetKernelChoice(KernelChoice{MoE: p}); err != nil {
					t.Fatal(err)
				}
			}
			defer choose(PathAuto)
			in := newFixupInputs(t, ctx, s, rng, sh, c.lead, c.tail)
			choose(PathDec)
			want := in.run(t, s, true)
			for _, r := range []struct {
				p       Path
				settled bool
			}{{PathDecMap, false}, {PathDecPre, true}} {
				choose(r.p)
				in.settled = r.settled
				in.same(t, string(r.p)+", reduce", in.run(t, s, true), want)
				in.same(t, string(r.p)+", fixup", in.run(t, s, false), want)
				in.same(t, string(r.p)+", graph", in.graph(t, s), want)
			}
			in.settled = false // decpre on a list not settled: decmap's kernel
			in.same(t, "decpre, not settled", in.run(t, s, false), want)
			list := make([]byte, 16)
			if err := s.CopyDtoH(list, in.scratch.Ptr); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(list, bytes.Repeat([]byte{0xff}, 16)) {
				t.Errorf("MoETiles wrote a tile list (% x) for decmap", list)
			}
			tl, err := MoETiles(s, in.off.Ptr, sh, in.scratch.Ptr)
			if err != nil {
				t.Fatal(err)
			}
			choose(PathDec)
			if err := moeFP4Tiles(s, in.y.Ptr, in.xq.Ptr, in.xs.Ptr, in.w.Ptr, in.ws.Ptr, in.gs.Ptr, sh, in.scratch.Ptr, tl, true); err == nil {
				t.Error("moe_fp4_dec ran on a tile list left to decmap")
			}
		})
	}
}
