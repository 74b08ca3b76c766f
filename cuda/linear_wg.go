package cuda

import "fmt"

// The sm_90a FP8 linear (kernels/linear_fp8_wg.cu): TMA loads, wgmma,
// 128x128 tiles (384 threads, one persistent CTA per SM), for more rows than the
// decode kernel takes (H200, 2026-12-04, at 64 rows: 12.4 against 16.0 µs
// for Flash wq_a, 30.9 against 43.5 µs for wo_b, ahead on every shape).

// wgMinRow: the wgmma path accumulates inside each 128-K block at the tensor
// cores' reduced precision (docs/numerics.md). From 17 rows it was faster,
// but on prefills of 17-64 rows the flipped bf16 roundings pushed the GPU's
// end-to-end logits error past the CPU's own sensitivity baseline (H200,
// 2026-12-04: median 16.9 % against 6.5 %; 7.7 % with the mma.sync path), so
// short prefills keep the exact-accumulating kernels.
const (
	wgStages = 6
	wgSmem   = wgStages*2*128*128 + 2*wgStages*8 + 1024 // ring, barriers, alignment slack
	wgMinRow = 65
	// wgGroup is linear_fp8_wg's default tile order: groups of 8 tile rows
	// (H200, 2026-12-05, 4096 tokens, against n fastest: Pro wq_b 1131 ->
	// 985 us, Pro wo_b 912 -> 850, Pro shared w13 342 -> 326, Flash wq_b
	// 404 -> 388; the shapes of one wave within 1 %).
	wgGroup = 8
)

// planLinearWG splits K when the tiles alone fill less than about 2/3 of the
// sms SMs, keeping at least 4 K blocks per slice.
func planLinearWG(m, n, k, sms int) linearPlan {
	nkb := k / 128
	tiles := ceilDiv(n, 128) * ceilDiv(m, 128)
	if 3*tiles >= 2*sms || nkb < 8 {
		return linearPlan{splits: 1, per: nkb}
	}
	sp := min(nkb/4, ceilDiv(sms, tiles))
	per := ceilDiv(nkb, sp)
	return linearPlan{splits: ceilDiv(nkb, per), per: per}
}

func linearFP8WG(s *Stream, y, xq, xs, w, ws DevicePtr, m, n, k int, scratch DevicePtr) error {
	if !s.ctx.HasTMA() {
		return fmt.Errorf("cuda: linear_fp8_wg: device %s has no sm_90a TMA path", s.ctx.dev.Name)
	}
	p := planLinearWG(m, n, k, s.ctx.dev.SMs)
	if scratch == 0 {
		p.splits, p.per = 1, k/128
	}
	ma, err := s.ctx.TensorMapBytes2D(xq, m, k, 128, 128)
	if err != nil {
		return err
	}
	mb, err := s.ctx.TensorMapBytes2D(w, n, k, 128, 128)
	if err != nil {
		return err
	}
	var part DevicePtr
	if p.splits > 1 {
		part = scratch
	}
	a := new(Args).Ptr(y).Map(&ma).Map(&mb).Ptr(xs).Ptr(ws).I32(m).I32(n).I32(k).Ptr(part).I32(p.per).I32(wgGroup)
	// Persistent CTAs over the tiles (one per SM at 192 KB of ring); split K
	// keeps one CTA per tile and slice.
	tiles := ceilDiv(n, 128) * ceilDiv(m, 128)
	ctas := tiles
	if p.splits == 1 {
		ctas = min(tiles, s.ctx.dev.SMs)
	}
	grid := Dim3{uint32(ctas), 1, uint32(p.splits)}
	if err := launch(s, "linear_fp8_wg", "linear_fp8_wg", grid, Dim3{384, 1, 1}, wgSmem, a); err != nil || p.splits == 1 {
		return err
	}
	return fp8Reduce(s, y, part, p.splits, m, n, 0, 0)
}

