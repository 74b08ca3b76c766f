package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/rope"
	"github.com/megamoe/megamoe/safetensors"
)

// openGPU opens a GPU backend with o, skipping t on machines without one;
// it is closed when t ends.
func openGPU(t testing.TB, o Options) *Backend {
	t.Helper()
	g, err := New(o)
	if err != nil {
		t.Skipf("no GPU: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return g
}

// newPair pairs a fresh GPU backend (skipping without one) with the CPU reference.
func newPair(t *testing.T, mode backend.Numerics) *opcheck.Pair {
	t.Helper()
	g := openGPU(t, Options{})
	c := cpu.New(cpu.Options{})
	c.SetNumerics(mode)
	g.SetNumerics(mode)
	seed := rand.Uint64()
	t.Logf("seed %d, numerics %v", seed, mode)
	return opcheck.NewPair(t, c, g, seed)
}

func must(t opcheck.Reporter, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%v", err)
	}
}

func TestElementwiseOps(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			for _, sh := range []struct{ rows, d, n int }{{1, 256, 4}, {7, 1024, 4}, {67, 4096, 4}} {
				tag := fmt.Sprintf("%dx%d", sh.rows, sh.d)
				x := p.Rand(sh.rows, sh.n*sh.d, 1)
				wv := make([]float32, sh.d)
				for i := range wv {
					wv[i] = num.RoundBF16(float32(1 + 0.1*p.Rng.NormFloat64()))
				}
				gw, err := p.G.NewVec(wv)
				must(t, err)
				o := p.Out(sh.rows, sh.n*sh.d)
				must(t, p.C.RMSNorm(x.C, cpu.NewVec(wv), 1e-6, o.C))
				must(t, p.G.RMSNorm(x.G, gw, 1e-6, o.G))
				p.Check("rmsnorm "+tag, o, 1e-3)

				e := p.Rand(sh.rows, sh.d, 0.5)
				x2 := p.From(sh.rows, sh.n*sh.d, x.Host)
				must(t, p.C.AddStreams(x2.C, e.C))
				must(t, p.G.AddStreams(x2.G, e.G))
				p.Check("add streams "+tag, x2, 1e-3)

				must(t, p.C.Scale(x2.C, 0.37))
				must(t, p.G.Scale(x2.G, 0.37))
				p.Check("scale "+tag, x2, 1e-3)

				g, u := p.Rand(sh.rows, sh.d, 3), p.Rand(sh.rows, sh.d, 3)
				for _, lim := range []float32{0, 7} {
					o := p.Out(sh.rows, sh.d)
					must(t, p.C.SwiGLU(g.C, u.C, lim, o.C))
					must(t, p.G.SwiGLU(g.G, u.G, lim, o.G))
					p.Check(fmt.Sprintf("swiglu limit %g %s", lim, tag), o, 1e-3)
				}
				o2 := p.Out(sh.rows, sh.d)
				must(t, p.C.Combine(g.C, u.C, o2.C))
				must(t, p.G.Combine(g.G, u.G, o2.G))
				p.Check("combine "+tag, o2, 1e-3)

				// Single rows, and runs of consecutive ones (copied at once).
				for _, rows := range [][]int{{sh.rows - 1, 0, sh.rows / 2}, {0, 1, 2, 1, 2, sh.rows - 1, 0}} {
					rows = slices.DeleteFunc(rows, func(r int) bool { return r >= sh.rows })
					o3 := p.Out(len(rows), sh.d)
					must(t, p.C.GatherRows(g.C, rows, o3.C))
					must(t, p.G.GatherRows(g.G, rows, o3.G))
					p.Check(fmt.Sprintf("gather %v %s", rows, tag), o3, 0)
				}

				// hc post: mix = post | comb.
				n := sh.n
				mix := p.Rand(sh.rows, n+n*n, 0.5)
				sub := p.Rand(sh.rows, sh.d, 1)
				o4 := p.Out(sh.rows, n*sh.d)
				must(t, p.C.HcPost(sub.C, x.C, mix.C, backend.HcArgs{Streams: n}, o4.C))
				must(t, p.G.HcPost(sub.G, x.G, mix.G, backend.HcArgs{Streams: n}, o4.G))
				p.Check("hc post "+tag, o4, 1e-3)

				kv := p.Rand(sh.rows, 512, 2)
				must(t, p.C.KVQuant(kv.C, 448, 64))
				must(t, p.G.KVQuant(kv.G, 448, 64))
				p.Check("kv quant fp8 "+tag, kv, 1e-6)
				if mode == backend.Faithful { // a NaN or Inf poisons its whole block, as on the CPU
					v := append([]float32(nil), kv.Host...)
					v[3], v[64+5] = float32(math.NaN()), float32(math.Inf(1))
					bad := p.From(sh.rows, 512, v)
					must(t, p.C.KVQuant(bad.C, 448, 64))
					must(t, p.G.KVQuant(bad.G, 448, 64))
					got := make([]float32, len(v))
					must(t, p.G.Download(bad.G, got))
					want := bad.C.(*cpu.Tensor).F
					for i := range got {
						if math.IsNaN(float64(got[i])) != math.IsNaN(float64(want[i])) {
							t.Fatalf("kv quant non-finite block: element %d gpu %v cpu %v", i, got[i], want[i])
						}
					}
				}
			}
		})
	}
}

