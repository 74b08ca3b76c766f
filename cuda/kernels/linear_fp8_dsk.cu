// Decode-shaped FP8 linear (M <= 16) with K split across CTAs: the same
// function and fragment layout as linear_fp8_dec (kernels/linear_fp8.cu),
// for weights small enough to be read in about one wave. Each warp owns 16
// output rows and KB consecutive 128-K blocks, and issues all of its weight
// loads (and their scales) before griddepcontrol.wait: weights do not depend
// on the previous kernel, so they stream while it finishes, and every byte of
// a one-wave shape is in flight at once. Activations and their scales are
// loaded after the wait.
// The grid is Z CTAs per 16-row group (CTA z of group g is blockIdx.x =
// g * Z + z), DSK_WARPS warps per CTA on consecutive K slices. The warps'
// sums are added in warp order through shared memory; with Z > 1 each CTA
// stores its sums to part[z][M][N] and the last CTA of the group (counter,
// splitk_last) adds them in z order and rounds once to bf16. Deterministic;
// the fp32 summation order differs from linear_fp8_dec's (docs/numerics.md).
#include "common.cuh"

#define DSK_WARPS 4

template <int T, int KB>
DEV void fp8_dsk(u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const u8* __restrict__ w, const u8* __restrict__ ws, int M, int N, int K, int Z,
	float* __restrict__ part, int* __restrict__ counters, float* __restrict__ yf)
{
	__shared__ float red[DSK_WARPS * T * 128];
	__shared__ int flag;
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int g = lane >> 2, c = lane & 3;
	const int grp = blockIdx.x / Z, z = blockIdx.x - grp * Z;
	const int nkb = K / 128;
	const int o0 = grp * 16, oA = o0 + g, oB = oA + 8;
	const bool okA = oA < N, okB = oB < N;
	const int kb0 = min((z * DSK_WARPS + wid) * KB, nkb), nb = min(KB, nkb - kb0);
	// 32-bit byte offsets (the planner keeps N * K under 2^32), as in linear_fp8_dec.
	const u32 offA = (u32)(okA ? oA : 0) * (u32)K + 16u * c, offB = offA + 8u * (u32)K;
	const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
	auto ld16 = [](const u8* base, u32 off) { return *reinterpret_cast<const uint4*>(base + off); };

	// Before the wait: this warp's weight blocks and their scales (one 16-row
	// group lies inside one 128-row scale block).
	uint4 bA[KB][2], bB[KB][2];
	u32 sw[KB];
	const u8* wsr = ws + (size_t)(o0 / 128) * nkb;
#pragma unroll
	for (int b = 0; b < KB; b++) {
		const bool in = b < nb;
		const u32 kb = (u32)(kb0 + b);
		sw[b] = in ? wsr[kb] : 0u;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			bA[b][h] = in && okA ? ld16(w, offA + 128u * kb + 64u * h) : zero;
			bB[b][h] = in && okB ? ld16(w, offB + 128u * kb + 64u * h) : zero;
		}
	}
	PDL_ENTRY();

	// Tokens: tile t holds tokens 8t..8t+7; rows >= M are zero and their
	// scale factor is masked to +0. Lanes 0..15 hold token lane's act scale.
	uint4 bX[KB][T][2];
	u32 sx[KB];
	const int xr = lane & 15;
	const u8* xsr = xs + (size_t)(xr < M ? xr : 0) * nkb;
	const u32 scMask = xr < M ? ~0u : 0u;
#pragma unroll
	for (int b = 0; b < KB; b++) {
		const bool in = b < nb;
		const u32 kb = (u32)(kb0 + b);
		sx[b] = in ? xsr[kb] : 0u;
#pragma unroll
		for (int t = 0; t < T; t++) {
			const int tok = t * 8 + g;
			const u32 offX = (u32)(tok < M ? tok : 0) * (u32)K + 16u * c;
#pragma unroll
			for (int h = 0; h < 2; h++) bX[b][t][h] = in && tok < M ? ld16(xq, offX + 128u * kb + 64u * h) : zero;
		}
	}

	float acc[T][4];
#pragma unroll
	for (int t = 0; t < T; t++)
#pragma unroll
		for (int i = 0; i < 4; i++) acc[t][i] = 0.f;
