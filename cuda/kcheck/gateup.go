package kcheck

import (
	"bytes"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
)

// MoEGateUpCase checks MoEGateUpSwiGLU (the w1/w3 GEMM with the SwiGLU,
// clamp, routing weight and FP8 re-quantisation in its epilogue) for E
// experts, mTotal permuted rows, intermediate size inter and model width k:
// against the CPU twins (cpuref.MoEFP4 of w1 and w3 rounded to bf16,
// cpuref.SwiGLU, rounded to bf16, cpuref.QuantFP8Act), comparing the
// dequantised values; and bit for bit against the same device's unfused
// path (MoEFP4Tiles, then MoESwiGLUQuant), whose differing bytes count as
// mismatches. stacked puts w1 over w3 in one array (the backend's w13);
// apart, NVFP4's w1 and w3 have their own global scales. clamp sets the
// SwiGLU limit to half the largest |g|, |u| of the checked rows (else none).
// It needs a device where MoEGateUpFused holds.
func MoEGateUpCase(experts, mTotal, inter, k int, format cuda.FP4Format, route Routing, stacked, clamp bool, checkRows int) Case {
	shape := shapeStr("E=%d M=%d I=%d k=%d %s", experts, mTotal, inter, k, format)
	for _, f := range []struct {
		on   bool
		name string
	}{{route == RouteSkewed, " skewed"}, {route == RouteGap, " gap"}, {stacked, " w13"}, {!stacked, " w1,w3"}, {clamp, " clamp"}} {
		if f.on {
			shape += f.name
		}
	}
	sh := cuda.MoEShape{Experts: experts, Rows: mTotal, N: inter, K: k, Format: format}
	return Case{Component: "moe_gateup", Shape: shape, MoE: sh, Run: func(env *Env) Result {
		r := Result{Component: "moe_gateup", Shape: shape, Limit: LimitGEMM}
		rng := env.rng()
		counts, off, lead, tail := gateUpRows(rng, experts, mTotal, route)
		xq, xs := quantizeParallel(randBF16(rng, mTotal, k), mTotal, k)
		has := func(e int) bool { return counts[e] > 0 }
		// Gate and up weights: one [E][2·inter] array, or two [E][inter].
		var w1, w3 *moeWeights
		stride := inter
		if stacked {
			w1, stride = newMoEWeights(rng, experts, 2*inter, k, format, false, has), 2*inter
		} else {
			w1, w3 = newMoEWeights(rng, experts, inter, k, format, false, has), newMoEWeights(rng, experts, inter, k, format, false, has)
		}
		perm := rng.Perm(mTotal)
		weights := make([]float32, mTotal)
		for i := range weights {
			weights[i] = float32(0.05 + 2.5*rng.Float64())
		}
		rows := sampleOwned(rng, lead, mTotal-tail, checkRows)

		// The twin: g and u of the checked rows, rounded to bf16.
		cf, group := cpuref.MXFP4, 32
		if format == cuda.NVFP4 {
			cf, group = cpuref.NVFP4, 16
		}
		gate, up := make([]uint16, mTotal*inter), make([]uint16, mTotal*inter)
		var top float64
		round := func(dst []uint16, ref []float64, n, col int) {
			for _, m := range rows {
				for c := 0; c < inter; c++ {
					v := ref[m*n+col+c]
					top = math.Max(top, math.Abs(v))
					dst[m*inter+c] = cpuref.F32ToBF16(float32(v))
				}
			}
		}
		if stacked {
			ref := make([]float64, mTotal*2*inter)
			cpuref.MoEFP4(ref, xq, xs, off, w1.w, w1.ws, w1.gs, cf, experts, mTotal, 2*inter, k, rows)
			round(gate, ref, 2*inter, 0)
			round(up, ref, 2*inter, inter)
		} else {
			ref := make([]float64, mTotal*inter)
			cpuref.MoEFP4(ref, xq, xs, off, w1.w, w1.ws, w1.gs, cf, experts, mTotal, inter, k, rows)
			round(gate, ref, inter, 0)
			cpuref.MoEFP4(ref, xq, xs, off, w3.w, w3.ws, w3.gs, cf, experts, mTotal, inter, k, rows)
			round(up, ref, inter, 0)
		}
		limit, twinLimit := float32(0), float32(math.Inf(1)) // the twin clamps at any limit
		if clamp {
			limit = float32(top / 2)
			twinLimit = limit
		}
		wantQ, wantS := make([]byte, mTotal*inter), make([]byte, mTotal*inter/128)
		for _, m := range rows {
			h := make([]float64, inter)
			cpuref.SwiGLU(h, gate[m*inter:], up[m*inter:], inter, weights[perm[m]:perm[m]+1], 1, inter, twinLimit)
			hb := make([]uint16, inter)
			for c, v := range h {
				hb[c] = cpuref.F32ToBF16(float32(v))
			}
			cpuref.QuantFP8Act(wantQ[m*inter:(m+1)*inter], wantS[m*inter/128:(m+1)*inter/128], hb, 1, inter)
		}

		// The device: fused, then unfused on the same inputs.
		b := &bufs{env: env}
		defer b.free()
		dxq, dxs, doff := b.upload(xq), b.upload(xs), b.upload(cuda.Bytes(off))
		dperm, dwt := b.upload(cuda.Bytes(int32s(perm))), b.upload(cuda.Bytes(weights))
		up1 := func(mw *moeWeights) (w, s, g cuda.DevicePtr) {
			if mw == nil {
				return 0, 0, 0
			}
			w, s = b.upload(mw.w), b.upload(mw.ws)
			if format == cuda.NVFP4 {
				g = b.upload(cuda.Bytes(mw.gs))
			}
			return w, s, g
		}
		a := cuda.MoEGateUpArgs{XQ: dxq, XS: dxs, Stride: stride, Perm: dperm, Weights: dwt, Shape: sh, Limit: limit}
		a.W1, a.S1, a.G1 = up1(w1)
		a.W3, a.S3, a.G3 = up1(w3)
		if stacked {
			a.W3, a.S3, a.G3 = a.W1.Add(inter*k/2), a.S1.Add(inter*k/group), a.G1
		}
		sh13 := sh
		if stacked {
			sh13.N = 2 * inter
		}
		sb := max(cuda.MoEScratchBytes(env.S, sh), cuda.MoEScratchBytes(env.S, sh13))
		a.Scratch = b.alloc(sb)
		a.HQ, a.HS = b.alloc(mTotal*inter), b.alloc(mTotal*inter/128)
		refQ, refS := b.alloc(mTotal*inter), b.alloc(mTotal*inter/128)
		gu := b.alloc(2 * mTotal * 2 * inter)
		b.poison(a.Scratch, sb)
		for _, p := range []cuda.DevicePtr{a.HQ, refQ} {
			b.poison(p, mTotal*inter)
		}
		for _, p := range []cuda.DevicePtr{a.HS, refS} {
			b.poison(p, mTotal*inter/128)
		}
		if b.err != nil {
			return finish(r, b)
		}
		run := func() error {
			tl, err := cuda.MoETiles(env.S, doff, sh, a.Scratch)
			if err != nil {
				return err
			}
			a.Tiles = tl
			return cuda.MoEGateUpSwiGLU(env.S, a)
		}
		if r.Err = run(); r.Err != nil {
			return finish(r, b)
		}
		gotQ, gotS := make([]byte, mTotal*inter), make([]byte, mTotal*inter/128)
		b.download(gotQ, a.HQ)
		b.download(gotS, a.HS)
		r.Err = gateUpUnfused(env, a, sh13, stacked, doff, gu, refQ, refS)
		unQ, unS := make([]byte, mTotal*inter), make([]byte, mTotal*inter/128)
		b.download(unQ, refQ)
		b.download(unS, refS)
		if r.Err != nil || b.err != nil {
			return finish(r, b)
		}
		// moe_swiglu_q also writes the rows before offsets[0] (never any in
		// the backend, whose offsets start at 0): compare the owned rows.
		lo, hi := lead*inter, (mTotal-tail)*inter
		r.Mismatch = diffBytes(gotQ[lo:hi], unQ[lo:hi]) + diffBytes(gotS[lo/128:hi/128], unS[lo/128:hi/128])

		// Against the twin: dequantised values of the checked rows.
		var st ErrStats
		deq := func(q, s []byte, m, c int) float64 {
			return float64(cpuref.E4M3ToF32(q[m*inter+c])) * float64(cpuref.E8M0ToF32(s[m*inter/128+c/128]))
		}
		for _, m := range rows {
			for c := 0; c < inter; c++ {
				r.Checked++
				g := deq(gotQ, gotS, m, c)
				if math.IsNaN(g) || math.IsInf(g, 0) {
					r.NonFinite++
					continue
				}
				st.Add(deq(wantQ, wantS, m, c), g)
			}
		}
		r.Cos, r.RelErr, r.MaxAbs = st.Cos(), st.Rel(), st.MaxAbs
		// Every owned row written; rows owned by no expert untouched.
		for m := 0; m < mTotal; m++ {
			owned := m >= lead && m < mTotal-tail
			for c := 0; c < inter; c++ {
				if v := gotQ[m*inter+c]; owned && v == 0xFF {
					r.NonFinite++
				} else if !owned && v != 0xFF {
					r.Mismatch++
				}
			}
			for c := 0; c < inter/128; c++ {
				if v := gotS[m*inter/128+c]; owned == (v == 0xFF) {
					r.Mismatch++
				}
			}
		}
		r.TimeUs, r.Err = timeIt(env, run)
		active := 0
		for _, c := range counts {
			if c > 0 {
				active++
			}
		}
		r.GBs = float64(active)*float64(2*inter*k/2+2*inter*k/group) + float64(mTotal*(k+k/128+inter+inter/128))
		r.TFLOPs = 2 * float64(mTotal-lead-tail) * float64(2*inter) * float64(k)
		return finish(r, b)
	}}
}