func TestEmbedAndRope(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			const vocab, dim = 1000, 256
			data := make([]byte, 2*vocab*dim)
			for i := 0; i < vocab*dim; i++ {
				binary.LittleEndian.PutUint16(data[2*i:], uint16(num.BF16FromF32(float32(p.Rng.NormFloat64()))))
			}
			st := safetensors.Tensor{Name: "embed.weight", DType: safetensors.BF16, Shape: []int{vocab, dim}, Data: data}
			ce, err := p.C.PrepareEmbedding(st, vocab, dim)
			must(t, err)
			ge, err := p.G.PrepareEmbedding(st, vocab, dim)
			must(t, err)
			ids := []int32{5, 999, 0, 5, 321}
			o := p.Out(len(ids), 4*dim)
			must(t, p.C.Embed(ce, ids, 4, o.C))
			must(t, p.G.Embed(ge, ids, 4, o.G))
			p.Check("embed", o, 0)
			if err := p.G.Embed(ge, []int32{vocab}, 4, o.G); err == nil {
				t.Error("embed accepted an id outside the vocab")
			}

			yarn := &rope.YaRN{Factor: 16, OriginalLen: 65536, BetaFast: 32, BetaSlow: 1}
			fr, err := rope.New(64, 160000, yarn)
			must(t, err)
			bt := &backend.Batch{Seqs: []backend.SeqInfo{{Rows: 3}, {Start: 70000, Row0: 3, Rows: 2}}, Pos: []int32{0, 1, 2, 70000, 70001}, Seq: []int32{0, 0, 0, 1, 1}}
			for _, inv := range []bool{false, true} {
				q := p.Rand(5, 8*512, 1)
				a := backend.RopeArgs{Freqs: fr, HeadDim: 512, Inverse: inv}
				must(t, p.C.Rope(q.C, a, bt))
				must(t, p.G.Rope(q.G, a, bt))
				p.Check(fmt.Sprintf("rope inverse=%v", inv), q, 2e-3)
			}
		})
	}
}

