package cuda

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestMoEDecPreChain: decpre inside the routing chain it is meant for, as a
// decode step launches it (MoERoute's permute and gather, then the GEMM,
// with PDL where the device has it): rounds of fresh routing back to back,
// each GEMM's output compared with decmap's (which reads the offsets after
// its wait). A tile lookup before the wait that saw the previous round's
// offsets would read the wrong experts' weights.
func TestMoEDecPreChain(t *testing.T) {
	ctx, s := testDevice(t)
	seed := rand.Uint64()
	t.Logf("seed %d (PDL %v)", seed, s.PDL())
	rng := rand.New(rand.NewPCG(seed, 7))
	for _, c := range []struct {
		E, rows, k, n, d int
		f                FP4Format
	}{
		{16, 1, 6, 256, 512, MXFP4}, // split K
		{16, 2, 3, 264, 256, NVFP4}, // column tail
		{64, 4, 6, 128, 128, MXFP4}, // most experts without rows
	} {
		sh := MoEShape{Experts: c.E, Rows: c.rows * c.k, N: c.n, K: c.d, Format: c.f}
		t.Run(fmt.Sprintf("E%d_rows%d_k%d_n%d_d%d_%v", c.E, c.rows, c.k, c.n, c.d, c.f), func(t *testing.T) {
			if !decF16Fits(sh) {
				t.Fatalf("%+v: not a list of 8-row decode tiles", sh)
			}
			in := newFixupInputs(t, ctx, s, rng, sh, 0, 0) // the weights
			const rounds = 4
			ids := make([]int32, rounds*sh.Rows)
			for r := range rounds { // k distinct experts a row
				for i := range c.rows {
					for j, e := range rng.Perm(c.E)[:c.k] {
						ids[(r*c.rows+i)*c.k+j] = int32(e)
					}
				}
			}
			x := make([]float32, c.rows*c.d)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			buf := func(b []byte) DevicePtr {
				d, err := ctx.Alloc(len(b))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(d.Free)
				if err := s.CopyHtoD(d.Ptr, b); err != nil {
					t.Fatal(err)
				}
				return d.Ptr
			}
			dIDs, dX := buf(Bytes(ids)), buf(Bytes(x))
			counts, offsets := buf(make([]byte, 4*c.E)), buf(make([]byte, 4*(c.E+1)))
			perm, inv := buf(make([]byte, 4*sh.Rows)), buf(make([]byte, 4*sh.Rows))
			xq, xs := buf(make([]byte, sh.Rows*c.d)), buf(make([]byte, sh.Rows*c.d/128))
			scratch := buf(make([]byte, MoEScratchBytes(s, sh)))
			ys := buf(make([]byte, rounds*in.ybytes))
			var gs DevicePtr
			if c.f == NVFP4 {
				gs = in.gs.Ptr
			}
			run := func(p Path) []byte {
				t.Helper()
				if err := ctx.SetKernelChoice(KernelChoice{MoE: p}); err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := ctx.SetKernelChoice(KernelChoice{}); err != nil {
						t.Error(err)
					}
				}()
				if err := s.Memset8(ys, 0xff, rounds*in.ybytes); err != nil {
					t.Fatal(err)
				}
				for r := range rounds {
					tl, err := MoERoute(s, MoERouteArgs{IDs: dIDs.Add(4 * r * sh.Rows), Pairs: sh.Rows, Experts: c.E,
						Counts: counts, Offsets: offsets, Perm: perm, Inv: inv, Tiles: scratch, Shape: sh,
						XQ: xq, XS: xs, X: dX, K: c.k, D: c.d})
					if err != nil {
						t.Fatal(err)
					}
					if !tl.settled {
						t.Fatal("MoERoute with a gather: tile list not settled")
					}
					if err := MoEFP4Tiles(s, ys.Add(r*in.ybytes), xq, xs, in.w.Ptr, in.ws.Ptr, gs, sh, scratch, tl); err != nil {
						t.Fatal(err)
					}
				}
				got := make([]byte, rounds*in.ybytes)
				if err := s.CopyDtoH(got, ys); err != nil {
					t.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
				return got
			}
			want := run(PathDecMap)
			if got := run(PathDecPre); !bytes.Equal(got, want) {
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("round %d: y byte %d differs from decmap's", i/in.ybytes, i%in.ybytes)
					}
				}
			}
		})
	}
}
