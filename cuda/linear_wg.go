package cuda

import "fmt"

// The sm_90a FP8 linear (kernels/linear_fp8_wg.cu): TMA loads, wgmma,
// 128-row tiles (384 threads, one persistent CTA per SM), for more rows than the
// decode kernel takes (ahead of the mma.sync kernels on every shape there).

// wgMinRow: the wgmma path accumulates inside each 128-K block at the tensor
// cores' reduced precision (docs/numerics.md). From 17 rows it is faster,
// but on prefills of 17-64 rows the flipped bf16 roundings push the GPU's
// end-to-end logits error past the CPU's own sensitivity baseline, so short
// prefills keep the exact-accumulating kernels.
const (
	wgMinRow = 65
	// wgGroup is linear_fp8_wg's tile order: groups of 8 tile rows, so that
	// a wave shares a few activation tiles and fewer weight panels in L2
	// (up to 13 % faster than n fastest on the multi-wave shapes).
	wgGroup = 8
)

// wgVariant is one configuration of the kernel (WG_KERNEL in the source):
// bn output columns a tile, stages in the ring, and the epilogue (bulk:
// staged in shared memory and copied out by cp.async.bulk; else direct
// stores); wave splits K by planLinearWGWave instead of planLinearWG.
// Variants with the same split plan give the same bits.
type wgVariant struct {
	path       Path // its KernelChoice / bench --path name
	fn         string
	bn, stages int
	bulk, wave bool
}

// Paths of the linear_fp8_wg variants beside PathWG (128 x 128 tiles, 6
// stages, direct stores).
const (
	PathWGBulk     Path = "wg-bulk"      // 128 x 128, 5 stages, staged bulk-copy epilogue
	PathWGN192     Path = "wg-n192"      // 128 x 192, 4 stages, staged bulk-copy epilogue
	PathWGN192Dir  Path = "wg-n192d"     // 128 x 192, 5 stages, direct stores
	PathWGS5       Path = "wg-s5"        // PathWG with 5 stages (what wg-bulk's staging costs the ring)
	PathWGWave     Path = "wg-wave"      // PathWG, K split within one wave (other sums)
	PathWGBulkWave Path = "wg-bulk-wave" // PathWGBulk, K split within one wave (other sums)
)

var wgVariants = []wgVariant{
	{PathWG, "linear_fp8_wg", 128, 6, false, false},
	{PathWGBulk, "linear_fp8_wg_bulk", 128, 5, true, false},
	{PathWGN192, "linear_fp8_wg_n192", 192, 4, true, false},
	{PathWGN192Dir, "linear_fp8_wg_n192d", 192, 5, false, false},
	{PathWGS5, "linear_fp8_wg_s5", 128, 5, false, false},
	{PathWGWave, "linear_fp8_wg", 128, 6, false, true},
	{PathWGBulkWave, "linear_fp8_wg_bulk", 128, 5, true, true},
}

// smem is the variant's dynamic shared memory (WgLayout): the ring, the
// staging rows, the barriers and 1024 bytes of alignment slack.
func (v wgVariant) smem() int {
	stg := 0
	if v.bulk {
		stg = 2 * 64 * (2*v.bn + 16)
	}
	return v.stages*(128*128+v.bn*128) + stg + 2*v.stages*8 + 1024
}

// wgVariantOf returns the variant named p.
func wgVariantOf(p Path) (wgVariant, bool) {
	for _, v := range wgVariants {
		if v.path == p {
			return v, true
		}
	}
	return wgVariant{}, false
}

// WGPaths are the linear_fp8_wg variants' paths, PathWG first.
func WGPaths() []Path {
	ps := make([]Path, len(wgVariants))
	for i, v := range wgVariants {
		ps[i] = v.path
	}
	return ps
}

// wgPicks is the variant LinearFP8 takes by itself on each model shape
// (Flash and Pro, bench kernels' denseShapes), below and from
// wgPickLargeRows rows; other shapes take PathWG. One line a shape: set it
// from `bench kernels --paths --only linear_fp8 --tokens 512,2048,4096`.
var wgPicks = []struct {
	n, k         int
	small, large Path
}{
	{1024, 4096, PathWGBulk, PathWGBulk},  // Flash wq_a
	{32768, 1024, PathWGBulk, PathWGBulk}, // Flash wq_b
	{512, 4096, PathWG, PathWGBulkWave},   // Flash wkv
	{4096, 8192, PathWGBulk, PathWGBulk},  // Flash wo_b
	{4096, 4096, PathWGBulk, PathWGBulk},  // Flash shared w13
	{4096, 2048, PathWGBulk, PathWGBulk},  // Flash shared w2
	{1536, 7168, PathWGBulk, PathWGN192},  // Pro wq_a
	{65536, 1536, PathWGBulk, PathWGBulk}, // Pro wq_b
	{512, 7168, PathWG, PathWGWave},       // Pro wkv
	{7168, 16384, PathWGBulk, PathWGBulk}, // Pro wo_b
	{6144, 7168, PathWGBulk, PathWGBulk},  // Pro shared w13
	{7168, 3072, PathWGBulk, PathWGBulk},  // Pro shared w2
}

