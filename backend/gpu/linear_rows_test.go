package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
)

// TestLinearRowsAlone: the linears of bf16 weights on gemvr (LinearF32 at
// 2-4 rows: the head, the compressors, the router gate; Linear at 2-8:
// weights_proj, rounded to bf16 in faithful numerics) give each row the bits
// the same op gives that row alone, so a sequence's logits do not depend on the rows beside it
// (a verification row's equal plain decoding's); and the CPU's values
// within the fp32 linear's limit.
func TestLinearRowsAlone(t *testing.T) {
	const out, in, rows = 516, 264, 8
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			cl := opcheck.RandLinear(p.Rng, checkpoint.FormatBF16, out, in)
			cw, err := p.C.PrepareLinear(cl)
			must(t, err)
			gw, err := p.G.PrepareLinear(cl)
			must(t, err)
			v := make([]float32, rows*in)
			for i := range v {
				v[i] = float32(p.Rng.NormFloat64()) * 1.2345678
			}
			for _, op := range []struct {
				name string
				run  func(b backend.Backend, x backend.Tensor, w backend.Linear, o backend.Tensor) error
				lim  float64
			}{
				{"linear-f32", backend.Backend.LinearF32, 1e-5},
				{"linear", backend.Backend.Linear, 1e-2},
			} {
				alone := make([]float32, rows*out)
				for i := range rows {
					x, o := p.From(1, in, v[i*in:(i+1)*in]), p.Out(1, out)
					must(t, op.run(p.G, x.G, gw, o.G))
					must(t, p.G.Download(o.G, alone[i*out:(i+1)*out]))
				}
				for _, m := range []int{2, 3, 5, 8} {
					x, o := p.From(m, in, v[:m*in]), p.Out(m, out)
					must(t, op.run(p.C, x.C, cw, o.C))
					must(t, op.run(p.G, x.G, gw, o.G))
					name := fmt.Sprintf("%s %d rows", op.name, m)
					p.Check(name, o, op.lim)
					got := make([]float32, m*out)
					must(t, p.G.Download(o.G, got))
					if op.name == "linear-f32" && m > gemvRowsMax {
						continue // linear_bf16x3_dec: its own summation order
					}
					for i, g := range got {
						if math.Float32bits(g) != math.Float32bits(alone[i]) {
							t.Fatalf("%s: y[%d, %d] = %g, the row alone gives %g", name, i/out, i%out, g, alone[i])
						}
					}
				}
			}
		})
	}
}