// linear_fp8_tdec3's shared memory: an SM holds the device's SmemSM bytes,
// each CTA also takes tdecCTAReserve of them (the 1 KB the system reserves
// and the tdecStaticSmem the cubin reports), and one CTA may have the
// device's SmemOptin less tdecStaticSmem of dynamic shared memory.
// tdecMaxCTAs is the kernel's __launch_bounds__ minimum: 72 registers a
// thread (NVRTC 12.4).
const (
	tdecStaticSmem = 1024
	tdecCTAReserve = 1024 + tdecStaticSmem
	tdecMaxCTAs    = 7
	tdecMaxKBS     = 4 // K blocks per stage: 512 contiguous bytes of each weight row
	tdecMaxStages  = 8
	tdecFlightGoal = 96 * 1024 // weight bytes in flight per SM (planTDec)
)

// tdecPlan is linear_fp8_tdec3's stage geometry: kbs K blocks per stage, ts
// stages per warp; a stage is the weights (kbs*2048 bytes) and at xoff the
// activations (xrows*kbs*128 bytes rounded up to 1024), stride bytes in all.
// smem is the dynamic shared memory (4 rings, their barriers, 1024 bytes of
// alignment slack); ctas how many CTAs an SM holds by it and flight the
// weight bytes an SM has requested after the first stages' loads.
type tdecPlan struct {
	kbs, ts, xoff, stride, smem int
	ctas, flight                int
}

// planTDec picks the stage geometry on dev. flight, the weight bytes an SM
// asks for up front, is resident CTAs x 4 warps x min(ts*kbs, per) x 2048,
// where per = ceil(K/128 / 4) is a warp's slice and the resident CTAs are
// those its shared memory allows, at most the grid's ceil(n/16 / SMs). Plans
// are ranked by flight up to tdecFlightGoal, then by whether the whole grid
// is resident at once (only the first wave's weight loads overlap the
// previous kernel under PDL), then by kbs (longer contiguous reads), then by
// flight, then by smaller shared memory. ts is at least 2 (a warp loads a
// chunk while it computes the one before) and never more than a warp's chunk
// count, so a warp whose slice fits its ring asks for all of it before the
// PDL wait. The slices themselves are linear_fp8_dec's, so the sums are the
// same.
func planTDec(m, n, k int, dev *Device) tdecPlan {
	per := ceilDiv(k/128, 4)
	waves := ceilDiv(ceilDiv(n, 16), max(dev.SMs, 1))
	maxSmem := dev.SmemOptin - tdecStaticSmem
	var best tdecPlan
	better := func(p tdecPlan) bool {
		a, b := min(p.flight, tdecFlightGoal), min(best.flight, tdecFlightGoal)
		switch {
		case a != b:
			return a > b
		case (p.ctas >= waves) != (best.ctas >= waves):
			return p.ctas >= waves
		case p.kbs != best.kbs:
			return p.kbs > best.kbs
		case p.flight != best.flight:
			return p.flight > best.flight
		}
		return p.smem < best.smem
	}
	for kbs := 1; kbs <= min(tdecMaxKBS, per); kbs++ {
		chunks := ceilDiv(per, kbs)
		for ts := min(2, chunks); ts <= min(chunks, tdecMaxStages); ts++ { // double-buffered where a slice has 2 chunks
			p := tdecLayout(m, kbs, ts)
			if p.smem > maxSmem {
				break
			}
			p.ctas = min(dev.SmemSM/(p.smem+tdecCTAReserve), tdecMaxCTAs)
			p.flight = min(p.ctas, waves) * 4 * min(ts*kbs, per) * 2048
			if best.kbs == 0 || better(p) {
				best = p
			}
		}
	}
	return best
}

// tdecLayout is the stage layout of kbs K blocks a stage and ts stages a
// warp for m rows (ctas and flight left zero).
func tdecLayout(m, kbs, ts int) tdecPlan {
	stride := kbs*2048 + ceilDiv(min(m, 16)*kbs*128, 1024)*1024
	return tdecPlan{kbs: kbs, ts: ts, xoff: kbs * 2048, stride: stride, smem: 4*ts*stride + 4*ts*8 + 1024}
}

// tdecSmem is linear_fp8_tdec's dynamic shared memory (TBYTES in the kernel:
// four warp rings of 4 stages of 4 KB and their barriers, plus the slack that
// aligns them to 1024 bytes).
const tdecSmem = 4*4*4096 + 8*4*4 + 1024

