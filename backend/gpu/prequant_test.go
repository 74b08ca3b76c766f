package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/kcheck"
	"github.com/megamoe/megamoe/num"
)

// TestFusedLinearInputs: RMSNormQuant, SwiGLUQuant and HcPreNormQuant, whose kernels also
// write the FP8 input of the linears after them, give bit for bit what the
// separate ops give (RMSNorm or SwiGLU, then each Linear quantising its own
// input; HcPreNormQuant against HcPreNorm): the producer's output, the linears' outputs, and the quantised
// copy itself (QuantFP8F32 of the output). Exact numerics and inputs no FP8
// tensor-core linear takes keep the plain op (the handle is out itself).
// Shapes: the small config's q_norm (128) and shared expert (128), Flash's
// (1024, 2048) and Pro's (1536, 3072) with fewer linear outputs, 4608 for
// rmsnorm's loop past the cached values; a NaN poisons its row or block.
func TestFusedLinearInputs(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			g := p.G.(*Backend)
			fused := mode == backend.Faithful
			for _, c := range []struct {
				name    string
				rows, d int
				outs    []int // FP8 linears after the producer
				limit   float32
				nan     bool
			}{
				{"small", 1, 128, []int{768, 256}, 10, false},
				{"small", 3, 128, []int{256}, 10, true},
				{"flash", 17, 1024, []int{256, 128}, 10, false},
				{"flash", 16, 2048, []int{128}, 0, false},
				{"pro", 3, 1536, []int{256, 8}, 10, false},
				{"pro", 1, 3072, []int{128}, 10, true},
				{"wide", 2, 4608, []int{128}, 0, false},
			} {
				ws := make([]backend.Linear, len(c.outs))
				for i, n := range c.outs {
					var err error
					ws[i], err = g.PrepareLinear(opcheck.RandLinear(p.Rng, checkpoint.FormatFP8Block, n, c.d))
					must(t, err)
				}
				tag := fmt.Sprintf("%s %dx%d", c.name, c.rows, c.d)
				x := p.Rand(c.rows, c.d, 1)
				if c.nan {
					x.Host[c.rows/2*c.d+5] = float32(math.NaN()) // its row, or its 128-block
					x = p.From(c.rows, c.d, x.Host)
				}
				wv := make([]float32, c.d)
				for i := range wv {
					wv[i] = num.RoundBF16(float32(1 + 0.1*p.Rng.NormFloat64()))
				}
				w, err := g.NewVec(wv)
				must(t, err)
				checkFused(t, p, g, "rmsnorm "+tag, fused, ws, c.rows, c.d,
					func(out backend.Tensor) (backend.Tensor, error) { return g.RMSNormQuant(x.G, w, 1e-6, out, ws) },
					func(out backend.Tensor) error { return g.RMSNorm(x.G, w, 1e-6, out) },
					func(y, q, qs cuda.DevicePtr) error {
						return cuda.RMSNormQuantF32(g.s, y, q, qs, x.G.(*Tensor).ptr, w.(*vec).buf.Ptr, c.rows, c.d, 1e-6, true)
					})
				gate, up := p.Rand(c.rows, c.d, 3), p.Rand(c.rows, c.d, 3)
				if c.nan {
					gate.Host[c.rows/2*c.d+5] = float32(math.NaN())
					gate = p.From(c.rows, c.d, gate.Host)
				}
				checkFused(t, p, g, fmt.Sprintf("swiglu limit %g %s", c.limit, tag), fused, ws, c.rows, c.d,
					func(out backend.Tensor) (backend.Tensor, error) { return g.SwiGLUQuant(gate.G, up.G, c.limit, out, ws) },
					func(out backend.Tensor) error { return g.SwiGLU(gate.G, up.G, c.limit, out) },
					func(y, q, qs cuda.DevicePtr) error {
						return cuda.SwiGLUQuantF32(g.s, y, q, qs, gate.G.(*Tensor).ptr, up.G.(*Tensor).ptr, c.rows, c.d, c.limit, true)
					})
				// hc pre + norm over 4 streams of d (x's rows as the streams' values).
				const ns = 4
				a := backend.HcArgs{Streams: ns, Sinkhorn: 20, Eps: 1e-6, NormEps: 1e-6}
				_, hcp := p.HCParams((2+ns)*ns, ns, c.d, []float32{0.7, 1.3, 0.9})
				hx := p.Rand(c.rows, ns*c.d, 1)
				if c.nan {
					hx.Host[c.rows/2*ns*c.d+5] = float32(math.NaN())
					hx = p.From(c.rows, ns*c.d, hx.Host)
				}
				scratch := func() (backend.Tensor, backend.Tensor) { return p.Out(c.rows, c.d).G, p.Out(c.rows, ns+ns*ns).G }
				checkFused(t, p, g, "hc pre norm "+tag, fused, ws, c.rows, c.d,
					func(out backend.Tensor) (backend.Tensor, error) {
						o, mix := scratch()
						return g.HcPreNormQuant(hx.G, hcp, a, w, 1e-6, o, out, mix, ws)
					},
					func(out backend.Tensor) error {
						o, mix := scratch()
						return g.HcPreNorm(hx.G, hcp, a, w, 1e-6, o, out, mix)
					},
					func(y, q, qs cuda.DevicePtr) error {
						o, mix := scratch()
						hh := hcp.(*hc)
						ok, err := cuda.HcPreNormF32(g.s, y, o.(*Tensor).ptr, mix.(*Tensor).ptr, hx.G.(*Tensor).ptr, hh.fn.Ptr, hh.base.Ptr,
							w.(*vec).buf.Ptr, q, qs, c.rows, ns, c.d, [3]float32{hh.scale[0], hh.scale[1], hh.scale[2]}, a.Sinkhorn, a.Eps, a.NormEps, 1e-6, true)
						if err == nil && !ok {
							err = fmt.Errorf("hc_pre_fin_norm_quant not launched")
						}
						return err
					})
				// No FP8 tensor-core linear after it: the plain op.
				bl, err := g.PrepareLinear(opcheck.RandLinear(p.Rng, checkpoint.FormatBF16, 64, c.d))
				must(t, err)
				bf := []backend.Linear{bl}
				o := p.Out(c.rows, c.d)
				h, err := g.RMSNormQuant(x.G, w, 1e-6, o.G, bf)
				must(t, err)
				if h != o.G {
					t.Errorf("%s: RMSNormQuant quantised for a bf16 linear", tag)
				}
				p.Release()
			}
		})
	}
}

