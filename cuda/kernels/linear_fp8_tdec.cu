// Decode-shaped FP8 linear (M <= 16) on Hopper (sm_90a): the function of
// linear_fp8_dec (kernels/linear_fp8.cu) with the weights and activations
// streamed by TMA instead of per-thread loads. A CTA is 4 warps on the same
// 16 output rows, warp w taking K blocks [w*per, (w+1)*per); each warp owns
// a ring of TS stages (16 weight rows x 128 bytes and 16 tokens x 128 bytes,
// both in the 128-byte swizzle), filled by its lane 0 and guarded by its own
// mbarriers, so warps never wait for each other inside the K loop. The MMA is
// mma.sync m16n8k32 e4m3 (weights as A, one or two 8-token tiles as B, read
// by ldmatrix), exact as in linear_fp8_dec; each 128-K block is promoted by
// its weight and activation scales in fp32. The four K slices are summed
// through shared memory in slice order (deterministic), as in linear_fp8_dec.
// yf != 0: the bf16-rounded outputs are stored widened to fp32 there. The
// activation box is xrows = min(M, 16) rows: token rows past it hold stale
// bytes, which reach only output columns that are never stored.
#include "tdec.cuh"

#define TS 4                      // ring stages per warp
#define TSTAGE 4096               // weights 2048 + activations 2048
#define TWARP (TS * TSTAGE)       // one warp's ring
#define TBYTES (4 * TWARP + 8 * 4 * TS)

extern "C" __global__ void __launch_bounds__(128, 3) linear_fp8_tdec(
	u16* __restrict__ y, const u8* __restrict__ xs, const u8* __restrict__ ws, int M, int N, int K,
	float* __restrict__ yf, const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap xmap, int xrows)
{
#ifdef SM90A
	extern __shared__ __align__(1024) u8 smem_raw[]; // TBYTES + 1024 slack
	u8* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int c = lane & 3;
	u8* const ring = smem + wid * TWARP;
	u64* const full = reinterpret_cast<u64*>(smem + 4 * TWARP) + wid * TS;
	const int o0 = blockIdx.x * 16;
	const int nkb = K / 128, per = (nkb + 3) / 4;
	const int kb0 = min(wid * per, nkb), kb1 = min(kb0 + per, nkb), nb = kb1 - kb0;
	if (lane == 0) {
#pragma unroll
		for (int s = 0; s < TS; s++) mbar_init(full + s, 1);
		mbar_init_fence();
	}
	__syncwarp();
	// The first stages' weights before the PDL wait (no kernel writes them),
	// their activations after it.
	if (lane == 0)
		for (int s = 0; s < TS && s < nb; s++) {
			mbar_arrive_expect_tx(full + s, 2048 + 128 * xrows);
			tma_load2d(ring + s * TSTAGE, &wmap, full + s, (kb0 + s) * 128, o0); // rows past N read zero
		}
	PDL_ENTRY();
	if (lane == 0)
		for (int s = 0; s < TS && s < nb; s++) tma_load2d(ring + s * TSTAGE + 2048, &xmap, full + s, (kb0 + s) * 128, 0);
	auto issue = [&](int s, int kb) {
		if (lane != 0) return;
		u8* S = ring + s * TSTAGE;
		mbar_arrive_expect_tx(full + s, 2048 + 128 * xrows);
		tma_load2d(S, &wmap, full + s, kb * 128, o0);
		tma_load2d(S + 2048, &xmap, full + s, kb * 128, 0);
	};

	// ldmatrix lane addresses (128-byte swizzle: chunk j of row r at j ^ (r & 7)).
	// A (16 rows x 32 bytes per k32 step kk): matrices (rows 0-7 | 8-15) x
	// (bytes 0-15 | 16-31); B (tokens): matrices (tile 0 | 1) x (bytes 0-15 | 16-31).
	const int ar = (lane & 7) + 8 * ((lane >> 3) & 1), ac = lane >> 4;
	const int br = (lane & 7) + 8 * (lane >> 4), bc = (lane >> 3) & 1;
	const u32 ring_s = smem_addr(ring);
	const bool two = M > 8;
	float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}}; // [tile]: (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)
	const u8* wsr = ws + (size_t)(o0 / 128) * nkb;
	for (int i = 0; i < nb; i++) {
		const int s = i % TS, kb = kb0 + i;
		const u32 sw = wsr[kb];
		u32 sx[2][2];
#pragma unroll
		for (int t = 0; t < 2; t++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int tok = 8 * t + 2 * c + h;
				sx[t][h] = tok < M ? xs[(size_t)tok * nkb + kb] : 0u;
			}
		mbar_wait(full + s, (i / TS) & 1);
		const u32 W = ring_s + s * TSTAGE, X = W + 2048;
		float blk[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			u32 a[4], b[4];
			const int ja = 2 * kk + ac, jb = 2 * kk + bc;
			ldsm_x4(a, W + ar * 128 + ((ja ^ (ar & 7)) << 4));
			if (two) ldsm_x4(b, X + br * 128 + ((jb ^ (br & 7)) << 4));
			else ldsm_x2(b, X + (lane & 7) * 128 + ((jb ^ (lane & 7)) << 4));
			// ldmatrix gives a0 = (row g, k 4c..), a1 = (g+8, 4c..), a2 = (g, 16+4c..),
			// a3 = (g+8, 16+4c..) and b = (token g, k 4c..), (g, 16+4c..) per tile.
			mma_k32(blk[0], a, b);
			if (two) mma_k32(blk[1], a, b + 2);
		}
		__syncwarp(); // every lane's ldmatrix of stage s done before it is refilled
		if (i + TS < nb) issue(s, kb + TS);
		tdec_promote(acc, blk, sw, sx);
	}
	tdec_finish(smem, acc, wid, lane, o0, M, N, y, yf);
#else
	PDL_ENTRY();
#endif
}
