package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/rope"
)

// epilogueDims are the head shapes of the fused attention epilogues: the
// Flash and small models' (YaRN and plain frequencies), a width the
// float4 RMSNorm path does not take, and one above head_norm's 512-value chunk.
type epilogueDim struct {
	name          string
	heads, hd, rd int
	theta         float64
	yarn          *rope.YaRN
}

func epilogueDims() []epilogueDim {
	f, s := opcheck.FlashDims(), checkpoint.SmallConfig()
	return []epilogueDim{
		{"flash", f.Heads, f.HeadDim, f.RopeDim, f.CompressTheta, f.YaRN},
		{"small", s.Heads, s.HeadDim, s.RopeDim, s.RopeTheta, nil},
		{"odd", 3, 130, 66, 10000, nil},
		{"wide", 2, 576, 64, 160000, f.YaRN},
	}
}

// epilogueBatch is a row layout and the rope directions it is run with.
type epilogueBatch struct {
	name    string
	bt      *backend.Batch
	inverse []bool
}

// epilogueBatches are decode rows at scattered positions, and a prefill
// chunk with two decode rows.
func epilogueBatches() []epilogueBatch {
	var far []int
	for i := range 17 {
		far = append(far, (i*389_171+4_099)%(1<<20))
	}
	ones := func(n int) []int {
		r := make([]int, n)
		for i := range r {
			r[i] = 1
		}
		return r
	}
	fwd := []bool{false}
	return []epilogueBatch{
		{"decode 1", opcheck.StepBatch([]int{70001}, ones(1)), fwd},
		{"decode 3", opcheck.StepBatch([]int{5, 131071, 999}, ones(3)), []bool{false, true}},
		{"decode 17", opcheck.StepBatch(far, ones(17)), fwd},
		{"prefill 19+2", opcheck.StepBatch([]int{300, 12, 65536}, []int{19, 1, 1}), fwd},
	}
}

// equalBits requires two F32 GPU tensors to hold the same bits (NaN
// payloads included) and returns got's values.
func equalBits(t *testing.T, g opcheck.Device, name string, got, want backend.Tensor) []float32 {
	t.Helper()
	a, b := make([]float32, got.Rows()*got.Cols()), make([]float32, want.Rows()*want.Cols())
	must(t, g.Download(got, a))
	must(t, g.Download(want, b))
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("%s: element %d (row %d col %d) is %g (%#x), the separate ops give %g (%#x)", name, i,
				i/got.Cols(), i%got.Cols(), a[i], math.Float32bits(a[i]), b[i], math.Float32bits(b[i]))
		}
	}
	return a
}

// fusedSameBits requires got and want to hold the same finite fp32 bits.
func fusedSameBits(t *testing.T, g opcheck.Device, name string, got, want backend.Tensor) {
	t.Helper()
	for i, v := range equalBits(t, g, name, got, want) {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("%s: element %d is %g in both", name, i, v)
		}
	}
}

// TestHeadNormRope: the fused q epilogue gives the bits of HeadNorm then
// Rope on the GPU, and the CPU's result within the separate ops' tolerances.
func TestHeadNormRope(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			fused := p.G
			for _, d := range epilogueDims() {
				fr, err := rope.New(d.rd, d.theta, d.yarn)
				must(t, err)
				for _, bc := range epilogueBatches() {
					n := bc.bt.Rows()
					heads := d.heads
					if n > 3 {
						heads = min(heads, 3) // the head count only indexes; keep emulation short
					}
					for _, inv := range bc.inverse {
						tag := fmt.Sprintf("%s %s %dx%dx%d inverse=%v", d.name, bc.name, n, heads, d.hd, inv)
						v := make([]float32, n*heads*d.hd)
						for i := range v { // per-head magnitudes 1e-3…1e2: the bf16 steps round differently
							s := math.Pow(10, float64((i/d.hd)%6)-3)
							v[i] = num.RoundBF16(float32(p.Rng.NormFloat64() * s))
						}
						a := backend.RopeArgs{Freqs: fr, HeadDim: d.hd, Inverse: inv}
						x, sep := p.From(n, heads*d.hd, v), p.From(n, heads*d.hd, v)
						must(t, fused.HeadNormRope(x.G, 1e-6, a, bc.bt))
						must(t, p.G.HeadNorm(sep.G, d.hd, 1e-6))
						must(t, p.G.Rope(sep.G, a, bc.bt))
						fusedSameBits(t, p.G, "head norm rope "+tag, x.G, sep.G)
						must(t, p.C.HeadNormRope(x.C, 1e-6, a, bc.bt))
						p.Check("head norm rope "+tag, x, 2e-3)
					}
				}
			}
			bt := opcheck.StepBatch([]int{0}, []int{1})
			fr, err := rope.New(64, 10000, nil)
			must(t, err)
			if err := fused.HeadNormRope(p.Rand(1, 96, 1).G, 1e-6, backend.RopeArgs{Freqs: fr, HeadDim: 48}, bt); err == nil {
				t.Error("head norm rope accepted rope dims 64 > head dim 48")
			}
		})
	}
}

