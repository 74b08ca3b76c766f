package opcheck

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/rope"
)

// The CUDA backend is what CheckOps is for.
var _ Device = (*gpu.Backend)(nil)

// openGPU opens a GPU backend, skipping t on machines without one; it is
// closed when t ends.
func openGPU(t *testing.T) *gpu.Backend {
	t.Helper()
	g, err := gpu.New(gpu.Options{})
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

// tinyDims keep every CheckOps group to milliseconds on the CPU side.
func tinyDims() OpDims {
	return OpDims{Name: "tiny", Dim: 256, Heads: 4, HeadDim: 128, RopeDim: 64, QLora: 128, OGroups: 2, OLora: 128,
		HcMult: 4, Sinkhorn: 20, Window: 16, IndexHeads: 4, IndexHeadDim: 64, IndexTopK: 12,
		Experts: 32, TopK: 3, Inter: 128, ExpertSample: 8, Vocab: 1000,
		SwigluLimit: 10, RouteScale: 1.5, NormEps: 1e-6, HcEps: 1e-6, RopeTheta: 10000, CompressTheta: 160000,
		YaRN:   &rope.YaRN{Factor: 16, OriginalLen: 65536, BetaFast: 32, BetaSlow: 1},
		Tokens: []int{1, 5, 67}, BigTokens: []int{1, 9, 130}, HeadRows: []int{1, 3},
		Prefill: 300, Prefill2: 37, DecodeSteps: 3, HashRows: 50}
}

func TestCheckOpsTiny(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			g := openGPU(t)
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			rows := CheckOps(g, tinyDims(), mode, seed, "", t)
			if len(rows) < 50 {
				t.Errorf("only %d rows", len(rows))
			}
			for _, r := range rows {
				t.Log(FormatRow(r))
				if !r.Pass {
					t.Errorf("failed: %s", FormatRow(r))
				}
			}
		})
	}
}

// TestCheckOpsExpertsPaths: the routed-expert ops against the CPU with each
// decode MoE kernel forced: moe_fp4_decf16, decmap (the default on 8-row
// tiles), decpre (its weight loads before the PDL wait: the layer's tile
// lists are settled) and moe_fp4_dec after a tile_map launch.
func TestCheckOpsExpertsPaths(t *testing.T) {
	g := openGPU(t)
	defer func() {
		if err := g.Context().SetKernelChoice(cuda.KernelChoice{}); err != nil {
			t.Error(err)
		}
	}()
	for _, path := range []cuda.Path{cuda.PathDecF16, cuda.PathDecMap, cuda.PathDecPre, cuda.PathDec} {
		t.Run(string(path), func(t *testing.T) {
			if err := g.Context().SetKernelChoice(cuda.KernelChoice{MoE: path}); err != nil {
				t.Fatal(err)
			}
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			rows := CheckOps(g, tinyDims(), backend.Faithful, seed, "experts", t)
			if len(rows) == 0 {
				t.Fatal("no rows")
			}
			for _, r := range rows {
				t.Log(FormatRow(r))
				if !r.Pass {
					t.Errorf("failed: %s", FormatRow(r))
				}
			}
		})
	}
}

// TestCheckOpsLinearPaths: the linear ops (Linear, Linears, NormLinears,
// SwiGLULinear) against the CPU with each decode FP8 linear path forced:
// linear_fp8_dsk (decsk), the in-CTA kernels (deccta) and linear_fp8_dec.
// A model width of 1024 (8 K blocks) makes linear_fp8_dsk split its row
// groups over CTAs at 1, 9 and 16 rows.
func TestCheckOpsLinearPaths(t *testing.T) {
	g := openGPU(t)
	defer func() {
		if err := g.Context().SetKernelChoice(cuda.KernelChoice{}); err != nil {
			t.Error(err)
		}
	}()
	d := tinyDims()
	d.Dim, d.BigTokens = 1024, []int{1, 9, 16}
	for _, path := range []cuda.Path{cuda.PathDecSK, cuda.PathDecCTA, cuda.PathDec} {
		t.Run(string(path), func(t *testing.T) {
			if err := g.Context().SetKernelChoice(cuda.KernelChoice{Linear: path}); err != nil {
				t.Fatal(err)
			}
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			rows := CheckOps(g, d, backend.Faithful, seed, "linear", t)
			if len(rows) == 0 {
				t.Fatal("no rows")
			}
			for _, r := range rows {
				t.Log(FormatRow(r))
				if !r.Pass {
					t.Errorf("failed: %s", FormatRow(r))
				}
			}
		})
	}
}

