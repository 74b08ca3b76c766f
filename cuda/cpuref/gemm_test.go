package cpuref

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The GEMM twins against plain dequantize-then-matmul.
func TestLinearFP8MatchesDequant(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	m, n, k := 3, 136, 256
	xq, w := make([]byte, m*k), make([]byte, n*k)
	for i := range xq {
		xq[i] = byte(r.IntN(256)) & 0xBF
	}
	for i := range w {
		w[i] = byte(r.IntN(256)) & 0xBF
	}
	xs, ws := make([]byte, m*k/128), make([]byte, 2*k/128)
	for i := range xs {
		xs[i] = byte(120 + r.IntN(10))
	}
	for i := range ws {
		ws[i] = byte(120 + r.IntN(10))
	}
	ref := make([]float64, m*n)
	LinearFP8(ref, xq, xs, w, ws, m, n, k, nil)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var want float64
			for kk := 0; kk < k; kk++ {
				a := float64(E4M3ToF32(xq[i*k+kk])) * float64(E8M0ToF32(xs[i*(k/128)+kk/128]))
				b := float64(E4M3ToF32(w[j*k+kk])) * float64(E8M0ToF32(ws[(j/128)*(k/128)+kk/128]))
				want += a * b
			}
			if d := math.Abs(ref[i*n+j] - want); d > 1e-9*math.Max(1, math.Abs(want)) {
				t.Fatalf("(%d,%d): %g vs %g", i, j, ref[i*n+j], want)
			}
		}
	}
}

func TestMoEFP4MatchesDequant(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, f := range []Format{MXFP4, NVFP4} {
		E, M, n, k := 4, 7, 16, 256
		group := 32
		if f == NVFP4 {
			group = 16
		}
		off := []int32{1, 1, 4, 4, 6} // row 0 and 6 owned by nobody, expert 0 and 2 empty
		xq := make([]byte, M*k)
		for i := range xq {
			xq[i] = byte(r.IntN(256)) & 0xBF
		}
		xs := make([]byte, M*k/128)
		for i := range xs {
			xs[i] = byte(120 + r.IntN(10))
		}
		w := make([]byte, E*n*k/2)
		for i := range w {
			w[i] = byte(r.IntN(256))
		}
		ws := make([]byte, E*n*k/group)
		for i := range ws {
			if f == NVFP4 {
				ws[i] = byte(0x20 + r.IntN(0x30))
			} else {
				ws[i] = byte(118 + r.IntN(8))
			}
		}
		gs := []float32{1, 0.5, 0.25, 0.125}
		ref := make([]float64, M*n)
		MoEFP4(ref, xq, xs, off, w, ws, gs, f, E, M, n, k, nil)
		for row := 0; row < M; row++ {
			e := -1
			for ee := 0; ee < E; ee++ {
				if row >= int(off[ee]) && row < int(off[ee+1]) {
					e = ee
				}
			}
			for c := 0; c < n; c++ {
				got := ref[row*n+c]
				if e < 0 {
					if !math.IsNaN(got) {
						t.Fatalf("%v: row %d owned by no expert was computed", f, row)
					}
					continue
				}
				var want float64
				for kk := 0; kk < k; kk++ {
					code := w[(e*n+c)*k/2+kk/2] >> (4 * (kk % 2)) & 15
					s := ws[(e*n+c)*(k/group)+kk/group]
					wv := float64(E2M1ToF32(code))
					if f == NVFP4 {
						wv *= float64(E4M3ToF32(s)) * float64(gs[e])
					} else {
						wv *= float64(E8M0ToF32(s))
					}
					want += wv * float64(E4M3ToF32(xq[row*k+kk])) * float64(E8M0ToF32(xs[row*(k/128)+kk/128]))
				}
				if d := math.Abs(got - want); d > 1e-9*math.Max(1, math.Abs(want)) {
					t.Fatalf("%v (%d,%d): %g vs %g", f, row, c, got, want)
				}
			}
		}
	}
}