const wgPickLargeRows = 2048

// wgPick is the variant for m x n x k (wgPicks).
func wgPick(m, n, k int) Path {
	for _, p := range wgPicks {
		if p.n == n && p.k == k {
			if m >= wgPickLargeRows {
				return p.large
			}
			return p.small
		}
	}
	return PathWG
}

// planLinearWG splits K when the 128x128 tiles alone fill less than about
// 2/3 of the sms SMs, keeping at least 4 K blocks per slice. Every variant
// takes this plan, so all give the same bits.
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

// planLinearWGWave splits K, where planLinearWG does, into no more slices
// than keep the tiles' CTAs within one wave of the sms SMs (one CTA an SM):
// planLinearWG's ceil(sms/tiles) slices can spill CTAs into a second wave
// (Flash wq_a at 512 tokens: 32 tiles x 5 slices on 132 SMs). Other slices,
// so other fp32 sums than planLinearWG's.
func planLinearWGWave(m, n, k, sms int) linearPlan {
	p := planLinearWG(m, n, k, sms)
	if p.splits == 1 {
		return p
	}
	nkb, tiles := k/128, ceilDiv(n, 128)*ceilDiv(m, 128)
	sp := max(min(nkb/4, sms/tiles), 1)
	per := ceilDiv(nkb, sp)
	return linearPlan{splits: ceilDiv(nkb, per), per: per}
}

// linearFP8WG runs the variant named path (PathWG or a WGPaths entry). The
// bulk epilogue copies rows from 16-byte aligned addresses: where y (or the
// scratch) is not, the variant of the same tile with direct stores runs.
func linearFP8WG(s *Stream, y, xq, xs, w, ws DevicePtr, m, n, k int, scratch DevicePtr, path Path) error {
	if !s.ctx.HasTMA() {
		return fmt.Errorf("cuda: linear_fp8_wg: device %s has no sm_90a TMA path", s.ctx.dev.Name)
	}
	v, ok := wgVariantOf(path)
	if !ok {
		return fmt.Errorf("cuda: linear_fp8_wg: no variant %q", path)
	}
	p := planLinearWG(m, n, k, s.ctx.dev.SMs)
	if v.wave {
		p = planLinearWGWave(m, n, k, s.ctx.dev.SMs)
	}
	if scratch == 0 {
		p.splits, p.per = 1, k/128
	}
	var part DevicePtr
	if p.splits > 1 {
		part = scratch
	}
	if v.bulk && (y%16 != 0 || part%16 != 0) {
		for _, d := range wgVariants {
			if d.bn == v.bn && d.wave == v.wave && !d.bulk {
				v = d
				break
			}
		}
	}
	if v.smem() > s.ctx.dev.SmemOptin {
		return fmt.Errorf("cuda: %s: %d bytes of shared memory, device %s allows %d", v.fn, v.smem(), s.ctx.dev.Name, s.ctx.dev.SmemOptin)
	}
	ma, err := s.ctx.TensorMapBytes2D(xq, m, k, 128, 128)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", v.fn, err)
	}
	mb, err := s.ctx.TensorMapBytes2D(w, n, k, v.bn, 128)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", v.fn, err)
	}
	a := new(Args).Ptr(y).Map(&ma).Map(&mb).Ptr(xs).Ptr(ws).I32(m).I32(n).I32(k).Ptr(part).I32(p.per).I32(wgGroup)
	// Persistent CTAs over the tiles (one per SM: the ring takes most of its
	// shared memory); split K keeps one CTA per tile and slice.
	tiles := ceilDiv(n, v.bn) * ceilDiv(m, 128)
	ctas := tiles
	if p.splits == 1 {
		ctas = min(tiles, s.ctx.dev.SMs)
	}
	grid := Dim3{uint32(ctas), 1, uint32(p.splits)}
	if err := launch(s, "linear_fp8_wg", v.fn, grid, Dim3{384, 1, 1}, v.smem(), a); err != nil || p.splits == 1 {
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
// linear_fp8_dec: large n and k (Flash wo_b and shared w13, Pro shared w13
// and wq_b); where n/16 CTAs or its four K slices are too few (wq_a, wkv,
// shared w2) dec is faster, and K = 16384 stays on dec, whose scale loads run
// ahead of its MMAs. linear_fp8_tdec3 (rank-3 TMA boxes) takes the largest
// shapes (tdec3Wins) and loses where the grid is about 2 CTAs an SM.
func tdecWins(n, k int) bool { return n >= 4096 && k >= 4096 || tdec3Wins(n, k) }

// tdec3Wins reports the TMA decode shapes linear_fp8_tdec3 takes.
func tdec3Wins(n, k int) bool { return n >= 32768 || k >= 16384 }