// linearFP8TDec runs a TMA-fed decode kernel (m <= 16, sm_90a):
// linear_fp8_tdec3 on the large grids (tdec3Wins), linear_fp8_tdec (fixed 4
// stages of one K block) otherwise.
func linearFP8TDec(s *Stream, y, yf, xq, xs, w, ws DevicePtr, m, n, k int) error {
	if tdec3Wins(n, k) {
		return linearFP8TDec3(s, y, yf, xq, xs, w, ws, m, n, k, planTDec(m, n, k, s.ctx.dev))
	}
	wm, err := s.ctx.TensorMapBytes2D(w, n, k, 16, 128)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8_tdec: %w", err)
	}
	xrows := min(m, 16) // a box no taller than the tensor
	xm, err := s.ctx.TensorMapBytes2D(xq, m, k, xrows, 128)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8_tdec: %w", err)
	}
	a := new(Args).Ptr(y).Ptr(xs).Ptr(ws).I32(m).I32(n).I32(k).Ptr(yf).Map(&wm).Map(&xm).I32(xrows)
	return launch(s, "linear_fp8_tdec", "linear_fp8_tdec", Dim3{uint32(ceilDiv(n, 16)), 1, 1}, Dim3{128, 1, 1}, tdecSmem, a)
}

// linearFP8TDec3 runs linear_fp8_tdec3 (m <= 16, sm_90a) with plan p: 16
// output rows per CTA, weights and activations by TMA in chunks of p.kbs K
// blocks.
func linearFP8TDec3(s *Stream, y, yf, xq, xs, w, ws DevicePtr, m, n, k int, p tdecPlan) error {
	xrows := min(m, 16) // a box no taller than the tensor
	wm, err := s.ctx.TensorMapBytes3D(w, n, k, 16, p.kbs)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8_tdec3: %w", err)
	}
	wm1, err := s.ctx.TensorMapBytes2D(w, n, k, 16, 128)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8_tdec3: %w", err)
	}
	xm, err := s.ctx.TensorMapBytes3D(xq, m, k, xrows, p.kbs)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8_tdec3: %w", err)
	}
	f, err := s.ctx.kernel("linear_fp8_tdec3", "linear_fp8_tdec3", p.smem)
	if err != nil {
		return err
	}
	if err := f.preferMaxShared(); err != nil {
		return err
	}
	a := new(Args).Ptr(y).Ptr(xs).Ptr(ws).I32(m).I32(n).I32(k).Ptr(yf).Map(&wm).Map(&wm1).Map(&xm).
		I32(xrows).I32(p.kbs).I32(p.ts).I32(p.xoff).I32(p.stride)
	return s.Launch(f, Dim3{uint32(ceilDiv(n, 16)), 1, 1}, Dim3{128, 1, 1}, p.smem, a)
}

// tdecWins reports the decode shapes where linear_fp8_tdec beats
// linear_fp8_dec (H200, 2026-12-04e, 1 token, µs tdec/dec): Flash wo_b
// 4096x8192 17.2/22.2, shared w13 4096x4096 11.5/12.4, Pro shared w13
// 6144x7168 20.1/30.9, Pro wq_b 65536x1536 46.5/54.8; slower where n/16 CTAs
// or its four K slices are too few (wq_a, wkv, shared w2, Flash wq_b
// 32768x1024: 23.2/21.9). Pro wo_b 7168x16384 was even (59.2/58.2) until
// linear_fp8_dec's scale loads moved ahead of its MMAs (2026-12-04f run 4:
// 59.0/54.3 at 1 token, 58.5/55.5 at 8), so K = 16384 stays on dec.
//
// 2026-12-04g (run 2/3, 1 token, % of copy): linear_fp8_tdec3 beats both on
// Pro wq_b (61.7 against 51.0 for tdec, 48.0 for dec), Pro wo_b (59.7
// against 47.9 / 50.7) and Flash wq_b (42.1 against 34.7 / 39.4), and loses
// to linear_fp8_tdec where the grid is ~2 CTAs an SM (Flash wo_b 31.9-36.7
// against 46.9 in every geometry tried).
func tdecWins(n, k int) bool { return n >= 4096 && k >= 4096 || tdec3Wins(n, k) }

// tdec3Wins reports the TMA decode shapes linear_fp8_tdec3 takes.
func tdec3Wins(n, k int) bool { return n >= 32768 || k >= 16384 }
