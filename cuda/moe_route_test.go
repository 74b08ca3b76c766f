package cuda_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/cuda"
)

// routeCase is one step's routing: tokens × top-K of E experts, rows of d.
type routeCase struct {
	name            string
	E, K, tokens, d int
	hot, foreign    bool // most pairs on 3 experts; ids of another rank (-1, E) among them
}

// routeIDs draws K distinct experts per token; expert E/2-1 never (an
// expert with no rows between others).
func routeIDs(rng *rand.Rand, c routeCase) []int32 {
	ids := make([]int32, c.tokens*c.K)
	for r := range c.tokens {
		used := map[int32]bool{int32(c.E/2 - 1): true}
		for k := range c.K {
			e := int32(rng.IntN(c.E))
			if c.hot && rng.IntN(10) < 7 {
				e = int32(5 + rng.IntN(3))
			}
			for used[e] {
				e = int32(rng.IntN(c.E))
			}
			used[e] = true
			ids[r*c.K+k] = e
		}
	}
	if c.foreign {
		for i := range ids {
			switch rng.IntN(8) {
			case 0:
				ids[i] = -1
			case 1:
				ids[i] = int32(c.E)
			}
		}
	}
	return ids
}

// routeBufs are one set of MoERoute outputs, poisoned.
type routeBufs struct {
	counts, offsets, perm, inv, tiles, xq, xs, xg cuda.DevicePtr
	sizes                                         []int
}

func (d devBufs) routeBufs(c routeCase, sh cuda.MoEShape) routeBufs {
	d.t.Helper()
	nk := c.tokens * c.K
	sizes := []int{4 * c.E, 4 * (c.E + 1), 4 * nk, 4 * nk, cuda.MoEScratchBytes(d.s, sh), nk * c.d, nk * c.d / 128, 4 * nk * c.d}
	p := make([]cuda.DevicePtr, len(sizes))
	for i, n := range sizes {
		n = (n + 3) &^ 3
		p[i] = d.up(make([]byte, n))
		if err := d.s.Memset32(p[i], 0x7fc0dead, n/4); err != nil { // NaN
			d.t.Fatal(err)
		}
	}
	return routeBufs{p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], sizes}
}

func (b routeBufs) ptrs() []cuda.DevicePtr {
	return []cuda.DevicePtr{b.counts, b.offsets, b.perm, b.inv, b.tiles, b.xq, b.xs, b.xg}
}

func (b routeBufs) args(a cuda.MoERouteArgs, mode string) cuda.MoERouteArgs {
	a.Counts, a.Offsets, a.Perm, a.Inv = b.counts, b.offsets, b.perm, b.inv
	switch mode {
	case "faithful":
		a.Tiles, a.XQ, a.XS = b.tiles, b.xq, b.xs
	case "trace":
		a.Tiles, a.XQ, a.XS, a.XG = b.tiles, b.xq, b.xs, b.xg
	case "exact":
		a.XG = b.xg
	}
	return a
}

// TestMoERoute: MoERoute's counts, offsets, permutation and tile list
// against host twins, and its gathered fp32 rows against x, with the tile
// list and FP8 gather of faithful mode, the fp32 gather too (trace) or alone
// (exact); outputs are poisoned first, so a row left unwritten shows. The
// decode path is forced: decmap writes no list (its kernel finds the tiles).
func TestMoERoute(t *testing.T) {
	ctx, s := gpu(t)
	d := devBufs{t, ctx, s}
	must(t, ctx.SetKernelChoice(cuda.KernelChoice{MoE: cuda.PathDec}))
	t.Cleanup(func() { must(t, ctx.SetKernelChoice(cuda.KernelChoice{})) })
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	for _, c := range []routeCase{
		{name: "flash", E: 256, K: 6, tokens: 1, d: 4096},
		{name: "flash", E: 256, K: 6, tokens: 64, d: 256},                 // d cut: emulated gathers are slow
		{name: "flash hot", E: 256, K: 6, tokens: 170, d: 128, hot: true}, // experts of many tiles
		{name: "small", E: 8, K: 2, tokens: 3, d: 256},
		{name: "small foreign", E: 8, K: 2, tokens: 17, d: 256, foreign: true},
		{name: "small", E: 8, K: 2, tokens: 513, d: 128},
		{name: "wide", E: 1024, K: 8, tokens: 128, d: 128},
	} {
		nk := c.tokens * c.K
		ids := routeIDs(rng, c)
		x := make([]float32, c.tokens*c.d)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * math.Ldexp(1, i/128%7-3))
		}
		sh := cuda.MoEShape{Experts: c.E, Rows: nk, N: 256, K: 128}
		base := cuda.MoERouteArgs{IDs: d.up(sliceBytes(ids)), Pairs: nk, Experts: c.E, Shape: sh,
			X: d.up(sliceBytes(x)), K: c.K, D: c.d}
		for _, mode := range []string{"faithful", "trace", "exact"} {
			tag := fmt.Sprintf("%s E=%d K=%d tokens=%d d=%d %s", c.name, c.E, c.K, c.tokens, c.d, mode)
			b := d.routeBufs(c, sh)
			tl, err := cuda.MoERoute(s, b.args(base, mode))
			if err != nil {
				t.Fatalf("%s: %v", tag, err)
			}
			var out [][]byte
			for i, p := range b.ptrs() {
				h := make([]byte, b.sizes[i])
				must(t, s.CopyDtoH(h, p))
				out = append(out, h)
			}
			must(t, s.Synchronize())
			checkPermutation(t, tag, ids, c.E, out[0], out[1], out[2], out[3])
			if mode != "exact" {
				bm, maxTiles := tl.Plan()
				checkTiles(t, tag, out[1], c.E, bm, maxTiles, out[4])
			}
			if mode != "faithful" {
				checkGather(t, tag, x, c.K, c.d, out[1], c.E, out[2], out[7])
			}
		}
	}
}