// checkFused runs the producer fused (fusedOp, then Linears on its handle)
// and separately (plainOp, then one Linear each) on poisoned outputs and
// requires the same bits; with fused it also checks the kernel's quantised
// copy (launched by kernel into poisoned buffers) against QuantFP8F32.
func checkFused(t *testing.T, p *opcheck.Pair, g *Backend, tag string, fused bool, ws []backend.Linear, rows, d int,
	fusedOp func(out backend.Tensor) (backend.Tensor, error), plainOp func(out backend.Tensor) error,
	kernel func(y, q, qs cuda.DevicePtr) error) {
	t.Helper()
	fo, so := p.Out(rows, d), p.Out(rows, d)
	h, err := fusedOp(fo.G)
	must(t, err)
	if (h != fo.G) != fused {
		t.Fatalf("%s: fused %v, want %v", tag, h != fo.G, fused)
	}
	var fouts, souts []backend.Tensor
	for _, w := range ws {
		fouts, souts = append(fouts, p.Out(rows, w.Out()).G), append(souts, p.Out(rows, w.Out()).G)
	}
	must(t, g.Linears(h, ws, fouts))
	must(t, plainOp(so.G))
	for i, w := range ws {
		must(t, g.Linear(so.G, w, souts[i]))
	}
	equalBits(t, g, tag+" output", fo.G, so.G)
	for i := range ws {
		equalBits(t, g, fmt.Sprintf("%s linear #%d", tag, i), fouts[i], souts[i])
	}
	if !fused {
		return
	}
	n := fp8Bytes(rows, d)
	got := download8(t, g, h.(*Tensor).q8.Ptr, n)
	g.Free(h)
	ref := poisoned(t, g, n)
	defer ref.Free()
	q, qs := fp8Layout(ref.Ptr, rows, d)
	must(t, cuda.QuantFP8F32(g.s, q, qs, 0, so.G.(*Tensor).ptr, rows, d, d, 128))
	want := download8(t, g, ref.Ptr, n)
	sameBytes(t, tag+" handle's codes", got, want, rows*d)
	kq := poisoned(t, g, n)
	defer kq.Free()
	ko := p.Out(rows, d)
	q, qs = fp8Layout(kq.Ptr, rows, d)
	must(t, kernel(ko.G.(*Tensor).ptr, q, qs))
	equalBits(t, g, tag+" kernel output", ko.G, so.G)
	sameBytes(t, tag+" kernel's codes", download8(t, g, kq.Ptr, n), want, rows*d)
}

// poisoned is an n-byte device buffer of 0xFF (e4m3 -NaN, a code the
// quantisation never writes).
func poisoned(t *testing.T, g *Backend, n int) *cuda.Buffer {
	t.Helper()
	buf, err := g.scratch(n)
	must(t, err)
	must(t, g.s.Memset8(buf.Ptr, 0xFF, n))
	return buf
}

func download8(t *testing.T, g *Backend, p cuda.DevicePtr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	must(t, g.s.CopyDtoH(b, p))
	must(t, g.s.Synchronize())
	return b
}

// sameBytes compares the codes [0, codes) and the scales after them
// (fp8Layout, codes/128 of them) of two quantised copies.
func sameBytes(t *testing.T, tag string, got, want []byte, codes int) {
	t.Helper()
	n := codes + codes/128
	for _, part := range []struct {
		what string
		a, b []byte
	}{{"code", got[:codes], want[:codes]}, {"scale", got[codes:n], want[codes:n]}} {
		if i := kcheck.FirstDiff(part.a, part.b); i >= 0 {
			t.Errorf("%s: %s byte %d is %#x, want %#x", tag, part.what, i, part.a[i], part.b[i])
		}
	}
}
