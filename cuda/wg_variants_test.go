package cuda_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/kcheck"
)

// TestWGVariantsSameBits: every linear_fp8_wg variant (cuda.WGPaths) gives
// the bits of today's kernel (PathWG) on the same inputs, and every "-wave"
// variant (K split into other slices) those of PathWGWave: row and column
// tails (a 192-column tile straddling two weight scale rows, or mostly past
// N), one K block, odd block counts, split K with a short last slice, several
// tiles a persistent CTA, and y 8 bytes off a 16-byte boundary (the staged
// variants then store directly). Each variant is also checked against the
// CPU twin on a multi-wave shape and two split-K ones. The emulator (and
// -short) keeps the shapes under a million outputs.
func TestWGVariantsSameBits(t *testing.T) {
	ctx, s := gpu(t)
	if !ctx.HasTMA() {
		t.Skipf("%s has no sm_90a TMA path", ctx.Device().Name)
	}
	t.Cleanup(func() { _ = ctx.SetKernelChoice(cuda.KernelChoice{}) })
	rng := rand.New(rand.NewPCG(37, 90))
	codes := func(n int) []byte { // e4m3 without the NaN codes
		b := make([]byte, n)
		for i := range b {
			for b[i] = byte(rng.IntN(256)); b[i]&0x7f == 0x7f; b[i] = byte(rng.IntN(256)) {
			}
		}
		return b
	}
	scales := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(120 + rng.IntN(10))
		}
		return b
	}
	upload := func(b []byte) cuda.DevicePtr {
		buf, err := ctx.Alloc(len(b))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { buf.Free() })
		if err := s.CopyHtoD(buf.Ptr, b); err != nil {
			t.Fatal(err)
		}
		return buf.Ptr
	}
	for _, c := range []struct{ m, n, k, yOff int }{
		{65, 136, 128, 0},     // one block, one tile
		{200, 392, 1152, 0},   // 9 blocks in 2 slices; n192: a tile split at column 64
		{300, 1032, 2048, 0},  // split K, column tail
		{130, 520, 4224, 0},   // split K in 7 slices, the last of 3 blocks
		{256, 8200, 640, 0},   // 5 blocks, n192's last tile 136 columns wide
		{1100, 1280, 1024, 0}, // row tail, one tile a CTA
		{1500, 3000, 1408, 0}, // several tiles a CTA, both tails, 11 blocks
		{2048, 4096, 1024, 0}, // ~4 tiles a CTA
		{4096, 512, 4096, 0},  // Flash wkv
		{777, 2056, 3200, 8},  // y not 16-byte aligned
	} {
		m, n, k := c.m, c.n, c.k
		if (testing.Short() || ctx.Device().Emulated()) && m*n > 1<<20 {
			continue
		}
		xq, xs := upload(codes(m*k)), upload(scales(m*k/128))
		w, ws := upload(codes(n*k)), upload(scales((n+127)/128*k/128))
		ybuf, err := ctx.Alloc(2*m*n + 16)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ybuf.Free() })
		y := ybuf.Ptr.Add(c.yOff)
		var scratch cuda.DevicePtr
		if sb := cuda.LinearFP8ScratchBytes(s, m, n, k); sb > 0 {
			scratch = upload(make([]byte, sb))
		}
		refs := map[bool][]uint16{} // by "-wave"
		for _, p := range cuda.WGPaths() {
			if err := ctx.SetKernelChoice(cuda.KernelChoice{Linear: p}); err != nil {
				t.Fatal(err)
			}
			if err := s.Memset8(ybuf.Ptr, 0xff, 2*m*n+16); err != nil {
				t.Fatal(err)
			}
			if err := cuda.LinearFP8(s, y, xq, xs, w, ws, m, n, k, scratch); err != nil {
				t.Fatalf("%s %dx%dx%d: %v", p, m, n, k, err)
			}
			got := download16(t, s, y, m*n)
			wave := strings.HasSuffix(string(p), "-wave")
			ref := refs[wave]
			if ref == nil {
				refs[wave] = got
				for i, v := range got {
					if v == 0xffff {
						t.Fatalf("%s %dx%dx%d: y[%d, %d] not written", p, m, n, k, i/n, i%n)
					}
				}
				continue
			}
			bad, first := 0, -1
			for i := range got {
				if got[i] != ref[i] {
					if bad++; first < 0 {
						first = i
					}
				}
			}
			if bad > 0 {
				t.Errorf("%s %dx%dx%d (y +%d): %d of %d outputs differ from the first variant of its split, first y[%d, %d] = %#04x, not %#04x",
					p, m, n, k, c.yOff, bad, m*n, first/n, first%n, got[first], ref[first])
			}
		}
	}
	env := &kcheck.Env{Ctx: ctx, S: s, Seed: rng.Uint64()}
	defer env.Close()
	for _, p := range cuda.WGPaths() {
		if err := ctx.SetKernelChoice(cuda.KernelChoice{Linear: p}); err != nil {
			t.Fatal(err)
		}
		cases := []kcheck.Case{kcheck.LinearCase(130, 520, 4224, 0)}
		if !ctx.Device().Emulated() { // an hour in the emulator
			cases = append(cases, kcheck.LinearCase(512, 1024, 4096, 64))
			if !testing.Short() {
				cases = append(cases, kcheck.LinearCase(1500, 3000, 1408, 64))
			}
		}
		for _, c := range cases {
			r := kcheck.Run(env, c)
			t.Log(p, kcheck.Row(r))
			if !r.Pass {
				t.Errorf("%s: %s", p, kcheck.Row(r))
			}
		}
	}
}
