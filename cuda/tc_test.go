package cuda

import (
	"strings"
	"testing"
)

// The tcgen05 kernels are selected on compute capability 10.x only, with a
// tensor-map driver and the opt-in shared memory of their largest ring.
func TestTCSelection(t *testing.T) {
	const b200Smem = 232448 // cudaDevAttrMaxSharedMemoryPerBlockOptin of sm_100
	for _, tc := range []struct {
		name         string
		major, minor int
		smem         int
		maps, want   bool
	}{
		{"A100 (8.0)", 8, 0, 166912, true, false},
		{"L40 (8.9)", 8, 9, 101376, true, false},
		{"H100 (9.0)", 9, 0, 232448, true, false},
		{"B200 (10.0)", 10, 0, b200Smem, true, true},
		{"B300 (10.3)", 10, 3, b200Smem, true, true},
		{"B200 without tensor maps", 10, 0, b200Smem, false, false},
		{"10.0 with little shared memory", 10, 0, 100 * 1024, true, false},
		{"RTX 50 (12.0)", 12, 0, 101376, true, false},
	} {
		if got := tcCapable(tc.major, tc.minor, tc.smem, tc.maps); got != tc.want {
			t.Errorf("%s: tcCapable = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestTCPlan(t *testing.T) {
	for _, tc := range []struct{ rows, want int }{{1, 16}, {16, 16}, {17, 32}, {64, 64}, {65, 128}, {4096, 128}} {
		if got := tcTile(tc.rows); got != tc.want {
			t.Errorf("tcTile(%d) = %d, want %d", tc.rows, got, tc.want)
		}
	}
	for _, bt := range tcTiles {
		for _, bf16 := range []bool{false, true} {
			if s := tcSmem(bt, bf16); s > 232448 || s%8 != 0 {
				t.Errorf("tcSmem(%d, %v) = %d: over sm_100's opt-in limit or unaligned", bt, bf16, s)
			}
		}
	}
	// MoE: the tile list of the tcgen05 path fits the scratch of the paths
	// MoEScratchBytes sizes without a device (decode and tiled shapes).
	for _, sh := range []MoEShape{{Experts: 256, Rows: 6, N: 4096, K: 2048}, {Experts: 256, Rows: 6 * 4096, N: 4096, K: 2048}, {Experts: 8, Rows: 3, N: 256, K: 128},
		{Experts: 256, Rows: 6 * 4096, N: 4096, K: 2048, Format: NVFP4}} {
		tcb := planMoE(sh, PathTC, 148).scratchBytes(sh)
		other := 0
		for _, p := range moePaths(sh) {
			other = max(other, planMoE(sh, p, 148).scratchBytes(sh))
		}
		if tcb > other {
			t.Errorf("%+v: tcgen05 scratch %d > %d", sh, tcb, other)
		}
	}
}

// MoEGateUpSwiGLU rejects bad operands before it touches the stream.
func TestMoEGateUpArgs(t *testing.T) {
	ok := MoEGateUpArgs{HQ: 1, HS: 1, W1: 1, S1: 1, W3: 1, S3: 1, Perm: 1, Weights: 1, Stride: 256,
		Shape: MoEShape{Experts: 4, Rows: 8, N: 256, K: 512}}
	for _, tc := range []struct {
		name string
		edit func(a *MoEGateUpArgs)
		want string
	}{
		{"K not a multiple of 128", func(a *MoEGateUpArgs) { a.Shape.K = 200 }, "bad shape"},
		{"intermediate not a multiple of 128", func(a *MoEGateUpArgs) { a.Shape.N, a.Stride = 200, 200 }, "intermediate 200"},
		{"stride below the intermediate", func(a *MoEGateUpArgs) { a.Stride = 128 }, "expert stride 128"},
		{"no output", func(a *MoEGateUpArgs) { a.HS = 0 }, "missing"},
		{"no up weights", func(a *MoEGateUpArgs) { a.W3 = 0 }, "missing"},
		{"no routing weights", func(a *MoEGateUpArgs) { a.Weights = 0 }, "missing"},
		{"NVFP4 without global scales", func(a *MoEGateUpArgs) { a.Shape.Format, a.G1 = NVFP4, 1 }, "global scales"},
	} {
		a := ok
		tc.edit(&a)
		err := MoEGateUpSwiGLU(nil, a)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.want)
		}
	}
}