#pragma unroll
	for (int b = 0; b < KB; b++) {
		if (b >= nb) break;
		float blk[T][4];
#pragma unroll
		for (int t = 0; t < T; t++)
#pragma unroll
			for (int i = 0; i < 4; i++) blk[t][i] = 0.f;
#pragma unroll
		for (int j = 0; j < 4; j++) {
			const uint4 &va = bA[b][j >> 1], &vb = bB[b][j >> 1];
			const bool hi = j & 1;
			const u32 a[4] = {hi ? va.z : va.x, hi ? vb.z : vb.x, hi ? va.w : va.y, hi ? vb.w : vb.y};
#pragma unroll
			for (int t = 0; t < T; t++) {
				const uint4& vx = bX[b][t][j >> 1];
				const u32 bf[2] = {hi ? vx.z : vx.x, hi ? vx.w : vx.y};
				mma_k32(blk[t], a, bf);
			}
		}
		const float wsc = e8m0_to_f32_sel(sw[b]);
		const float fOwn = __uint_as_float(__float_as_uint(e8m0_to_f32_sel(sx[b]) * wsc) & scMask);
#pragma unroll
		for (int t = 0; t < T; t++) {
			const float x0 = __shfl_sync(0xffffffffu, fOwn, t * 8 + 2 * c);
			const float x1 = __shfl_sync(0xffffffffu, fOwn, t * 8 + 2 * c + 1);
			acc[t][0] = fmaf(blk[t][0], x0, acc[t][0]);
			acc[t][1] = fmaf(blk[t][1], x1, acc[t][1]);
			acc[t][2] = fmaf(blk[t][2], x0, acc[t][2]);
			acc[t][3] = fmaf(blk[t][3], x1, acc[t][3]);
		}
	}

	// The CTA's slices in warp order (warp 0 keeps the sum).
	if (wid > 0) {
#pragma unroll
		for (int t = 0; t < T; t++)
#pragma unroll
			for (int i = 0; i < 4; i++) red[((wid * T + t) * 4 + i) * 32 + lane] = acc[t][i];
	}
	__syncthreads();
	if (wid == 0) {
		for (int q = 1; q < DSK_WARPS; q++)
#pragma unroll
			for (int t = 0; t < T; t++)
#pragma unroll
				for (int i = 0; i < 4; i++) acc[t][i] += red[((q * T + t) * 4 + i) * 32 + lane];
		// Fragment (t, i): output row oA (i < 2) or oB, token 8t + 2c + (i & 1).
#pragma unroll
		for (int t = 0; t < T; t++)
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const int o = i < 2 ? oA : oB, tk = t * 8 + 2 * c + (i & 1);
				if (o >= N || tk >= M) continue;
				const size_t at = (size_t)tk * N + o;
				if (Z > 1) {
					part[(size_t)z * M * N + at] = acc[t][i];
				} else {
					const u32 v = f32_to_bf16(acc[t][i]);
					if (yf) yf[at] = bf16_to_f32(v);
					else y[at] = (u16)v;
				}
			}
	}
	if (Z == 1 || !splitk_last(counters + grp, Z, &flag)) return;
	// The last CTA of the group: 16 x M outputs, each the z-ordered sum.
	const size_t plane = (size_t)M * N;
	for (int i = threadIdx.x; i < 16 * M; i += blockDim.x) {
		const int tk = i >> 4, o = o0 + (i & 15);
		if (o >= N) continue;
		const size_t at = (size_t)tk * N + o;
		const u32 v = f32_to_bf16(sum_splits(part + at, plane, Z));
		if (yf) yf[at] = bf16_to_f32(v);
		else y[at] = (u16)v;
	}
}

// Entry points by token tiles T (M <= 8: 1, else 2) and K blocks a warp KB.
#define DSK_ENTRY(T, KB)                                                                                         \
	extern "C" __global__ void __launch_bounds__(32 * DSK_WARPS) linear_fp8_dsk##T##_##KB(u16* __restrict__ y, \
		const u8* __restrict__ xq, const u8* __restrict__ xs, const u8* __restrict__ w, const u8* __restrict__ ws, \
		int M, int N, int K, int Z, float* __restrict__ part, int* __restrict__ counters, float* __restrict__ yf) \
	{                                                                                                            \
		fp8_dsk<T, KB>(y, xq, xs, w, ws, M, N, K, Z, part, counters, yf);                                       \
	}
DSK_ENTRY(1, 1)
DSK_ENTRY(1, 2)
DSK_ENTRY(1, 4)
DSK_ENTRY(2, 1)
DSK_ENTRY(2, 2)