// TestNormRopeKVQuant: the fused kv epilogue gives the bits of RMSNorm,
// Rope and KVQuant on the GPU (outputs poisoned first), and the CPU's
// result within the separate ops' tolerances (a bf16 step of the norm can
// move an FP8 value a whole e4m3 step: 2e-2 in faithful mode).
func TestNormRopeKVQuant(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			fused := p.G
			lim := 2e-3
			if mode == backend.Faithful {
				lim = 2e-2
			}
			for _, d := range epilogueDims() {
				fr, err := rope.New(d.rd, d.theta, d.yarn)
				must(t, err)
				nope := (d.hd - d.rd) / 64 * 64
				wv := make([]float32, d.hd)
				for i := range wv {
					wv[i] = num.RoundBF16(float32(1 + 0.1*p.Rng.NormFloat64()))
				}
				w, err := p.G.NewVec(wv)
				must(t, err)
				cw := cpu.NewVec(wv)
				for _, bc := range epilogueBatches() {
					n := bc.bt.Rows()
					for _, inv := range bc.inverse {
						tag := fmt.Sprintf("%s %s %dx%d nope %d inverse=%v", d.name, bc.name, n, d.hd, nope, inv)
						v := make([]float32, n*d.hd)
						for i := range v { // per-row magnitudes 1e-2…1e2
							s := math.Pow(10, float64((i/d.hd)%5)-2)
							v[i] = num.RoundBF16(float32(p.Rng.NormFloat64() * s))
						}
						x := p.From(n, d.hd, v)
						a := backend.RopeArgs{Freqs: fr, HeadDim: d.hd, Inverse: inv}
						o, sep := p.Out(n, d.hd), p.Out(n, d.hd)
						must(t, fused.NormRopeKVQuant(x.G, w, 1e-6, a, nope, 64, bc.bt, o.G))
						must(t, p.G.RMSNorm(x.G, w, 1e-6, sep.G))
						must(t, p.G.Rope(sep.G, a, bc.bt))
						must(t, p.G.KVQuant(sep.G, nope, 64))
						fusedSameBits(t, p.G, "norm rope kv quant "+tag, o.G, sep.G)
						must(t, p.C.NormRopeKVQuant(x.C, cw, 1e-6, a, nope, 64, bc.bt, o.C))
						p.Check("norm rope kv quant "+tag, o, lim)
					}
				}
			}
			// The fused kernel needs the FP8 blocks clear of the rope dims.
			fr, err := rope.New(64, 10000, nil)
			must(t, err)
			w, err := p.G.NewVec(make([]float32, 128))
			must(t, err)
			bt := opcheck.StepBatch([]int{0}, []int{1})
			x, o := p.Rand(1, 128, 1), p.Out(1, 128)
			for _, nope := range []int{128, 32} {
				if err := fused.NormRopeKVQuant(x.G, w, 1e-6, backend.RopeArgs{Freqs: fr, HeadDim: 128}, nope, 64, bt, o.G); err == nil {
					t.Errorf("norm rope kv quant accepted nope %d of 128 with 64 rope dims, blocks of 64", nope)
				}
			}
		})
	}
}

// TestRopeHadamardFP4: the fused indexer q epilogue gives the bits of Rope
// then HadamardFP4 on the GPU, and the CPU's result within rope's tolerance
// (faithful: a bf16 step of the rope can move an FP4 value a whole e2m1
// step).
func TestRopeHadamardFP4(t *testing.T) {
	f := opcheck.FlashDims()
	lims := map[backend.Numerics]float64{backend.Faithful: 2e-2, backend.Exact: 2e-3}
	for _, mode := range hcModes {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			for _, d := range []struct {
				name          string
				heads, hd, rd int
				theta         float64
				yarn          *rope.YaRN
			}{
				{"flash indexer", f.IndexHeads, f.IndexHeadDim, f.RopeDim, f.CompressTheta, f.YaRN},
				{"small", 2, 32, 16, 10000, nil},
				{"rope over the whole head", 1, 64, 64, 10000, nil},
			} {
				fr, err := rope.New(d.rd, d.theta, d.yarn)
				must(t, err)
				for _, bc := range epilogueBatches() {
					n := bc.bt.Rows()
					heads := d.heads
					if n > 3 {
						heads = min(heads, 3) // the head count only indexes; keep emulation short
					}
					for _, inv := range bc.inverse {
						tag := fmt.Sprintf("%s %s %dx%dx%d inverse=%v", d.name, bc.name, n, heads, d.hd, inv)
						v := make([]float32, n*heads*d.hd)
						for i := range v { // per-head magnitudes 1e-3…1e2, and all-zero heads (the FP4 amax floor)
							if h := i / d.hd; h%7 != 6 {
								v[i] = num.RoundBF16(float32(p.Rng.NormFloat64() * math.Pow(10, float64(h%6)-3)))
							}
						}
						a := backend.RopeArgs{Freqs: fr, HeadDim: d.hd, Inverse: inv}
						x, sep := p.From(n, heads*d.hd, v), p.From(n, heads*d.hd, v)
						must(t, p.G.RopeHadamardFP4(x.G, a, bc.bt))
						must(t, p.G.Rope(sep.G, a, bc.bt))
						must(t, p.G.HadamardFP4(sep.G, d.hd))
						fusedSameBits(t, p.G, "rope hadamard "+tag, x.G, sep.G)
						must(t, p.C.RopeHadamardFP4(x.C, a, bc.bt))
						p.Check("rope hadamard "+tag, x, lims[mode])
					}
				}
			}
			bt := opcheck.StepBatch([]int{0}, []int{1})
			fr, err := rope.New(16, 10000, nil)
			must(t, err)
			for _, c := range []struct {
				name string
				cols int
				a    backend.RopeArgs
			}{
				{"head dim 48 (not a power of two)", 96, backend.RopeArgs{Freqs: fr, HeadDim: 48}},
				{"rope dims 16 > head dim 8", 16, backend.RopeArgs{Freqs: fr, HeadDim: 8}},
				{"no frequencies", 64, backend.RopeArgs{HeadDim: 64}},
			} {
				if err := p.G.RopeHadamardFP4(p.Rand(1, c.cols, 1).G, c.a, bt); err == nil {
					t.Errorf("rope hadamard accepted %s", c.name)
				}
			}
		})
	}
}
