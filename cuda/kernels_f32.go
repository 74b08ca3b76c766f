package cuda

import (
	"fmt"
	"math/bits"
	"slices"
)

// Launchers of kernels/ops_f32.cu and kernels/linear_f32.cu: the fp32
// activation ops of the GPU backend. rnd rounds results to bf16 (faithful).

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// gridFor returns a grid-stride launch for n elements.
func gridFor(n int64) Dim3 { return Dim3{uint32(min(ceilDiv(int(n), 256), 65535)), 1, 1} }

// RMSNormF32 normalises every segment of d values of x [segs, d] into y.
func RMSNormF32(s *Stream, y, x, w DevicePtr, segs, d int, eps float32, rnd bool) error {
	if segs < 0 || d <= 0 || segs > 1<<31-1 {
		return fmt.Errorf("cuda: rmsnorm_f32: bad shape segs=%d d=%d", segs, d)
	}
	if segs == 0 {
		return nil
	}
	a := new(Args).Ptr(y).Ptr(x).Ptr(w).I32(d).F32(eps).I32(b2i(rnd))
	return launch(s, "ops_f32", "rmsnorm_f32", Dim3{uint32(segs), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// RMSNormQuantF32 is RMSNormF32 of rows of d values (one segment a row) that
// also writes the FP8 input of the linear that takes y: e4m3 codes q [rows, d]
// and e8m0 scales qs [rows, d/128], as QuantFP8F32 (blk 128) of y gives them.
// The shape and alignment must fit (RMSNormQuantFits).
func RMSNormQuantF32(s *Stream, y, q, qs, x, w DevicePtr, rows, d int, eps float32, rnd bool) error {
	if rows < 0 || rows > 1<<31-1 || !RMSNormQuantFits(y, x, w, d) || q%4 != 0 || qs == 0 {
		return fmt.Errorf("cuda: rmsnorm_quant_f32: bad shape or alignment rows=%d d=%d (d %% 128 == 0, 16-byte aligned)", rows, d)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(y).Ptr(q).Ptr(qs).Ptr(x).Ptr(w).I32(d).F32(eps).I32(b2i(rnd))
	return launch(s, "ops_f32", "rmsnorm_quant_f32", Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// RMSNormQuantFits reports whether RMSNormQuantF32 takes rows of d values at
// these addresses (its float4 path: d % 128 == 0, 16-byte aligned).
func RMSNormQuantFits(y, x, w DevicePtr, d int) bool {
	return d > 0 && d%128 == 0 && (y|x|w)%16 == 0
}

// EmbedF32 gathers table rows (bf16 or fp32 [vocab, d]) for ids [rows] into
// out [rows, streams*d]. ids must be in range (checked by the caller).
func EmbedF32(s *Stream, out, table DevicePtr, bf16 bool, ids DevicePtr, rows, d, streams int) error {
	if rows < 0 || d <= 0 || streams <= 0 {
		return fmt.Errorf("cuda: embed_f32: bad shape rows=%d d=%d streams=%d", rows, d, streams)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(out).Ptr(table).I32(b2i(bf16)).Ptr(ids).I32(d).I32(streams)
	return launch(s, "ops_f32", "embed_f32", Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// CopyRowsU32 copies n rows of words 32-bit values: dst row dsti[i] (row i
// when dsti is 0) = src row srci[i], the indices device int32 arrays.
func CopyRowsU32(s *Stream, dst, src, dsti, srci DevicePtr, n int, words int64) error {
	if n < 0 || n > 65535 || words < 0 || srci == 0 {
		return fmt.Errorf("cuda: copy_rows_u32: bad shape n=%d words=%d", n, words)
	}
	if n == 0 || words == 0 {
		return nil
	}
	g := gridFor(words)
	g.X = min(g.X, 1024)
	a := new(Args).Ptr(dst).Ptr(src).Ptr(dsti).Ptr(srci).I64(words)
	return launch(s, "ops_f32", "copy_rows_u32", Dim3{g.X, uint32(n), 1}, Dim3{256, 1, 1}, 0, a)
}

// AddStreamsF32: x[r, j] += e[r, j % d] for x [rows, cols].
func AddStreamsF32(s *Stream, x, e DevicePtr, rows, cols, d int, rnd bool) error {
	if rows < 0 || d <= 0 || cols%d != 0 {
		return fmt.Errorf("cuda: add_streams_f32: bad shape rows=%d cols=%d d=%d", rows, cols, d)
	}
	n := int64(rows) * int64(cols)
	if n == 0 {
		return nil
	}
	a := new(Args).Ptr(x).Ptr(e).I32(cols).I32(d).I64(n).I32(b2i(rnd))
	return launch(s, "ops_f32", "add_streams_f32", gridFor(n), Dim3{256, 1, 1}, 0, a)
}

// ScaleF32: x *= v over n elements.
func ScaleF32(s *Stream, x DevicePtr, v float32, n int64, rnd bool) error {
	if n <= 0 {
		return nil
	}
	a := new(Args).Ptr(x).F32(v).I64(n).I32(b2i(rnd))
	return launch(s, "ops_f32", "scale_f32", gridFor(n), Dim3{256, 1, 1}, 0, a)
}

// AddF32: out = a + b over n elements.
func AddF32(s *Stream, out, x, y DevicePtr, n int64, rnd bool) error {
	if n <= 0 {
		return nil
	}
	a := new(Args).Ptr(out).Ptr(x).Ptr(y).I64(n).I32(b2i(rnd))
	return launch(s, "ops_f32", "add_f32", gridFor(n), Dim3{256, 1, 1}, 0, a)
}

// SwiGLUF32: out = silu(min(g, L)) * clamp(u, ±L) over n elements (L <= 0: no clamp).
func SwiGLUF32(s *Stream, out, g, u DevicePtr, n int64, limit float32, rnd bool) error {
	if n <= 0 {
		return nil
	}
	a := new(Args).Ptr(out).Ptr(g).Ptr(u).I64(n).F32(limit).I32(b2i(rnd))
	return launch(s, "ops_f32", "swiglu_f32", gridFor(n), Dim3{256, 1, 1}, 0, a)
}

// SwiGLUQuantF32 is SwiGLUF32 of [rows, inter] that also writes the FP8
// input of the linear that takes h: e4m3 codes q [rows, inter] and e8m0
// scales qs [rows, inter/128], as QuantFP8F32 (blk 128) of h gives them.
// The shape and alignment must fit (SwiGLUQuantFits).
func SwiGLUQuantF32(s *Stream, h, q, qs, g, u DevicePtr, rows, inter int, limit float32, rnd bool) error {
	if rows < 0 || !SwiGLUQuantFits(h, g, u, inter) || q%4 != 0 || qs == 0 {
		return fmt.Errorf("cuda: swiglu_quant_f32: bad shape or alignment rows=%d inter=%d (inter %% 128 == 0, 16-byte aligned)", rows, inter)
	}
	grid, err := warpGrid(int64(rows) * int64(inter/128))
	if err != nil {
		return fmt.Errorf("cuda: swiglu_quant_f32: %w", err)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(h).Ptr(q).Ptr(qs).Ptr(g).Ptr(u).I32(rows).I32(inter).F32(limit).I32(b2i(rnd))
	return launch(s, "ops_f32", "swiglu_quant_f32", grid, Dim3{256, 1, 1}, 0, a)
}

// SwiGLUQuantFits reports whether SwiGLUQuantF32 takes rows of inter values
// at these addresses.
func SwiGLUQuantFits(h, g, u DevicePtr, inter int) bool {
	return inter > 0 && inter%128 == 0 && (h|g|u)%16 == 0
}

// BF16ToF32 widens n bf16 values.
func BF16ToF32(s *Stream, out, in DevicePtr, n int64) error {
	if n <= 0 {
		return nil
	}
	a := new(Args).Ptr(out).Ptr(in).I64(n)
	return launch(s, "ops_f32", "bf16_to_f32_k", gridFor(n), Dim3{256, 1, 1}, 0, a)
}

// QuantFP8F32 quantises the first width columns of fp32 x [rows, cols] in
// blocks of blk (multiple of 32; the last block may be partial) to e4m3:
// codes q [rows, width] and e8m0 scales [rows, ceil(width/blk)] (either may
// be 0) and/or simulated values sim (layout of x; may be x itself).
func QuantFP8F32(s *Stream, q, scales, sim, x DevicePtr, rows, cols, width, blk int) error {
	if rows < 0 || blk <= 0 || blk%32 != 0 || width <= 0 || width > cols {
		return fmt.Errorf("cuda: quant_fp8_f32: bad shape rows=%d cols=%d width=%d blk=%d", rows, cols, width, blk)
	}
	warps := int64(rows) * int64(ceilDiv(width, blk))
	if warps == 0 {
		return nil
	}
	a := new(Args).Ptr(q).Ptr(scales).Ptr(sim).Ptr(x).I32(rows).I32(cols).I32(width).I32(blk)
	grid, err := warpGrid(warps)
	if err != nil {
		return fmt.Errorf("cuda: quant_fp8_f32: %w", err)
	}
	return launch(s, "ops_f32", "quant_fp8_f32", grid, Dim3{256, 1, 1}, 0, a)
}

// warpGrid is the grid of 256-thread CTAs for kernels that run one warp per
// work item.
func warpGrid(warps int64) (Dim3, error) {
	ctas := (warps + 7) / 8
	if ctas > 1<<31-1 {
		return Dim3{}, fmt.Errorf("%d warps exceed the grid", warps)
	}
	return Dim3{uint32(ctas), 1, 1}, nil
}

// RopeF32 rotates the last rd dims of every head of x [rows, heads*headDim]
// at positions pos [rows] (int32) with frequency tables f32 [rd/2], f64 [rd/2].
func RopeF32(s *Stream, x, pos, f32, f64 DevicePtr, rows, heads, headDim, rd int, inverse, faithful bool) error {
	if rows < 0 || heads <= 0 || rd <= 0 || rd%2 != 0 || rd > headDim {
		return fmt.Errorf("cuda: rope_f32: bad shape rows=%d heads=%d headDim=%d rd=%d", rows, heads, headDim, rd)
	}
	n := int64(rows) * int64(heads) * int64(rd/2)
	if n == 0 {
		return nil
	}
	a := new(Args).Ptr(x).Ptr(pos).Ptr(f32).Ptr(f64).I32(rows).I32(heads).I32(headDim).I32(rd).I32(b2i(inverse)).I32(b2i(faithful))
	return launch(s, "ops_f32", "rope_f32", Dim3{uint32(ceilDiv(int(n), 256)), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// RMSNormRopeKVQuantF32 is RMSNormF32 (w of d values, one segment a row),
// RopeF32 (one head of d) and, with rnd, QuantFP8F32's simulation of the
// first nope values of every row in blocks of blk, in one launch: y [rows, d]
// from x [rows, d], bit for bit the three launches.
func RMSNormRopeKVQuantF32(s *Stream, y, x, w, pos, f32, f64 DevicePtr, rows, d, rd, nope, blk int, eps float32, inverse, rnd bool) error {
	if rows < 0 || rows > 1<<31-1 || d <= 0 || rd <= 0 || rd%2 != 0 || nope < 0 || nope+rd > d || blk <= 0 || blk%32 != 0 || nope%blk != 0 {
		return fmt.Errorf("cuda: rmsnorm_rope_kvq_f32: bad shape rows=%d d=%d rd=%d nope=%d blk=%d", rows, d, rd, nope, blk)
	}
	if rows == 0 {
		return nil
	}
	a := new(Args).Ptr(y).Ptr(x).Ptr(w).Ptr(pos).Ptr(f32).Ptr(f64).I32(d).I32(rd).I32(nope).I32(blk).F32(eps).
		I32(b2i(inverse)).I32(b2i(rnd))
	return launch(s, "ops_f32", "rmsnorm_rope_kvq_f32", Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// HeadNormRopeF32 is HeadNormF32 and RopeF32 on x [rows, heads*hd] in one
// launch, bit for bit the two.
func HeadNormRopeF32(s *Stream, x, pos, f32, f64 DevicePtr, rows, heads, hd, rd int, eps float32, inverse, rnd bool) error {
	segs := int64(rows) * int64(heads)
	if rows < 0 || heads <= 0 || rd <= 0 || rd%2 != 0 || rd > hd {
		return fmt.Errorf("cuda: head_norm_rope_f32: bad shape rows=%d heads=%d hd=%d rd=%d", rows, heads, hd, rd)
	}
	if segs == 0 {
		return nil
	}
	blocks := (segs + 7) / 8 // 8 warps, one head each
	if blocks > 1<<31-1 {
		return fmt.Errorf("cuda: head_norm_rope_f32: %d heads exceed the grid", segs)
	}
	a := new(Args).Ptr(x).Ptr(pos).Ptr(f32).Ptr(f64).I64(segs).I32(heads).I32(hd).I32(rd).F32(eps).I32(b2i(inverse)).I32(b2i(rnd))
	return launch(s, "ops_f32", "head_norm_rope_f32", Dim3{uint32(blocks), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// HcPostF32: out[r, k*d+i] = post[k]*o[r, i] + Σ_j comb[j][k]*x[r, j*d+i] for
// n ≤ 8 streams; mix [rows, n+n*n]; out may alias x.
func HcPostF32(s *Stream, out, x, o, mix DevicePtr, rows, n, d int, rnd bool) error {
	if rows < 0 || n <= 0 || n > 8 || d <= 0 || rows > 65535 {
		return fmt.Errorf("cuda: hc_post_f32: bad shape rows=%d n=%d d=%d", rows, n, d)
	}
	if rows == 0 {
		return nil
	}
	grid := Dim3{uint32(ceilDiv(d, 256)), uint32(rows), 1}
	if hcStreams(n) {
		a := new(Args).Ptr(out).Ptr(x).Ptr(o).Ptr(mix).I32(d).I32(b2i(rnd))
		return launch(s, "ops_f32", fmt.Sprintf("hc_post_f32_n%d", n), grid, Dim3{256, 1, 1}, 0, a)
	}
	a := new(Args).Ptr(out).Ptr(x).Ptr(o).Ptr(mix).I32(n).I32(d).I32(b2i(rnd))
	return launch(s, "ops_f32", "hc_post_f32", grid, Dim3{256, 1, 1}, 0, a)
}

// WeightFormat is a linear's storage format for LinearF32Kernel.
type WeightFormat int

const (
	WeightF32 WeightFormat = iota
	WeightBF16
	WeightFP8Block
	WeightMXFP4
	WeightNVFP4
)

// LinearShape describes y [M, N] = x · Wᵀ in groups: output rows [g*R, (g+1)*R)
// read x columns [g*K, (g+1)*K) of rows of stride LdX (groups = N/R).
type LinearShape struct {
	M, N, K, R, LdX int
	Format          WeightFormat
	Scale2          float32 // NVFP4 global scale
	SCols           int     // scale-grid columns
}

// gemvKernels are the decode GEMV kernels of linear_f32.cu by [M > 1][format].
var gemvKernels = [2][5]string{
	{"gemv1_f32_w0", "gemv1_f32_w1", "gemv1_f32_w2", "gemv1_f32_w3", "gemv1_f32_w4"},
	{"gemv_f32_w0", "gemv_f32_w1", "gemv_f32_w2", "gemv_f32_w3", "gemv_f32_w4"},
}

// gemvMinCTAs is the grid the decode GEMV aims for: several waves of CTAs
// on a 132-SM H200, so that small N still has enough loads in flight.
const gemvMinCTAs = 2048

// gemvLogRowsPerCTA returns log2 of the GEMV's output rows per 8-warp CTA
// (rpc = 8, 4, 2 or 1; the 8/rpc warps of a row split K): the most rows that
// still give gemvMinCTAs CTAs.
func gemvLogRowsPerCTA(n int) int {
	l := 3
	for l > 0 && ceilDiv(n, 1<<l) < gemvMinCTAs {
		l--
	}
	return l
}

// GemvRows is one gemvr kernel (kernels/linear_f32.cu): the decode GEMV of
// bf16 weights for 2..MM rows with RW output rows a warp (each x value it
// loads serves RW rows) and NB register buffers of weights in flight. Each
// row's outputs are those the 1-row kernel gives for that row alone, bit
// for bit, and each weight is read once for all rows.
type GemvRows struct{ MM, RW, NB int }

func (g GemvRows) String() string { return fmt.Sprintf("m%d_r%d_b%d", g.MM, g.RW, g.NB) }

// gemvRowsKernels are the compiled variants, the planner's pick for each
// row bound first: four rows a warp, two weight buffers where the
// registers allow it (one at 8 rows).
var gemvRowsKernels = []GemvRows{{2, 4, 2}, {2, 4, 1}, {2, 2, 2}, {4, 4, 2}, {4, 4, 1}, {4, 2, 2}, {8, 4, 1}, {8, 2, 2}}

// GemvRowsVariants are the gemvr kernels that take m rows, the one
// LinearF32Kernel picks first (none outside 2..8).
func GemvRowsVariants(m int) []GemvRows {
	if m < 2 || m > 8 {
		return nil
	}
	mm := 8
	if m <= 4 {
		mm = max(2, 1<<bits.Len(uint(m-1)))
	}
	var gs []GemvRows
	for _, g := range gemvRowsKernels {
		if g.MM == mm {
			gs = append(gs, g)
		}
	}
	return gs
}

// gemvRowsFits reports whether gemvr g takes sh (the decode GEMV's K and
// alignment rules hold): bf16 weights, 2..MM rows, groups of whole warps'
// rows.
func gemvRowsFits(g GemvRows, sh LinearShape) bool {
	return slices.Contains(gemvRowsKernels, g) && sh.Format == WeightBF16 && sh.M >= 2 && sh.M <= g.MM && sh.R%g.RW == 0
}

// LinearF32Rows runs gemvr g on sh (the shape rules of LinearF32Kernel's
// decode GEMV; bf16 weights, 2..g.MM rows, R a multiple of g.RW).
// LinearF32Kernel picks GemvRowsVariants(M)[0] by itself; this runs the
// others (bench kernels, tests).
func LinearF32Rows(s *Stream, y, x, w DevicePtr, sh LinearShape, rnd bool, g GemvRows) error {
	if err := checkLinearF32(sh); err != nil {
		return err
	}
	if !gemvRowsFits(g, sh) || !gemvFits(sh, x, w) {
		return fmt.Errorf("cuda: gemvr %v: shape %+v or alignment (x %#x, w %#x) not supported", g, sh, uint64(x), uint64(w))
	}
	return launchGemvRows(s, y, x, w, sh, rnd, g)
}

func launchGemvRows(s *Stream, y, x, w DevicePtr, sh LinearShape, rnd bool, g GemvRows) error {
	lrpc := gemvLogRowsPerCTA(sh.N)
	a := new(Args).Ptr(y).Ptr(x).Ptr(w).I32(sh.M).I32(sh.N).I32(sh.K).I32(sh.R).I32(sh.LdX).I32(b2i(rnd)).I32(lrpc)
	return launch(s, "linear_f32", "gemvr_"+g.String(), Dim3{uint32(ceilDiv(sh.N, g.RW<<lrpc)), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// gemvFits reports whether the decode GEMV takes sh with x and w there.
func gemvFits(sh LinearShape, x, w DevicePtr) bool {
	return sh.M <= 8 && sh.K%8 == 0 && sh.LdX%4 == 0 && x%16 == 0 && w%16 == 0
}

// checkLinearF32 checks the shape rules every fp32 SIMT linear shares.
func checkLinearF32(sh LinearShape) error {
	if sh.M < 0 || sh.N <= 0 || sh.K <= 0 || sh.R <= 0 || sh.N%sh.R != 0 || sh.LdX < sh.K*(sh.N/sh.R) ||
		sh.Format < WeightF32 || sh.Format > WeightNVFP4 {
		return fmt.Errorf("cuda: linear_f32: bad shape %+v", sh)
	}
	if sh.Format >= WeightMXFP4 && sh.K%2 != 0 {
		return fmt.Errorf("cuda: linear_f32: FP4 needs even K, got %d", sh.K)
	}
	return nil
}

// LinearF32Kernel runs the fp32 SIMT linear (weights dequantised on chip).
func LinearF32Kernel(s *Stream, y, x, w, ws DevicePtr, sh LinearShape, rnd bool) error {
	if err := checkLinearF32(sh); err != nil {
		return err
	}
	if sh.M == 0 {
		return nil
	}
	if ceilDiv(sh.M, 64) > 65535 || sh.N/sh.R > 65535 {
		return fmt.Errorf("cuda: linear_f32: shape %+v exceeds the grid", sh)
	}
	a := new(Args).Ptr(y).Ptr(x).Ptr(w).Ptr(ws).I32(int(sh.Format)).F32(sh.Scale2).I32(sh.SCols).
		I32(sh.M).I32(sh.N).I32(sh.K).I32(sh.R).I32(sh.LdX).I32(b2i(rnd))
	if gemvFits(sh, x, w) {
		// Decode: warps stream the weights (the tiled kernel would run
		// ceil(N/64) CTAs over the whole of K); bf16 weights at 2-8 rows
		// on gemvr, one weight read for all rows.
		if gs := GemvRowsVariants(sh.M); len(gs) > 0 && gemvRowsFits(gs[0], sh) {
			return launchGemvRows(s, y, x, w, sh, rnd, gs[0])
		}
		lrpc := gemvLogRowsPerCTA(sh.N)
		name := gemvKernels[min(sh.M, 2)-1][sh.Format]
		return launch(s, "linear_f32", name, Dim3{uint32(ceilDiv(sh.N, 1<<lrpc)), 1, 1}, Dim3{256, 1, 1}, 0, a.I32(lrpc))
	}
	grid := Dim3{uint32(ceilDiv(sh.R, 64)), uint32(ceilDiv(sh.M, 64)), uint32(sh.N / sh.R)}
	return launch(s, "linear_f32", "linear_f32", grid, Dim3{256, 1, 1}, 0, a)
}

// GroupedLinearBF16 runs linear_bf16 (kernels/linear_bf16.cu): the grouped
// linear of LinearF32Kernel with rounding (faithful), on bf16 tensor cores,
// for bf16 or FP8-block weights. x must hold bf16 values (its conversion to
// bf16 is then exact); K % 32 == 0, LdX % 4 == 0, x and w 16-byte aligned.
func GroupedLinearBF16(s *Stream, y, x, w, ws DevicePtr, sh LinearShape) error {
	if !BF16GroupedFits(sh, x, w) {
		return fmt.Errorf("cuda: linear_bf16: shape %+v or alignment (x %#x, w %#x) not supported", sh, uint64(x), uint64(w))
	}
	if sh.M == 0 {
		return nil
	}
	name := "linear_bf16_w1"
	if sh.Format == WeightFP8Block {
		name = "linear_bf16_w2"
	}
	return launchLinearBF16(s, name, y, x, w, ws, sh)
}

// launchLinearBF16 launches a kernel of linear_bf16.cu: 128x128 output tiles,
// one grid z per group.
func launchLinearBF16(s *Stream, name string, y, x, w, ws DevicePtr, sh LinearShape) error {
	a := new(Args).Ptr(y).Ptr(x).Ptr(w).Ptr(ws).I32(sh.SCols).I32(sh.M).I32(sh.N).I32(sh.K).I32(sh.R).I32(sh.LdX)
	grid := Dim3{uint32(ceilDiv(sh.R, 128)), uint32(ceilDiv(sh.M, 128)), uint32(sh.N / sh.R)}
	return launch(s, "linear_bf16", name, grid, Dim3{256, 1, 1}, 0, a)
}

// LinearF32BF16x3 runs linear_bf16x3 (kernels/linear_bf16.cu): the fp32
// linear of LinearF32Kernel without rounding, for bf16 weights, on bf16
// tensor cores with x split exactly into three bf16 parts (exact products,
// fp32 sums in another order). Same shape rules as GroupedLinearBF16.
func LinearF32BF16x3(s *Stream, y, x, w DevicePtr, sh LinearShape) error {
	if sh.Format != WeightBF16 || !BF16GroupedFits(sh, x, w) {
		return fmt.Errorf("cuda: linear_bf16x3: shape %+v or alignment (x %#x, w %#x) not supported", sh, uint64(x), uint64(w))
	}
	if sh.M == 0 {
		return nil
	}
	return launchLinearBF16(s, "linear_bf16x3_w1", y, x, w, 0, sh)
}

// BF16GroupedFits reports whether GroupedLinearBF16 takes this shape.
func BF16GroupedFits(sh LinearShape, x, w DevicePtr) bool {
	return (sh.Format == WeightBF16 || sh.Format == WeightFP8Block) && sh.M >= 0 && sh.R > 0 && sh.N%sh.R == 0 &&
		sh.K > 0 && sh.K%32 == 0 && sh.LdX%4 == 0 && sh.LdX >= sh.K*(sh.N/sh.R) && x%16 == 0 && w%16 == 0 &&
		ceilDiv(sh.M, 128) <= 65535 && sh.N/sh.R <= 65535
}
