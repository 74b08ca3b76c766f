package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
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
func newPair(t *testing.T, mode backend.Numerics) *pair {
	t.Helper()
	g := openGPU(t, Options{})
	c := cpu.New(cpu.Options{})
	c.SetNumerics(mode)
	g.SetNumerics(mode)
	seed := rand.Uint64()
	t.Logf("seed %d, numerics %v", seed, mode)
	return newPairOn(t, c, g, seed)
}

func must(t Reporter, err error) {
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
				x := p.rand(sh.rows, sh.n*sh.d, 1)
				wv := make([]float32, sh.d)
				for i := range wv {
					wv[i] = num.RoundBF16(float32(1 + 0.1*p.rng.NormFloat64()))
				}
				gw, err := p.g.NewVec(wv)
				must(t, err)
				o := p.out(sh.rows, sh.n*sh.d)
				must(t, p.c.RMSNorm(x.c, cpu.NewVec(wv), 1e-6, o.c))
				must(t, p.g.RMSNorm(x.g, gw, 1e-6, o.g))
				p.check("rmsnorm "+tag, o, 1e-3)

				e := p.rand(sh.rows, sh.d, 0.5)
				x2 := p.from(sh.rows, sh.n*sh.d, x.host)
				must(t, p.c.AddStreams(x2.c, e.c))
				must(t, p.g.AddStreams(x2.g, e.g))
				p.check("add streams "+tag, x2, 1e-3)

				must(t, p.c.Scale(x2.c, 0.37))
				must(t, p.g.Scale(x2.g, 0.37))
				p.check("scale "+tag, x2, 1e-3)

				g, u := p.rand(sh.rows, sh.d, 3), p.rand(sh.rows, sh.d, 3)
				for _, lim := range []float32{0, 7} {
					o := p.out(sh.rows, sh.d)
					must(t, p.c.SwiGLU(g.c, u.c, lim, o.c))
					must(t, p.g.SwiGLU(g.g, u.g, lim, o.g))
					p.check(fmt.Sprintf("swiglu limit %g %s", lim, tag), o, 1e-3)
				}
				o2 := p.out(sh.rows, sh.d)
				must(t, p.c.Combine(g.c, u.c, o2.c))
				must(t, p.g.Combine(g.g, u.g, o2.g))
				p.check("combine "+tag, o2, 1e-3)

				rows := []int{sh.rows - 1, 0, sh.rows / 2}
				o3 := p.out(len(rows), sh.d)
				must(t, p.c.GatherRows(g.c, rows, o3.c))
				must(t, p.g.GatherRows(g.g, rows, o3.g))
				p.check("gather "+tag, o3, 0)

				// hc post: mix = post | comb.
				n := sh.n
				mix := p.rand(sh.rows, n+n*n, 0.5)
				sub := p.rand(sh.rows, sh.d, 1)
				o4 := p.out(sh.rows, n*sh.d)
				must(t, p.c.HcPost(sub.c, x.c, mix.c, backend.HcArgs{Streams: n}, o4.c))
				must(t, p.g.HcPost(sub.g, x.g, mix.g, backend.HcArgs{Streams: n}, o4.g))
				p.check("hc post "+tag, o4, 1e-3)

				kv := p.rand(sh.rows, 512, 2)
				must(t, p.c.KVQuant(kv.c, 448, 64))
				must(t, p.g.KVQuant(kv.g, 448, 64))
				p.check("kv quant fp8 "+tag, kv, 1e-6)
				if mode == backend.Faithful { // a NaN or Inf poisons its whole block, as on the CPU
					v := append([]float32(nil), kv.host...)
					v[3], v[64+5] = float32(math.NaN()), float32(math.Inf(1))
					bad := p.from(sh.rows, 512, v)
					must(t, p.c.KVQuant(bad.c, 448, 64))
					must(t, p.g.KVQuant(bad.g, 448, 64))
					got := make([]float32, len(v))
					must(t, p.g.Download(bad.g, got))
					want := bad.c.(*cpu.Tensor).F
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
				binary.LittleEndian.PutUint16(data[2*i:], uint16(num.BF16FromF32(float32(p.rng.NormFloat64()))))
			}
			st := safetensors.Tensor{Name: "embed.weight", DType: safetensors.BF16, Shape: []int{vocab, dim}, Data: data}
			ce, err := p.c.PrepareEmbedding(st, vocab, dim)
			must(t, err)
			ge, err := p.g.PrepareEmbedding(st, vocab, dim)
			must(t, err)
			ids := []int32{5, 999, 0, 5, 321}
			o := p.out(len(ids), 4*dim)
			must(t, p.c.Embed(ce, ids, 4, o.c))
			must(t, p.g.Embed(ge, ids, 4, o.g))
			p.check("embed", o, 0)
			if err := p.g.Embed(ge, []int32{vocab}, 4, o.g); err == nil {
				t.Error("embed accepted an id outside the vocab")
			}

			yarn := &rope.YaRN{Factor: 16, OriginalLen: 65536, BetaFast: 32, BetaSlow: 1}
			fr, err := rope.New(64, 160000, yarn)
			must(t, err)
			bt := &backend.Batch{Seqs: []backend.SeqInfo{{Rows: 3}, {Start: 70000, Row0: 3, Rows: 2}}, Pos: []int32{0, 1, 2, 70000, 70001}, Seq: []int32{0, 0, 0, 1, 1}}
			for _, inv := range []bool{false, true} {
				q := p.rand(5, 8*512, 1)
				a := backend.RopeArgs{Freqs: fr, HeadDim: 512, Inverse: inv}
				must(t, p.c.Rope(q.c, a, bt))
				must(t, p.g.Rope(q.g, a, bt))
				p.check(fmt.Sprintf("rope inverse=%v", inv), q, 2e-3)
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
					cl := randLinear(p.rng, f, sh.out, sh.in)
					cw, err := p.c.PrepareLinear(cl)
					must(t, err)
					gw, err := p.g.PrepareLinear(cl)
					must(t, err)
					x := p.rand(sh.m, sh.in, 1)
					tag := fmt.Sprintf("%v %dx%dx%d", f, sh.m, sh.out, sh.in)
					o := p.out(sh.m, sh.out)
					must(t, p.c.Linear(x.c, cw, o.c))
					must(t, p.g.Linear(x.g, gw, o.g))
					p.check("linear "+tag, o, 1e-2)
					// The fp32 linear on full fp32 inputs (not bf16 values): more than 8
					// rows with bf16 weights take the three-way bf16 split.
					v := make([]float32, len(x.host))
					for i, h := range x.host {
						v[i] = h * 1.2345678
					}
					xf := p.from(sh.m, sh.in, v)
					o2 := p.out(sh.m, sh.out)
					must(t, p.c.LinearF32(xf.c, cw, o2.c))
					must(t, p.g.LinearF32(xf.g, gw, o2.g))
					p.check("linear-f32 "+tag, o2, 1e-5)
				}
			}
			// The fp32 linear of bf16 weights on linear_bf16x3_dec (1, 2 and 4
			// token tiles; a split K of 4096 at 30 rows).
			for _, sh := range []struct{ m, out, in int }{{2, 256, 512}, {9, 384, 1024}, {30, 128, 4096}} {
				cl := randLinear(p.rng, checkpoint.FormatBF16, sh.out, sh.in)
				cw, err := p.c.PrepareLinear(cl)
				must(t, err)
				gw, err := p.g.PrepareLinear(cl)
				must(t, err)
				v := make([]float32, sh.m*sh.in)
				for i := range v {
					v[i] = float32(p.rng.NormFloat64()) * 1.2345678
				}
				xf := p.from(sh.m, sh.in, v)
				o := p.out(sh.m, sh.out)
				must(t, p.c.LinearF32(xf.c, cw, o.c))
				must(t, p.g.LinearF32(xf.g, gw, o.g))
				p.check(fmt.Sprintf("linear-f32 dec %dx%dx%d", sh.m, sh.out, sh.in), o, 1e-5)
			}
			// Grouped output projection: 8 groups of R=128 rows over K=256 columns each.
			// Faithful: up to 32 rows linear_bf16_dec (1, 2 and 4 token tiles), 33
			// linear_bf16; exact: the decode GEMV up to 8 rows, then the tiled fp32 kernel.
			const groups, R, K = 8, 128, 256
			for _, f := range []checkpoint.Format{checkpoint.FormatBF16, checkpoint.FormatFP8Block} {
				cl := randLinear(p.rng, f, groups*R, K)
				cw, err := p.c.PrepareLinear(cl)
				must(t, err)
				gw, err := p.g.PrepareLinear(cl)
				must(t, err)
				for _, m := range []int{1, 3, 9, 17, 33} {
					x := p.rand(m, groups*K, 1)
					o := p.out(m, groups*R)
					must(t, p.c.GroupedOutProj(x.c, cw, groups, o.c))
					must(t, p.g.GroupedOutProj(x.g, gw, groups, o.g))
					p.check(fmt.Sprintf("grouped out proj %v m=%d", f, m), o, 1e-2)
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
func TestSharedInputLinears(t *testing.T) {
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
			multi := p.g
			for _, c := range []struct {
				name  string
				m, in int
				ls    []lin
				pair  bool // the first two run as one launch (faithful)
				big   bool // faithful only
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
				if c.big && mode != backend.Faithful {
					continue
				}
				tag := fmt.Sprintf("%s m=%d", c.name, c.m)
				var cws, gws []backend.Linear
				var outs []twin
				for _, l := range c.ls {
					cl := randLinear(p.rng, l.f, l.out, c.in)
					cw, err := p.c.PrepareLinear(cl)
					must(t, err)
					gw, err := p.g.PrepareLinear(cl)
					must(t, err)
					cws, gws = append(cws, cw), append(gws, gw)
					outs = append(outs, p.out(c.m, l.out))
				}
				x := p.rand(c.m, c.in, 1)
				gouts := make([]backend.Tensor, len(outs))
				for i, o := range outs {
					gouts[i] = o.g
					must(t, p.c.Linear(x.c, cws[i], o.c))
				}
				must(t, multi.Linears(x.g, gws, gouts))
				for i, o := range outs {
					tag := fmt.Sprintf("%s #%d", tag, i)
					p.check("linears "+tag, o, 1e-2)
					sep := p.out(c.m, gws[i].Out())
					must(t, p.g.Linear(x.g, gws[i], sep.g))
					equalBits(t, p.g, tag, o.g, sep.g)
				}
				if mode == backend.Faithful && len(c.ls) >= 2 && c.ls[0].f == fp8 && c.ls[1].f == fp8 {
					checkPairLaunch(t, p, tag, x, gws[0].(*linear), gws[1].(*linear), c.pair)
				}
				p.release()
			}
			if err := multi.Linears(p.rand(1, 64, 1).g, nil, []backend.Tensor{p.out(1, 8).g}); err == nil {
				t.Error("Linears accepted one output for no weights")
			}
		})
	}
}

