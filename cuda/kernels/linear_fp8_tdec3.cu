// Decode-shaped FP8 linear (M <= 16) on Hopper (sm_90a): linear_fp8_tdec
// (the function of linear_fp8_dec, kernels/linear_fp8.cu, fed by TMA) with
// several K blocks per request and a planned ring, for the large grids where
// that pays (about 10 points of copy bandwidth on Pro wq_b and wo_b at 1
// token; slower than linear_fp8_tdec on grids of ~2 CTAs an SM). A CTA is 4 warps on the same
// 16 output rows, warp w taking K blocks [w*per, (w+1)*per); each warp owns
// a ring of ts stages, filled by its lane 0 and guarded by its own
// mbarriers, so warps never wait for each other inside the K loop.
//
// A stage is a chunk of kbs consecutive K blocks of the warp's slice: the
// weights as one rank-3 box {128 bytes, kbs blocks, 16 rows} of w viewed as
// [N][K/128][128] (each row brings kbs*128 contiguous bytes), then at xoff
// the activations as the box {128, kbs, xrows} of xq viewed the same way.
// Both land as [row][block][128 bytes] in the 128-byte swizzle, which XORs a
// 16-byte chunk's index with the 128-byte line's index mod 8 (line = row*kbs
// + block; stages start on 1024 bytes). A slice's last chunk of fewer than
// kbs blocks takes its weights block by block through the rank-2 map (16
// rows x 128 bytes each, at 2048*block: line = 16*block + row) so no weight
// byte outside the slice is read; its activation box is a whole one (blocks
// past the slice are read and ignored; past K they read zero).
//
// The MMA is mma.sync m16n8k32 e4m3 (weights as A, one or two 8-token tiles
// as B, read by ldmatrix), exact as in linear_fp8_dec; each 128-K block is
// promoted by its weight and activation scales in fp32, in block order. The
// four K slices are summed through shared memory in slice order
// (deterministic), as in linear_fp8_dec. yf != 0: the bf16-rounded outputs
// are stored widened to fp32 there. The activation box is xrows = min(M, 16)
// rows: the ldmatrix rows of tokens past it read token xrows-1 again, which
// reaches only output columns that are never stored.
//
// Shared memory (the launcher's tdecPlan): 4 rings of ts stages of sstride
// bytes, then 4*ts mbarriers, plus 1024 bytes of alignment slack.
#include "tdec.cuh"

