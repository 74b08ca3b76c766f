// The shared tail of the TMA-fed decode linears (linear_fp8_tdec and
// linear_fp8_tdec3): a 128-K block's promotion into the fp32 sums, and the
// four K slices summed in slice order and stored.
#pragma once
#include "sm90.cuh"

// acc += blk scaled by the block's weight scale sw and the two token scales
// of each 8-token tile (sx[tile][column pair half]). Fragment layout:
// [tile]: (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1).
DEV void tdec_promote(float (&acc)[2][4], const float (&blk)[2][4], u32 sw, const u32 (&sx)[2][2]) {
	const float wsc = e8m0_to_f32(sw);
#pragma unroll
	for (int t = 0; t < 2; t++) {
		const float x0 = e8m0_to_f32(sx[t][0]) * wsc, x1 = e8m0_to_f32(sx[t][1]) * wsc;
		acc[t][0] = fmaf(blk[t][0], x0, acc[t][0]);
		acc[t][1] = fmaf(blk[t][1], x1, acc[t][1]);
		acc[t][2] = fmaf(blk[t][2], x0, acc[t][2]);
		acc[t][3] = fmaf(blk[t][3], x1, acc[t][3]);
	}
}

// Sums the four warps' K slices in slice order through smem (the rings are
// free by now; every thread of the CTA calls it) and warp 0 stores the
// bf16-rounded outputs of rows o0.. (widened to fp32 in yf when yf != 0).
DEV void tdec_finish(u8* smem, const float (&acc)[2][4], int wid, int lane, int o0, int M, int N,
	u16* __restrict__ y, float* __restrict__ yf)
{
	const int g = lane >> 2, c = lane & 3;
	__syncthreads();
	float* red = reinterpret_cast<float*>(smem); // [warp][tile][4][32]
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int k = 0; k < 4; k++) red[((wid * 2 + t) * 4 + k) * 32 + lane] = acc[t][k];
	__syncthreads();
	if (wid != 0) return;
#pragma unroll
	for (int t = 0; t < 2; t++) {
		float v[4];
#pragma unroll
		for (int k = 0; k < 4; k++) {
			float sum = 0.f;
#pragma unroll
			for (int w = 0; w < 4; w++) sum += red[((w * 2 + t) * 4 + k) * 32 + lane];
			v[k] = sum;
		}
		const int oA = o0 + g, oB = oA + 8, t0 = 8 * t + 2 * c;
		const int os[4] = {oA, oA, oB, oB}, tk[4] = {t0, t0 + 1, t0, t0 + 1};
#pragma unroll
		for (int k = 0; k < 4; k++) {
			if (os[k] >= N || tk[k] >= M) continue;
			const u16 r = (u16)f32_to_bf16(v[k]);
			if (yf) yf[(size_t)tk[k] * N + os[k]] = __uint_as_float((u32)r << 16);
			else y[(size_t)tk[k] * N + os[k]] = r;
		}
	}
}