// gateUpUnfused runs the unfused path of a: the w1/w3 GEMM (bf16 g and u
// in gu), then MoESwiGLUQuant into hq, hs.
func gateUpUnfused(env *Env, a cuda.MoEGateUpArgs, sh13 cuda.MoEShape, stacked bool, offsets, gu, hq, hs cuda.DevicePtr) error {
	sh, rows, inter := a.Shape, a.Shape.Rows, a.Shape.N
	tl, err := cuda.MoETiles(env.S, offsets, sh13, a.Scratch)
	if err != nil {
		return err
	}
	g, u, ld := gu, gu.Add(2*inter), 2*inter
	if stacked {
		err = cuda.MoEFP4Tiles(env.S, gu, a.XQ, a.XS, a.W1, a.S1, a.G1, sh13, a.Scratch, tl)
	} else {
		u, ld = gu.Add(2*rows*inter), inter
		err = cuda.MoEFP4Tiles(env.S, g, a.XQ, a.XS, a.W1, a.S1, a.G1, sh, a.Scratch, tl)
		if err == nil {
			err = cuda.MoEFP4Tiles(env.S, u, a.XQ, a.XS, a.W3, a.S3, a.G3, sh, a.Scratch, tl)
		}
	}
	if err != nil {
		return err
	}
	return cuda.MoESwiGLUQuant(env.S, cuda.MoESwiGLUArgs{HQ: hq, HS: hs, G: g, U: u, LD: ld, Perm: a.Perm, Offsets: offsets,
		Weights: a.Weights, Experts: sh.Experts, Rows: rows, Inter: inter, Limit: a.Limit})
}