DEV void tdec3_body(
	u16* __restrict__ y, const u8* __restrict__ xs, const u8* __restrict__ ws, int M, int N, int K,
	float* __restrict__ yf, const TmaMap& wmap, const TmaMap& wmap1,
	const TmaMap& xmap, int xrows, int kbs, int ts, int xoff, int sstride)
{
#ifdef SM90A
	extern __shared__ __align__(1024) u8 smem_raw[];
	u8* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int c = lane & 3;
	u8* const ring = smem + wid * ts * sstride;
	u64* const full = reinterpret_cast<u64*>(smem + 4 * ts * sstride) + wid * ts;
	const int o0 = blockIdx.x * 16;
	const int nkb = K / 128, per = (nkb + 3) / 4;
	const int kb0 = min(wid * per, nkb), kb1 = min(kb0 + per, nkb), nb = kb1 - kb0;
	const int nfull = nb / kbs, tail = nb - nfull * kbs, nch = nfull + (tail > 0);
	const u32 xbytes = (u32)(xrows * kbs * 128);
	if (lane == 0) {
		for (int s = 0; s < ts; s++) mbar_init(full + s, 1);
		mbar_init_fence();
	}
	__syncwarp();
	// Chunk ch's weights (lane 0), arming its stage's barrier for them and
	// its activations; rows past N read zero.
	auto wload = [&](int ch) {
		const int s = ch % ts, kb = kb0 + ch * kbs;
		u8* S = ring + s * sstride;
		if (ch < nfull) {
			mbar_arrive_expect_tx(full + s, kbs * 2048 + xbytes);
			tma_load3d(S, &wmap, full + s, 0, kb, o0);
		} else {
			mbar_arrive_expect_tx(full + s, tail * 2048 + xbytes);
			for (int j = 0; j < tail; j++) tma_load2d(S + j * 2048, &wmap1, full + s, (kb + j) * 128, o0);
		}
	};
	auto xload = [&](int ch) {
		const int s = ch % ts;
		tma_load3d(ring + s * sstride + xoff, &xmap, full + s, 0, kb0 + ch * kbs, 0);
	};
	// The first stages' weights before the PDL wait (no kernel writes them),
	// their activations after it.
	const int pre = min(ts, nch);
	if (lane == 0)
		for (int ch = 0; ch < pre; ch++) wload(ch);
	PDL_ENTRY();
	if (lane == 0)
		for (int ch = 0; ch < pre; ch++) xload(ch);

	// ldmatrix lanes: A (16 rows x 32 bytes per k32 step kk): matrices (rows
	// 0-7 | 8-15) x (bytes 0-15 | 16-31); B (tokens): matrices (tile 0 | 1) x
	// (bytes 0-15 | 16-31), or tile 0 alone (lanes 0-15) for M <= 8.
	const bool two = M > 8;
	const int ar = (lane & 7) + 8 * ((lane >> 3) & 1), ac = lane >> 4;
	const int bt = two ? (lane & 7) + 8 * (lane >> 4) : (lane & 7);
	const int br = min(bt, xrows - 1), bc = (lane >> 3) & 1;
	const u32 ring_s = smem_addr(ring);
	float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}}; // [tile]: (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)
	const u8* wsr = ws + (size_t)(o0 / 128) * nkb;
	// Scales one block ahead (their loads overlap the block before).
	u32 nsw = 0, nsx[2][2] = {{0u, 0u}, {0u, 0u}};
	const u8* xsc = xs + 2 * c * nkb; // token 2c's scales (M*nkb is small)
	auto scales = [&](int kb) {
		nsw = wsr[kb];
#pragma unroll
		for (int t = 0; t < 2; t++)
#pragma unroll
			for (int h = 0; h < 2; h++) nsx[t][h] = 8 * t + 2 * c + h < M ? xsc[(8 * t + h) * nkb + kb] : 0u;
	};
	if (nb > 0) scales(kb0);
	int ch = 0, j = 0, s = 0;
	u32 ph = 0;
	for (int i = 0; i < nb; i++) {
		const u32 sw = nsw;
		u32 sx[2][2];
#pragma unroll
		for (int t = 0; t < 2; t++)
#pragma unroll
			for (int h = 0; h < 2; h++) sx[t][h] = nsx[t][h];
		if (i + 1 < nb) scales(kb0 + i + 1);
		if (j == 0) mbar_wait(full + s, ph);
		const u32 W = ring_s + s * sstride, X = W + xoff;
		const int la = ch < nfull ? ar * kbs + j : 16 * j + ar; // 128-byte lines
		const int lb = br * kbs + j;
		float blk[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			u32 a[4], b[4];
			const int ja = 2 * kk + ac, jb = 2 * kk + bc;
			ldsm_x4(a, W + la * 128 + ((ja ^ (la & 7)) << 4));
			if (two) ldsm_x4(b, X + lb * 128 + ((jb ^ (lb & 7)) << 4));
			else ldsm_x2(b, X + lb * 128 + ((jb ^ (lb & 7)) << 4));
			// ldmatrix gives a0 = (row g, k 4c..), a1 = (g+8, 4c..), a2 = (g, 16+4c..),
			// a3 = (g+8, 16+4c..) and b = (token g, k 4c..), (g, 16+4c..) per tile.
			mma_k32(blk[0], a, b);
			if (two) mma_k32(blk[1], a, b + 2);
		}
		if (++j == (ch < nfull ? kbs : tail)) { // the chunk's last block
			__syncwarp(); // every lane's ldmatrix of stage s done before it is refilled
			if (lane == 0 && ch + ts < nch) {
				wload(ch + ts);
				xload(ch + ts);
			}
			j = 0, ch++;
			if (++s == ts) s = 0, ph ^= 1;
		}
		tdec_promote(acc, blk, sw, sx);
	}
	tdec_finish(smem, acc, wid, lane, o0, M, N, y, yf);
#else
	PDL_ENTRY();
#endif
}

// 7 CTAs an SM in the register bound (72 registers). A bound of 3, as
// linear_fp8_tdec's, gained 1-2.5 points of copy on the small grids that
// linear_fp8_tdec keeps, far from closing the gap.
extern "C" __global__ void __launch_bounds__(128, 7) linear_fp8_tdec3(u16* __restrict__ y, const u8* __restrict__ xs,
	const u8* __restrict__ ws, int M, int N, int K, float* __restrict__ yf,
	const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap wmap1,
	const __grid_constant__ TmaMap xmap, int xrows, int kbs, int ts, int xoff, int sstride)
{
	tdec3_body(y, xs, ws, M, N, K, yf, wmap, wmap1, xmap, xrows, kbs, ts, xoff, sstride);
}
