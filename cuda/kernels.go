package cuda

import "fmt"

// Typed launchers, one per kernel (llm.c style): device pointers, sizes and
// the stream; they check shapes, pick the launch geometry and name the
// kernel in every error. Kernels are compiled on first use per context.
//
// Storage: bf16 is uint16 on the device, e4m3 and e8m0 are bytes, fp32 is float.

// kernel returns a ready function of kernels/<module>.cu, raising its dynamic
// shared memory limit to dynSmem the first time.
func (c *Context) kernel(module, name string, dynSmem int) (*Function, error) {
	key := module + "." + name
	c.fnMu.Lock()
	defer c.fnMu.Unlock()
	if f := c.fns[key]; f != nil {
		if dynSmem > 48*1024 && f.maxSmem < dynSmem {
			if err := f.SetMaxDynamicSmem(dynSmem); err != nil {
				return nil, err
			}
		}
		return f, nil
	}
	m, err := c.Module(module)
	if err != nil {
		return nil, err
	}
	f, err := m.Function(name)
	if err != nil {
		return nil, err
	}
	if dynSmem > 48*1024 {
		if err := f.SetMaxDynamicSmem(dynSmem); err != nil {
			return nil, err
		}
	}
	c.fns[key] = f
	return f, nil
}

// Kernel returns a kernel by module and name, for inspection (Resources).
func (c *Context) Kernel(module, name string) (*Function, error) { return c.kernel(module, name, 0) }