// gateUpRows spreads the rows between lead and mTotal-tail over the
// experts (MoECase's routings): counts per expert and the offsets.
func gateUpRows(rng *rand.Rand, experts, mTotal int, route Routing) (counts []int, off []int32, lead, tail int) {
	if route == RouteGap && mTotal > 16 {
		lead, tail = 3, 5
	}
	owned := mTotal - lead - tail
	counts = make([]int, experts)
	if route == RouteSkewed {
		big := rng.IntN(experts)
		counts[big] = owned * 3 / 4
		owned -= counts[big]
	}
	for range owned {
		counts[rng.IntN(experts)]++
	}
	off = make([]int32, experts+1)
	off[0] = int32(lead)
	for e := range experts {
		off[e+1] = off[e] + int32(counts[e])
	}
	return counts, off, lead, tail
}

// sampleOwned returns up to n (0: all) of the rows [lo, hi), ascending.
func sampleOwned(rng *rand.Rand, lo, hi, n int) []int {
	rows := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		rows = append(rows, i)
	}
	if n > 0 && len(rows) > n {
		rng.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
		rows = rows[:n]
		sort.Ints(rows)
	}
	return rows
}

func int32s(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// diffBytes counts the positions where a and b differ.
func diffBytes(a, b []byte) int {
	if bytes.Equal(a, b) {
		return 0
	}
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}