// checkPairLaunch runs l0 and l1 on x as one LinearFP8PairF32 launch and as
// two LinearFP8F32 launches (outputs poisoned) and requires the same bits;
// pair says whether the shapes make one launch.
func checkPairLaunch(t *testing.T, p *pair, tag string, x twin, l0, l1 *linear, pair bool) {
	t.Helper()
	g := p.g.(*Backend)
	m, k := x.g.Rows(), x.g.Cols()
	buf, err := g.scratch(fp8Bytes(m, k))
	must(t, err)
	defer buf.Free()
	q, qs := fp8Layout(buf.Ptr, m, k)
	must(t, cuda.QuantFP8F32(g.s, q, qs, 0, x.g.(*Tensor).ptr, m, k, k, 128))
	a, b := p.out(m, l0.out), p.out(m, l1.out)
	ok, err := cuda.LinearFP8PairF32(g.s, q, qs, m, k, cuda.DecLinear{YF: a.g.(*Tensor).ptr, W: l0.w.Ptr, WS: l0.scale.Ptr, N: l0.out},
		cuda.DecLinear{YF: b.g.(*Tensor).ptr, W: l1.w.Ptr, WS: l1.scale.Ptr, N: l1.out})
	must(t, err)
	if ok != pair {
		t.Fatalf("%s: pair launch %v, want %v", tag, ok, pair)
	}
	if !ok {
		return
	}
	for i, l := range []*linear{l0, l1} {
		sep := p.out(m, l.out)
		y, err := g.scratch(2 * m * l.out)
		must(t, err)
		must(t, cuda.LinearFP8F32(g.s, sep.g.(*Tensor).ptr, y.Ptr, q, qs, l.w.Ptr, l.scale.Ptr, m, l.out, k, 0))
		y.Free()
		equalBits(t, g, fmt.Sprintf("%s pair launch #%d", tag, i), []backend.Tensor{a.g, b.g}[i], sep.g)
	}
}