// cpuDevice stands in for the GPU so the CheckOps plumbing runs everywhere.
type cpuDevice struct{ *cpu.Backend }

func (d cpuDevice) Poison(t backend.Tensor) error {
	ct := t.(*cpu.Tensor)
	for i := range ct.F {
		ct.F[i] = float32(math.NaN())
	}
	for i := range ct.I {
		ct.I[i] = -7
	}
	return nil
}

func (d cpuDevice) UploadI32(t backend.Tensor, v []int32) error {
	copy(t.(*cpu.Tensor).I, v)
	return nil
}

func (d cpuDevice) NewVec(v []float32) (backend.Vec, error) { return cpu.NewVec(v), nil }

func (d cpuDevice) NewMat(r, c int, v []float32) (backend.Mat, error) {
	return cpu.NewMat(r, c, v), nil
}

func (d cpuDevice) NewHC(mix, width int, fn, base, scale []float32) (backend.HC, error) {
	return cpu.NewHC(mix, width, fn, base, scale), nil
}

func (d cpuDevice) Sync() error { return nil }

// TestCheckOpsCPU runs CheckOps' plumbing with the CPU on both sides: every
// row must match exactly and no group may abort.
func TestCheckOpsCPU(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		rows := CheckOps(cpuDevice{cpu.New(cpu.Options{})}, tinyDims(), mode, 1, "", t)
		for _, r := range rows {
			t.Log(FormatRow(r))
		}
		groups := map[string]bool{}
		for _, r := range rows {
			if !r.Pass || r.Rel != 0 || r.Cos < 1-1e-12 {
				t.Errorf("%s", FormatRow(r))
			}
			groups[strings.Fields(r.Name)[2]] = true
		}
		if len(rows) < 50 || len(groups) < 15 {
			t.Errorf("%v: %d rows over ops %v", mode, len(rows), groups)
		}
	}
}

func TestPresetDims(t *testing.T) {
	for _, c := range []struct {
		d                         OpDims
		dim, heads, experts, topK int
	}{{FlashDims(), 4096, 64, 256, 512}, {ProDims(), 7168, 128, 384, 1024}} {
		d := c.d
		if d.Dim != c.dim || d.Heads != c.heads || d.Experts != c.experts || d.IndexTopK != c.topK || d.YaRN == nil {
			t.Errorf("%s: %+v", d.Name, d)
		}
		if d.Heads*d.HeadDim%d.OGroups != 0 || d.HeadDim-d.RopeDim <= 0 || d.ExpertSample < d.TopK+2 {
			t.Errorf("%s: inconsistent dims %+v", d.Name, d)
		}
	}
}

// TestCopySlotGPU runs the copy groups alone (the prefix cache's snapshot
// and restore, and the copy-on-write of a partial block), in both numerics.
func TestCopySlotGPU(t *testing.T) {
	for _, c := range []struct {
		group string
		mode  backend.Numerics
	}{{"copy_slot", backend.Faithful}, {"copy_slot", backend.Exact}, {"copy_block", backend.Faithful}, {"copy_block", backend.Exact}} {
		t.Run(c.group+"/"+c.mode.String(), func(t *testing.T) {
			g := openGPU(t)
			rows := CheckOps(g, tinyDims(), c.mode, 1, c.group, t)
			if len(rows) < 9 {
				t.Errorf("only %d rows", len(rows))
			}
			for _, r := range rows {
				if !r.Pass {
					t.Errorf("failed: %s", FormatRow(r))
				}
			}
		})
	}
}