// checkGather: row m of xg is x's row perm[m] / K, for the rows experts own.
func checkGather(t *testing.T, tag string, x []float32, K, d int, offsets []byte, E int, perm, xg []byte) {
	t.Helper()
	i32 := func(b []byte, i int) int { return int(int32(binary.LittleEndian.Uint32(b[4*i:]))) }
	for m := range i32(offsets, E) {
		row := i32(perm, m) / K
		for j := range d {
			got := math.Float32frombits(binary.LittleEndian.Uint32(xg[4*(m*d+j):]))
			if math.Float32bits(got) != math.Float32bits(x[row*d+j]) {
				t.Fatalf("%s: xg[%d, %d] = %g, want x[%d, %d] = %g", tag, m, j, got, row, j, x[row*d+j])
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// checkPermutation is the host twin of MoEPermute: ids in [0, E) counted,
// offsets their prefix sums, each expert's pairs in ascending order.
func checkPermutation(t *testing.T, tag string, ids []int32, E int, counts, offsets, perm, inv []byte) {
	t.Helper()
	i32 := func(b []byte, i int) int { return int(int32(binary.LittleEndian.Uint32(b[4*i:]))) }
	cnt := make([]int, E)
	for _, id := range ids {
		if id >= 0 && int(id) < E {
			cnt[id]++
		}
	}
	off := make([]int, E+1)
	for e := range E {
		off[e+1] = off[e] + cnt[e]
		if i32(counts, e) != cnt[e] || i32(offsets, e) != off[e] {
			t.Fatalf("%s: expert %d: count %d offset %d, want %d %d", tag, e, i32(counts, e), i32(offsets, e), cnt[e], off[e])
		}
	}
	if i32(offsets, E) != off[E] {
		t.Fatalf("%s: offsets[E] = %d, want %d", tag, i32(offsets, E), off[E])
	}
	next := append([]int(nil), off[:E]...)
	for i, id := range ids {
		p := -1
		if id >= 0 && int(id) < E {
			p = next[id]
			next[id]++
			if i32(perm, p) != i {
				t.Fatalf("%s: perm[%d] = %d, want %d", tag, p, i32(perm, p), i)
			}
		}
		if i32(inv, i) != p {
			t.Fatalf("%s: inv[%d] = %d, want %d", tag, i, i32(inv, i), p)
		}
	}
}

// checkTiles is the host twin of moe_tile_map: a count, then {expert, first
// row, end row, 0} per tile of at most bm rows, in expert order.
func checkTiles(t *testing.T, tag string, offsets []byte, E, bm, maxTiles int, tiles []byte) {
	t.Helper()
	i32 := func(b []byte, i int) int { return int(int32(binary.LittleEndian.Uint32(b[4*i:]))) }
	n := 0
	for e := range E {
		for r := i32(offsets, e); r < i32(offsets, e+1); r += bm {
			want := [4]int{e, r, min(r+bm, i32(offsets, e+1)), 0}
			if n >= maxTiles {
				t.Fatalf("%s: more than %d tiles", tag, maxTiles)
			}
			if got := [4]int{i32(tiles, 4+4*n), i32(tiles, 5+4*n), i32(tiles, 6+4*n), i32(tiles, 7+4*n)}; got != want {
				t.Fatalf("%s: tile %d is %v, want %v", tag, n, got, want)
			}
			n++
		}
	}
	if i32(tiles, 0) != n {
		t.Fatalf("%s: %d tiles, want %d", tag, i32(tiles, 0), n)
	}
}