func TestLinears(t *testing.T) {
	formats := []checkpoint.Format{checkpoint.FormatBF16, checkpoint.FormatF32, checkpoint.FormatFP8Block, checkpoint.FormatMXFP4, checkpoint.FormatNVFP4}
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			for _, f := range formats {
				for _, sh := range []struct{ m, out, in int }{{1, 256, 256}, {9, 1024, 512}, {130, 384, 1024}, {5, 256, 192}} {
					cl := opcheck.RandLinear(p.Rng, f, sh.out, sh.in)
					cw, err := p.C.PrepareLinear(cl)
					must(t, err)
					gw, err := p.G.PrepareLinear(cl)
					must(t, err)
					x := p.Rand(sh.m, sh.in, 1)
					tag := fmt.Sprintf("%v %dx%dx%d", f, sh.m, sh.out, sh.in)
					o := p.Out(sh.m, sh.out)
					must(t, p.C.Linear(x.C, cw, o.C))
					must(t, p.G.Linear(x.G, gw, o.G))
					p.Check("linear "+tag, o, 1e-2)
					// The fp32 linear on full fp32 inputs (not bf16 values): more than 8
					// rows with bf16 weights take the three-way bf16 split.
					v := make([]float32, len(x.Host))
					for i, h := range x.Host {
						v[i] = h * 1.2345678
					}
					xf := p.From(sh.m, sh.in, v)
					o2 := p.Out(sh.m, sh.out)
					must(t, p.C.LinearF32(xf.C, cw, o2.C))
					must(t, p.G.LinearF32(xf.G, gw, o2.G))
					p.Check("linear-f32 "+tag, o2, 1e-5)
				}
			}
			// The fp32 linear of bf16 weights: 2 rows on gemvr, 9 and 30 on
			// linear_bf16x3_dec (2 and 4 token tiles; a split K of 4096 at 30 rows).
			for _, sh := range []struct{ m, out, in int }{{2, 256, 512}, {9, 384, 1024}, {30, 128, 4096}} {
				cl := opcheck.RandLinear(p.Rng, checkpoint.FormatBF16, sh.out, sh.in)
				cw, err := p.C.PrepareLinear(cl)
				must(t, err)
				gw, err := p.G.PrepareLinear(cl)
				must(t, err)
				v := make([]float32, sh.m*sh.in)
				for i := range v {
					v[i] = float32(p.Rng.NormFloat64()) * 1.2345678
				}
				xf := p.From(sh.m, sh.in, v)
				o := p.Out(sh.m, sh.out)
				must(t, p.C.LinearF32(xf.C, cw, o.C))
				must(t, p.G.LinearF32(xf.G, gw, o.G))
				p.Check(fmt.Sprintf("linear-f32 dec %dx%dx%d", sh.m, sh.out, sh.in), o, 1e-5)
			}
			// Grouped output projection: 8 groups of R=128 rows over K=256 columns each.
			// Faithful: up to 32 rows linear_bf16_dec (1, 2 and 4 token tiles), 33
			// linear_bf16; exact: the decode GEMV up to 8 rows, then the tiled fp32 kernel.
			const groups, R, K = 8, 128, 256
			for _, f := range []checkpoint.Format{checkpoint.FormatBF16, checkpoint.FormatFP8Block} {
				cl := opcheck.RandLinear(p.Rng, f, groups*R, K)
				cw, err := p.C.PrepareLinear(cl)
				must(t, err)
				gw, err := p.G.PrepareLinear(cl)
				must(t, err)
				for _, m := range []int{1, 3, 9, 17, 33} {
					x := p.Rand(m, groups*K, 1)
					o := p.Out(m, groups*R)
					must(t, p.C.GroupedOutProj(x.C, cw, groups, o.C))
					must(t, p.G.GroupedOutProj(x.G, gw, groups, o.G))
					p.Check(fmt.Sprintf("grouped out proj %v m=%d", f, m), o, 1e-2)
				}
			}
		})
	}
}

// TestSharedInputLinears: the GPU's Linears (one activation quantisation for
// the FP8 tensor-core linears of one input; two decode linears of one CTA
// size in one linear_fp8_dec2 launch) gives exactly what separate Linear
// calls give, also with a linear of another format in the list. The pairs
// are checked at the kernel too: LinearFP8PairF32 against two LinearFP8F32
// launches, bit for bit, at the small config's, Flash's and Pro's wq_a|wkv
// and shared w1|w3 (Flash's and Pro's in faithful mode only: exact mode
// runs them as separate fp32 linears, minutes each under the emulator).
// The pairs run on the in-CTA decode kernels (path deccta); with the
// planner's own choice these shapes take linear_fp8_dsk, one launch each
// (the small cases only).
func TestSharedInputLinears(t *testing.T) {
	for _, path := range []cuda.Path{cuda.PathDecCTA, cuda.PathAuto} {
		name := string(path)
		if path == cuda.PathAuto {
			name = "auto"
		}
		t.Run(name, func(t *testing.T) { sharedInputLinears(t, path) })
	}
}