func launch(s *Stream, module, name string, grid, block Dim3, smem int, a *Args) error {
	f, err := s.ctx.kernel(module, name, smem)
	if err != nil {
		return err
	}
	return s.Launch(f, grid, block, smem, a)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// RMSNorm: out[r, :] = bf16(w * (x[r, :] / sqrt(mean(x[r, :]^2) + eps))), fp32 inside.
// x, out: bf16 [rows, dim]; w: bf16 [dim]; dim even.
func RMSNorm(s *Stream, out, x, w DevicePtr, rows, dim int, eps float32) error {
	if rows < 0 || dim <= 0 || dim%2 != 0 {
		return fmt.Errorf("cuda: rmsnorm_bf16: bad shape rows=%d dim=%d (dim must be even)", rows, dim)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(out).Ptr(x).Ptr(w).I32(dim).F32(eps)
	return launch(s, "rmsnorm", "rmsnorm_bf16", Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// QuantFP8Act quantizes bf16 x [rows, cols] per 128 columns to e4m3 codes
// q [rows, cols] and e8m0 scales [rows, cols/128] (spec §3.3). cols % 128 == 0.
func QuantFP8Act(s *Stream, q, scales, x DevicePtr, rows, cols int) error {
	if rows < 0 || cols <= 0 || cols%128 != 0 {
		return fmt.Errorf("cuda: quant_fp8_act: bad shape rows=%d cols=%d (cols must be a multiple of 128)", rows, cols)
	}
	if rows == 0 {
		return nil
	}
	blocks := rows * (cols / 128)
	a := new(Args).Ptr(q).Ptr(scales).Ptr(x).I32(rows).I32(cols)
	return launch(s, "quant", "quant_fp8_act", Dim3{uint32(ceilDiv(blocks, 8)), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

const (
	linearSmem = 2 * (64*144 + 128*144) // 2 stages of A and B tiles
	moeSmem    = 2 * (64*144 + 128*80 + 128*8*4)
)

// splitK picks how many K slices a GEMM of tiles CTAs over nkb K blocks of
// 128 runs in on sms SMs: enough CTAs for about three per SM when the tiles
// alone are fewer than the SMs. It returns the slices and the K blocks per
// slice (1, nkb: no split).
func splitK(tiles, nkb, sms int) (splits, per int) {
	sms = max(sms, 1)
	target := 3 * sms
	if tiles >= sms || nkb < 2 {
		return 1, nkb
	}
	splits = min(nkb, ceilDiv(target, tiles))
	per = ceilDiv(nkb, splits)
	return ceilDiv(nkb, per), per
}

// linearPlan is the mma.sync launch of one FP8 linear: up to 16 rows take
// linear_fp8_dec in one launch (16 outputs x all rows per warp, K split over
// the warps of a CTA, no scratch), up to 64 the tiled kernel with split K,
// beyond that the tiled kernel alone. On sm_90a the wgmma kernel takes every
// shape above the decode kernel's rows (linear_wg.go).
type linearPlan struct {
	dec         bool
	splits, per int
	slices      int // dec: K slices per row group, one warp each
}

// decWarpsPerSM is how many linear_fp8_dec warps one SM holds (128
// registers a thread).
const (
	decMaxRows    = 16 // two 8-token tiles
	decWarpsPerSM = 16
)

// decGeometry is the linear_fp8_dec CTA for S K slices: 8 warps (16 for 16
// slices), S per row group, and its row groups of 16 outputs.
func decGeometry(slices int) (warps, groups int) {
	warps = max(8, slices)
	return warps, warps / slices
}

// planLinear plans the mma.sync launch of m x n x k on sms SMs.
func planLinear(m, n, k, sms int) linearPlan {
	nkb := k / 128
	switch {
	case m <= decMaxRows && n*k < 1<<32: // the kernel's byte offsets are 32-bit
		// Double the K slices while each keeps at least 2 blocks (one register
		// buffer each) and all warps still fit in one wave.
		groups, s := ceilDiv(n, 16), 1
		for s < 16 && 4*s <= nkb && groups*2*s <= decWarpsPerSM*sms {
			s *= 2
		}
		return linearPlan{dec: true, splits: 1, per: nkb, slices: s}
	case m <= 64:
		sp, per := splitK(ceilDiv(n, 128), nkb, sms)
		return linearPlan{splits: sp, per: per}
	}
	return linearPlan{splits: 1, per: nkb}
}

// LinearFP8ScratchBytes is the scratch LinearFP8 uses for split K at this
// shape on s's device (0: it runs unsplit).
func LinearFP8ScratchBytes(s *Stream, m, n, k int) int {
	if m <= 0 || k <= 0 || k%128 != 0 {
		return 0
	}
	// Beyond the decode kernel's rows either tiled path may run (KernelChoice).
	sms := s.ctx.dev.SMs
	sp := planLinear(m, n, k, sms).splits
	if m > decMaxRows {
		sp = max(sp, planLinearWG(m, n, k, sms).splits)
	}
	b := dskScratchBytes(m, n, k, sms) // whichever decode kernel runs (KernelChoice)
	if sp > 1 {
		b = max(b, 4*sp*m*n)
	}
	return b
}

// LinearFP8 computes y = x · Wᵀ with FP8 block scaling (spec §3.4):
// xq e4m3 [m, k], xs e8m0 [m, k/128], w e4m3 [n, k], ws e8m0 [ceil(n/128), k/128],
// y bf16 [m, n]. k % 128 == 0, n % 8 == 0. With scratch of
// LinearFP8ScratchBytes (decode shapes) K is split over more CTAs; scratch 0
// runs unsplit.
func LinearFP8(s *Stream, y, xq, xs, w, ws DevicePtr, m, n, k int, scratch DevicePtr) error {
	return linearFP8(s, y, 0, xq, xs, w, ws, m, n, k, scratch)
}

// LinearFP8F32 is LinearFP8 with the bf16 results widened to fp32 into yf
// [m, n]: the decode kernel stores them so itself; the other paths write
// bf16 to y (scratch of 2·m·n bytes) and widen it.
func LinearFP8F32(s *Stream, yf, y, xq, xs, w, ws DevicePtr, m, n, k int, scratch DevicePtr) error {
	if yf == 0 {
		return fmt.Errorf("cuda: linear_fp8: no fp32 output")
	}
	return linearFP8(s, y, yf, xq, xs, w, ws, m, n, k, scratch)
}

func linearFP8(s *Stream, y, yf, xq, xs, w, ws DevicePtr, m, n, k int, scratch DevicePtr) error {
	if m < 0 || n <= 0 || k <= 0 || k%128 != 0 || n%8 != 0 {
		return fmt.Errorf("cuda: linear_fp8: bad shape m=%d n=%d k=%d (k %% 128 == 0, n %% 8 == 0)", m, n, k)
	}
	if m == 0 {
		return nil
	}
	if ceilDiv(m, 64) > 65535 {
		return fmt.Errorf("cuda: linear_fp8: m=%d exceeds the grid limit", m)
	}
	if s.tcLinear() {
		return linearFP8TC(s, y, yf, xq, xs, w, ws, m, n, k)
	}
	p, choice, dec, tdec, dsk := decodePath(s, m, n, k)
	if dsk {
		if sk, _ := planDSK(m, n, k, s.ctx.dev.SMs); sk.z == 1 || scratch != 0 {
			return linearFP8DSK(s, y, yf, xq, xs, w, ws, m, n, k, sk, scratch)
		}
		dec = p.dec // no scratch for the split: the in-CTA kernel
	}
	if tdec {
		return linearFP8TDec(s, y, yf, xq, xs, w, ws, m, n, k)
	}
	if dec {
		warps, groups := decGeometry(p.slices)
		d := new(Args).Ptr(y).Ptr(xq).Ptr(xs).Ptr(w).Ptr(ws).I32(m).I32(n).I32(k).I32(p.slices).Ptr(yf)
		grid := Dim3{uint32(ceilDiv(ceilDiv(n, 16), groups)), 1, 1}
		return launch(s, "linear_fp8", "linear_fp8_dec", grid, Dim3{uint32(32 * warps), 1, 1}, 0, d)
	}
	if err := linearFP8Tiled(s, y, xq, xs, w, ws, m, n, k, scratch, p, choice); err != nil || yf == 0 {
		return err
	}
	return BF16ToF32(s, yf, y, int64(m*n))
}

// decodePath is linearFP8's choice for m x n x k: the plan, the forced
// path, and whether linear_fp8_dec (dec), a TMA decode kernel (tdec) or
// linear_fp8_dsk (dsk) runs it.
func decodePath(s *Stream, m, n, k int) (p linearPlan, choice Path, dec, tdec, dsk bool) {
	sms := s.ctx.dev.SMs
	p = planLinear(m, n, k, sms)
	choice = s.ctx.kernelChoice().Linear
	auto := choice == PathAuto || choice == PathDecCTA || choice == PathDecSK
	if _, ok := planDSK(m, n, k, sms); ok && (choice == PathDecSK || choice == PathAuto && dskWins(m, n, k, sms)) {
		return p, choice, false, false, true
	}
	dec = p.dec && auto
	if (choice == PathDec || choice == PathDecWG) && m <= decMaxRows {
		p = planLinear(1, n, k, sms) // forced: the geometry depends on n and k only
		dec = p.dec
	}
	tdec = dec && s.ctx.HasTMA() && (choice == PathDecWG || auto && tdecWins(n, k))
	return p, choice, dec && !tdec, tdec, false
}

// DecLinear is one linear of LinearFP8PairF32: e4m3 weights W [N, k], their
// e8m0 scales WS [ceil(N/128), k/128] and the fp32 output YF [m, N].
type DecLinear struct {
	YF, W, WS DevicePtr
	N         int
}

// LinearFP8PairF32 runs LinearFP8F32 of one input (xq, xs: m x k) for two
// weights in one launch (linear_fp8_dec2) where both would run
// linear_fp8_dec with the same CTA size; each CTA computes what it does in
// its own launch, so the results are the same bits. Otherwise it launches
// nothing and reports false.
func LinearFP8PairF32(s *Stream, xq, xs DevicePtr, m, k int, a, b DecLinear) (bool, error) {
	if m <= 0 || k <= 0 || k%128 != 0 || a.N <= 0 || a.N%8 != 0 || b.N <= 0 || b.N%8 != 0 {
		return false, nil
	}
	if a.YF == 0 || b.YF == 0 {
		return false, fmt.Errorf("cuda: linear_fp8_dec2: no fp32 output")
	}
	if s.tcLinear() {
		return false, nil
	}
	pa, _, deca, _, _ := decodePath(s, m, a.N, k)
	pb, _, decb, _, _ := decodePath(s, m, b.N, k)
	if !deca || !decb {
		return false, nil
	}
	warps, ca, cb, ok := decPair(pa, pb, a.N, b.N)
	if !ok {
		return false, nil
	}
	d := new(Args).Ptr(xq).Ptr(xs).I32(m).I32(k).I32(ca).
		Ptr(0).Ptr(a.W).Ptr(a.WS).I32(a.N).I32(pa.slices).Ptr(a.YF).
		Ptr(0).Ptr(b.W).Ptr(b.WS).I32(b.N).I32(pb.slices).Ptr(b.YF)
	grid := Dim3{uint32(ca + cb), 1, 1}
	return true, launch(s, "linear_fp8", "linear_fp8_dec2", grid, Dim3{uint32(32 * warps), 1, 1}, 0, d)
}

// decPair is linear_fp8_dec2's geometry for the linear_fp8_dec plans pa and
// pb of na and nb outputs: the CTA's warps and each plan's CTAs; false where
// the two CTA sizes differ.
func decPair(pa, pb linearPlan, na, nb int) (warps, ca, cb int, ok bool) {
	warps, ga := decGeometry(pa.slices)
	wb, gb := decGeometry(pb.slices)
	return warps, ceilDiv(ceilDiv(na, 16), ga), ceilDiv(ceilDiv(nb, 16), gb), warps == wb
}

// linearFP8Tiled runs the wgmma or the mma.sync tiled kernel (bf16 out).
func linearFP8Tiled(s *Stream, y, xq, xs, w, ws DevicePtr, m, n, k int, scratch DevicePtr, p linearPlan, choice Path) error {
	if _, wg := wgVariantOf(choice); wg {
		if m <= decMaxRows {
			scratch = 0 // sized for the decode kernel: none
		}
		return linearFP8WG(s, y, xq, xs, w, ws, m, n, k, scratch, choice)
	}
	switch choice {
	case PathTiled:
		if m <= decMaxRows {
			scratch = 0
		}
	default:
		if m >= wgMinRow && s.ctx.HasTMA() {
			return linearFP8WG(s, y, xq, xs, w, ws, m, n, k, scratch, wgPick(m, n, k))
		}
	}
	if scratch == 0 {
		p.splits, p.per = 1, k/128
	}
	var part DevicePtr
	if p.splits > 1 {
		part = scratch
	}
	a := new(Args).Ptr(y).Ptr(xq).Ptr(xs).Ptr(w).Ptr(ws).I32(m).I32(n).I32(k).Ptr(part).I32(p.per)
	grid := Dim3{uint32(ceilDiv(n, 128)), uint32(ceilDiv(m, 64)), uint32(p.splits)}
	err := launch(s, "linear_fp8", "linear_fp8", grid, Dim3{128, 1, 1}, linearSmem, a)
	if err != nil || p.splits == 1 {
		return err
	}
	return fp8Reduce(s, y, part, p.splits, m, n, 0, 0)
}

// fp8Reduce sums split-K partials into bf16 rows (bounds/E: MoE offsets).
func fp8Reduce(s *Stream, y, part DevicePtr, splits, rows, n int, bounds DevicePtr, e int) error {
	a := new(Args).Ptr(y).Ptr(part).I32(splits).I32(rows).I32(n).Ptr(bounds).I32(e)
	grid := Dim3{uint32(min(ceilDiv(rows*n, 256), 32*s.ctx.dev.SMs)), 1, 1}
	return launch(s, "linear_fp8", "linear_fp8_reduce", grid, Dim3{256, 1, 1}, 0, a)
}

// FP4Format selects the expert weight scaling.
type FP4Format int

const (
	// MXFP4: one e8m0 scale per 32 K (official checkpoint).
	MXFP4 FP4Format = iota
	// NVFP4: one e4m3 scale per 16 K and an fp32 global scale per expert.
	NVFP4
)

func (f FP4Format) String() string {
	if f == NVFP4 {
		return "nvfp4"
	}
	return "mxfp4"
}

// MoEShape describes a grouped expert GEMM.
type MoEShape struct {
	Experts int       // E
	Rows    int       // Mtot, permuted rows
	N, K    int       // output and input features per expert
	Format  FP4Format //
}

// moePlan is the launch of one grouped GEMM, fixed by the shape and the
// path (so that its scratch size is too): decode-shaped lists (moeDecode)
// run moe_fp4_dec over 8- or 16-row tiles, 64 output columns per CTA; larger ones
// moe_fp4_wg (sm_90a, tiles of bm rows by the expected rows per expert) or
// moe_fp4_gemm (64-row tiles, 128 columns per CTA). K is split when the CTAs
// are too few to keep the weight stream in flight (mma.sync paths).
type moePlan struct {
	path                 Path
	bm, maxTiles, colsPC int
	splits, per          int
}

// moeDecode reports whether a tile list is decode-shaped: at most 16 rows
// per expert on average. moe_fp4_dec re-reads an expert's weights per tile,
// yet up to 16 it beats moe_fp4_wg, whose 64-row tiles are mostly empty at
// so few rows (docs/performance.md).
func moeDecode(sh MoEShape) bool { return sh.Rows <= 16*min(sh.Experts, sh.Rows) }

// decTileRows is moe_fp4_dec's token tile: 8 rows, or 16 where experts
// average more than 8 (prefill chunks), so that each weight fragment is
// decoded once for two 8-token MMAs.
func decTileRows(sh MoEShape) int {
	if sh.Rows > 8*min(sh.Experts, sh.Rows) {
		return 16
	}
	return 8
}

// decF16Fits reports whether moe_fp4_decf16 and moe_fp4_decm (decmap) can
// run a shape: a decode-shaped list of 8-row tiles (at most 8 rows per expert
// on average), where they take moe_fp4_dec's plan, and so its scratch.
func decF16Fits(sh MoEShape) bool { return moeDecode(sh) && decTileRows(sh) == 8 }

// decCTAsPerSM sets the decode kernel's grid below which K is split: about
// 32 warps per SM (8 CTAs of 4) on every SM.
const decCTAsPerSM = 8

// planMoE plans the launch on path on sms SMs.
func planMoE(sh MoEShape, path Path, sms int) moePlan {
	p := moePlan{path: path, bm: 64, colsPC: 128}
	switch path {
	case PathDec, PathDecF16, PathDecMap, PathDecPre:
		p.bm, p.colsPC = decTileRows(sh), 64
	case PathWG:
		p.bm = moeBlockM(sh)
	case PathTC:
		p.bm = tcTile(ceilDiv(sh.Rows, max(min(sh.Experts, sh.Rows), 1)))
	}
	p.maxTiles = ceilDiv(sh.Rows, p.bm) + min(sh.Experts, sh.Rows)
	ctas, nkb := p.maxTiles*ceilDiv(sh.N, p.colsPC), sh.K/128
	switch path {
	case PathDec, PathDecF16, PathDecMap, PathDecPre:
		p.splits, p.per = 1, nkb
		if target := decCTAsPerSM * max(sms, 1); ctas < target && nkb > 1 {
			sp := min(nkb, ceilDiv(target, ctas))
			p.per = ceilDiv(nkb, sp)
			p.splits = ceilDiv(nkb, p.per)
		}
	case PathWG, PathTC:
		p.splits, p.per = 1, nkb
	default:
		p.splits, p.per = splitK(ctas/2, nkb, sms)
	}
	return p
}

func (p moePlan) tileBytes() int { return (16 + 16*p.maxTiles + 255) &^ 255 }

// scratchBytes is the tile list, then split-K partials (mma.sync paths) or
// the bf16 activations the wgmma path reads with TMA.
func (p moePlan) scratchBytes(sh MoEShape) int {
	b := p.tileBytes()
	switch {
	case sh.Rows <= 0:
	case p.path == PathWG || p.path == PathTC && sh.Format == NVFP4:
		b += 2 * sh.Rows * sh.K
	case p.splits > 1:
		b += 4 * p.splits * sh.Rows * sh.N
	}
	return b
}

// moePaths are the paths a shape may run: the decode kernel for decode-shaped
// lists, else either tiled kernel.
func moePaths(sh MoEShape) []Path {
	if moeDecode(sh) {
		return []Path{PathDec}
	}
	return []Path{PathTiled, PathWG}
}

// MoEScratchBytes is the scratch size MoEFP4 needs (tile list, split-K
// partials or bf16 activations), fixed by the shape so that it can live in a
// CUDA graph: the largest over the paths the shape may take on s's device.
func MoEScratchBytes(s *Stream, sh MoEShape) int {
	b := 0
	paths := moePaths(sh)
	if s.ctx.moeTC(sh) {
		paths = append(paths, PathTC)
	}
	for _, path := range paths {
		b = max(b, planMoE(sh, path, s.ctx.dev.SMs).scratchBytes(sh))
	}
	return b
}

// moePath picks the path of a launch: the forced one (KernelChoice) where
// the scratch was sized for it (the decode kernel always), else the decode
// kernel for decode-shaped lists (decmap on 8-row tiles: no tile_map launch)
// and the wgmma kernel where the device has TMA.
func (s *Stream) moePath(sh MoEShape) Path {
	forced := s.ctx.kernelChoice().MoE
	if s.ctx.moeTC(sh) && (forced == PathAuto || forced == PathTC) {
		return PathTC
	}
	ok := moePaths(sh)
	if (forced == PathDecF16 || decMapPath(forced)) && decF16Fits(sh) {
		return forced // moe_fp4_dec's plan and scratch
	}
	if forced != PathAuto {
		for _, p := range ok {
			if p == forced {
				return p
			}
		}
		if forced == PathDec || (forced == PathDecF16 || decMapPath(forced)) && moeDecode(sh) {
			// The decode kernel needs only the tile list, which every scratch
			// holds; decf16 and decmap on 16-row tiles are moe_fp4_dec's.
			return PathDec
		}
		// A tiled path for a decode-shaped list: its scratch has no room, so auto.
	}
	if ok[0] == PathDec {
		if decF16Fits(sh) {
			return PathDecMap
		}
		return PathDec
	}
	if s.ctx.HasTMA() {
		return PathWG
	}
	return PathTiled
}

// moePlan is the plan of a launch on this stream's context (its path). The
// tile list and the GEMM that reads it both take it from here.
func (s *Stream) moePlan(sh MoEShape) moePlan {
	return planMoE(sh, s.moePath(sh), s.ctx.dev.SMs)
}

// MoEFP4 runs the grouped expert GEMM: for every expert e and row m in
// [offsets[e], offsets[e+1]), y[m, :] = bf16(G_e · xq[m, :] · W_eᵀ) with
// FP8 activations (xq e4m3 [Rows, K], xs e8m0 [Rows, K/128]) and FP4 weights
// w [E][N][K/2] (element 2i in the low nibble) with wscale e8m0 [E][N][K/32]
// (MXFP4) or e4m3 [E][N][K/16] plus gscale fp32 [E] (NVFP4). offsets is int32
// [E+1] on the device. Rows outside every range are not written. scratch
// holds MoEScratchBytes(sh). It is MoETiles then MoEFP4Tiles.
func MoEFP4(s *Stream, y, xq, xs, offsets, w, wscale, gscale DevicePtr, sh MoEShape, scratch DevicePtr) error {
	if err := checkMoEArgs(sh, gscale); err != nil {
		return err
	}
	tl, err := MoETiles(s, offsets, sh, scratch)
	if err != nil {
		return err
	}
	return MoEFP4Tiles(s, y, xq, xs, w, wscale, gscale, sh, scratch, tl)
}

// MoETileList is the tile list MoETiles wrote at the start of a scratch. The
// GEMMs of one MoE layer (w13 and w2: the same rows and experts) share it.
type MoETileList struct {
	offsets      DevicePtr
	bm, maxTiles int
	inKernel     bool // decmap: nothing written, the GEMM finds its tiles
	settled      bool // Settled: offsets written before the launch preceding the GEMM
}

// Settled marks the list as built on offsets that no kernel the GEMM may
// overlap writes: they were written by a copy or by a kernel two or more
// launches before the GEMM on its stream (every kernel here passes its PDL
// wait before it lets its successor start, so the one before it has
// finished). decpre's CTAs then read them, and start their weight loads,
// before their own wait.
func (l MoETileList) Settled() MoETileList {
	l.settled = true
	return l
}

// Plan is the list's rows per tile and its capacity in tiles.
func (l MoETileList) Plan() (rows, maxTiles int) { return l.bm, l.maxTiles }

// MoETiles writes the token tiles of the rows behind offsets into scratch
// (sized by MoEScratchBytes) for the path sh takes; on decmap it launches
// nothing, as the GEMM's CTAs find their tiles in the offsets.
func MoETiles(s *Stream, offsets DevicePtr, sh MoEShape, scratch DevicePtr) (MoETileList, error) {
	if err := checkMoEShape(sh); err != nil {
		return MoETileList{}, err
	}
	if sh.Rows == 0 {
		return MoETileList{}, nil
	}
	p := s.moePlan(sh)
	if p.maxTiles > 65535 || sh.Experts > 1<<20 {
		return MoETileList{}, fmt.Errorf("cuda: moe_fp4_gemm: %d rows exceed the grid limit", sh.Rows)
	}
	if decMapPath(p.path) {
		return MoETileList{offsets: offsets, bm: p.bm, maxTiles: p.maxTiles, inKernel: true}, nil
	}
	a := new(Args).Ptr(offsets).I32(sh.Experts).I32(sh.Rows).Ptr(scratch).I32(p.maxTiles).I32(p.bm)
	if err := launch(s, "moe_fp4", "moe_tile_map", Dim3{1, 1, 1}, Dim3{1024, 1, 1}, 0, a); err != nil {
		return MoETileList{}, err
	}
	return MoETileList{offsets: offsets, bm: p.bm, maxTiles: p.maxTiles}, nil
}

func checkMoEShape(sh MoEShape) error {
	if sh.Experts <= 0 || sh.Rows < 0 || sh.N <= 0 || sh.K <= 0 || sh.K%128 != 0 || sh.N%8 != 0 {
		return fmt.Errorf("cuda: moe_fp4_gemm: bad shape %+v (K %% 128 == 0, N %% 8 == 0)", sh)
	}
	return nil
}

func checkMoEArgs(sh MoEShape, gscale DevicePtr) error {
	if err := checkMoEShape(sh); err != nil {
		return err
	}
	if sh.Format == NVFP4 && gscale == 0 {
		return fmt.Errorf("cuda: moe_fp4_gemm: NVFP4 needs the per-expert global scales")
	}
	return nil
}

// MoEFP4Tiles is MoEFP4 on a tile list MoETiles built for the same rows and
// experts (and so the same path).
func MoEFP4Tiles(s *Stream, y, xq, xs, w, wscale, gscale DevicePtr, sh MoEShape, scratch DevicePtr, tl MoETileList) error {
	return moeFP4Tiles(s, y, xq, xs, w, wscale, gscale, sh, scratch, tl, true)
}

// moeFP4Tiles is MoEFP4Tiles; fixup false leaves the decode kernel's split-K
// partials to a linear_fp8_reduce launch (the reference bits of the tests).
func moeFP4Tiles(s *Stream, y, xq, xs, w, wscale, gscale DevicePtr, sh MoEShape, scratch DevicePtr, tl MoETileList, fixup bool) error {
	if err := checkMoEArgs(sh, gscale); err != nil {
		return err
	}
	if sh.Rows == 0 {
		return nil
	}
	p := s.moePlan(sh)
	path := p.path
	if p.bm != tl.bm || p.maxTiles != tl.maxTiles {
		return fmt.Errorf("cuda: moe_fp4_gemm: tile list of %d-row tiles (%d) built for another shape than %+v (%d-row tiles, %d)", tl.bm, tl.maxTiles, sh, p.bm, p.maxTiles)
	}
	if tl.inKernel && !decMapPath(path) {
		return fmt.Errorf("cuda: moe_fp4_gemm: the tile list of %+v was left to the decmap kernel, but the launch takes path %q (the kernel choice changed in between)", sh, path)
	}
	nv := 0
	if sh.Format == NVFP4 {
		nv = 1
	}
	if path == PathTC {
		return moeFP4TC(s, y, xq, xs, w, wscale, gscale, sh, p, scratch)
	}
	if path == PathWG {
		return moeFP4WG(s, y, xq, xs, w, wscale, gscale, nv, sh, p, scratch)
	}
	var part DevicePtr
	if p.splits > 1 {
		part = scratch.Add(p.tileBytes())
	}
	grid := Dim3{uint32(ceilDiv(sh.N, p.colsPC)), uint32(p.maxTiles), uint32(p.splits)}
	b := new(Args).Ptr(y).Ptr(xq).Ptr(xs)
	if decMapPath(path) {
		b.Ptr(tl.offsets).I32(sh.Experts) // moe_fp4_decm reads the offsets, not a list
	} else {
		b.Ptr(scratch)
	}
	b.Ptr(w).Ptr(wscale).Ptr(gscale)
	decode := path == PathDec || path == PathDecF16 || decMapPath(path)
	if !decode {
		b.I32(nv) // the decode kernels have an entry point per format instead
	}
	b.I32(sh.N).I32(sh.K).Ptr(part).I32(p.per).I32(sh.Rows)
	var err error
	switch {
	case !decode:
		fixup = false
		err = launch(s, "moe_fp4", "moe_fp4_gemm", grid, Dim3{128, 1, 1}, moeSmem, b)
	default:
		module, name := decKernel(path, p.bm, nv == 1, tl.settled)
		// The last CTA of a tile sums the split-K partials (no reduce launch).
		var counters DevicePtr
		if fixup = fixup && p.splits > 1; fixup {
			if slots := s.ctx.fixupSlots(); int(grid.X*grid.Y) > slots {
				return fmt.Errorf("cuda: moe_fp4_dec: %d CTAs split K, %d counters", grid.X*grid.Y, slots)
			}
			if counters, err = s.fixupCounters(); err != nil {
				return err
			}
		}
		err = launch(s, module, name, grid, Dim3{128, 1, 1}, 0, b.Ptr(counters))
	}
	if err != nil || p.splits == 1 || fixup {
		return err
	}
	return fp8Reduce(s, y, part, p.splits, sh.Rows, sh.N, tl.offsets, sh.Experts)
}

// decKernel is the module and entry point of a decode-path launch: decpre's
// moe_fp4_decp only on settled lists (MoETileList.Settled), else decmap's.
func decKernel(path Path, bm int, nv, settled bool) (module, name string) {
	module, name = "moe_fp4_dec", "moe_fp4_dec"
	switch {
	case path == PathDecF16:
		module, name = "moe_fp4_decf16", "moe_fp4_decf16"
	case path == PathDecPre && settled:
		name = "moe_fp4_decp"
	case decMapPath(path):
		name = "moe_fp4_decm"
	case bm == 16:
		name += "16"
	}
	if nv {
		name += "_nv"
	}
	return module, name
}

// SwiGLU computes out[r, i] = bf16(silu(min(g, limit)) · clamp(u, ±limit) · weights[r])
// with g = gate[r*ld + i], u = up[r*ld + i] (bf16), out bf16 [rows, inter].
// weights (fp32 [rows]) may be 0 for a routing weight of 1. inter even.
func SwiGLU(s *Stream, out, gate, up DevicePtr, ld int, weights DevicePtr, rows, inter int, limit float32) error {
	if rows < 0 || inter <= 0 || inter%2 != 0 || ld < inter || ld%2 != 0 {
		return fmt.Errorf("cuda: swiglu_bf16: bad shape rows=%d inter=%d ld=%d (even, ld >= inter)", rows, inter, ld)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(out).Ptr(gate).Ptr(up).I32(ld).Ptr(weights).I32(rows).I32(inter).F32(limit)
	grid := Dim3{uint32(rows), uint32(ceilDiv(inter/2, 256)), 1}
	return launch(s, "swiglu", "swiglu_bf16", grid, Dim3{256, 1, 1}, 0, a)
}