func sharedInputLinears(t *testing.T, path cuda.Path) {
	const (
		fp8  = checkpoint.FormatFP8Block
		bf16 = checkpoint.FormatBF16
	)
	type lin struct {
		f   checkpoint.Format
		out int
	}
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			ctx := p.G.(*Backend).Context()
			must(t, ctx.SetKernelChoice(cuda.KernelChoice{Linear: path}))
			t.Cleanup(func() { must(t, ctx.SetKernelChoice(cuda.KernelChoice{})) })
			multi := p.G
			for _, c := range []struct {
				name  string
				m, in int
				ls    []lin
				pair  bool // the first two run as one launch (faithful, deccta)
				big   bool // faithful and deccta only
			}{
				{"mixed", 1, 512, []lin{{fp8, 1024}, {fp8, 256}, {bf16, 128}}, true, false},
				{"mixed", 9, 512, []lin{{fp8, 1024}, {fp8, 256}, {bf16, 128}}, true, false},
				{"mixed", 130, 512, []lin{{fp8, 1024}, {fp8, 256}, {bf16, 128}}, false, false},
				{"small wq_a|wkv", 3, 256, []lin{{fp8, 128}, {fp8, 128}}, true, false},
				{"small shared w1|w3", 16, 256, []lin{{fp8, 128}, {fp8, 128}}, true, false},
				{"flash wq_a|wkv", 1, 4096, []lin{{fp8, 1024}, {fp8, 512}}, true, true},
				{"flash shared w1|w3", 3, 4096, []lin{{fp8, 2048}, {fp8, 2048}}, true, true},
				{"pro wq_a|wkv", 1, 7168, []lin{{fp8, 1536}, {fp8, 512}}, true, true},
				{"three", 1, 512, []lin{{bf16, 64}, {fp8, 256}, {fp8, 136}}, false, false}, // a pair after a bf16 linear
			} {
				if c.big && (mode != backend.Faithful || path != cuda.PathDecCTA) {
					continue
				}
				tag := fmt.Sprintf("%s m=%d", c.name, c.m)
				var cws, gws []backend.Linear
				var outs []opcheck.Twin
				for _, l := range c.ls {
					cl := opcheck.RandLinear(p.Rng, l.f, l.out, c.in)
					cw, err := p.C.PrepareLinear(cl)
					must(t, err)
					gw, err := p.G.PrepareLinear(cl)
					must(t, err)
					cws, gws = append(cws, cw), append(gws, gw)
					outs = append(outs, p.Out(c.m, l.out))
				}
				x := p.Rand(c.m, c.in, 1)
				gouts := make([]backend.Tensor, len(outs))
				for i, o := range outs {
					gouts[i] = o.G
					must(t, p.C.Linear(x.C, cws[i], o.C))
				}
				must(t, multi.Linears(x.G, gws, gouts))
				for i, o := range outs {
					tag := fmt.Sprintf("%s #%d", tag, i)
					p.Check("linears "+tag, o, 1e-2)
					sep := p.Out(c.m, gws[i].Out())
					must(t, p.G.Linear(x.G, gws[i], sep.G))
					equalBits(t, p.G, tag, o.G, sep.G)
				}
				if mode == backend.Faithful && len(c.ls) >= 2 && c.ls[0].f == fp8 && c.ls[1].f == fp8 {
					checkPairLaunch(t, p, tag, x, gws[0].(*linear), gws[1].(*linear), c.pair && path == cuda.PathDecCTA)
				}
				p.Release()
			}
			if err := multi.Linears(p.Rand(1, 64, 1).G, nil, []backend.Tensor{p.Out(1, 8).G}); err == nil {
				t.Error("Linears accepted one output for no weights")
			}
		})
	}
}

// checkPairLaunch runs l0 and l1 on x as one LinearFP8PairF32 launch and as
// two LinearFP8F32 launches (outputs poisoned) and requires the same bits;
// pair says whether the shapes make one launch.
func checkPairLaunch(t *testing.T, p *opcheck.Pair, tag string, x opcheck.Twin, l0, l1 *linear, pair bool) {
	t.Helper()
	g := p.G.(*Backend)
	m, k := x.G.Rows(), x.G.Cols()
	buf, err := g.scratch(fp8Bytes(m, k))
	must(t, err)
	defer buf.Free()
	q, qs := fp8Layout(buf.Ptr, m, k)
	must(t, cuda.QuantFP8F32(g.s, q, qs, 0, x.G.(*Tensor).ptr, m, k, k, 128))
	a, b := p.Out(m, l0.out), p.Out(m, l1.out)
	ok, err := cuda.LinearFP8PairF32(g.s, q, qs, m, k, cuda.DecLinear{YF: a.G.(*Tensor).ptr, W: l0.w.Ptr, WS: l0.scale.Ptr, N: l0.out},
		cuda.DecLinear{YF: b.G.(*Tensor).ptr, W: l1.w.Ptr, WS: l1.scale.Ptr, N: l1.out})
	must(t, err)
	if ok != pair {
		t.Fatalf("%s: pair launch %v, want %v", tag, ok, pair)
	}
	if !ok {
		return
	}
	for i, l := range []*linear{l0, l1} {
		sep := p.Out(m, l.out)
		y, err := g.scratch(2 * m * l.out)
		must(t, err)
		must(t, cuda.LinearFP8F32(g.s, sep.G.(*Tensor).ptr, y.Ptr, q, qs, l.w.Ptr, l.scale.Ptr, m, l.out, k, 0))
		y.Free()
		equalBits(t, g, fmt.Sprintf("%s pair launch #%d", tag, i), []backend.Tensor{a.G, b.G}[i], sep.G)
	}
}

// genWeights draws the weights of c as the small-checkpoint generator does
// (checkpoint.GenWeights, official formats).
func genWeights(t testing.TB, c *checkpoint.Config, seed uint64) *checkpoint.Weights {
	t.Helper()
	w, err := checkpoint.GenWeights(c, checkpoint.GenOfficial, seed)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
