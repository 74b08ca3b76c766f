// Decode-shaped MoE grouped GEMM over FP4 expert weights: the same function
// as moe_fp4_gemm (kernels/moe_fp4.cu) for tile lists of at most 8 rows per
// tile (moe_tile_map with bm = 8), built for the weight stream rather than
// for reuse: the weights are the MMA's A operand (16 output columns per
// warp), the tile's tokens its B operand (n = 8), so no row slots are wasted.
//
// The FP4 codes go straight from global memory to registers and become e4m3
// bytes by a byte permute (e2m1 values are exact in e4m3); one m16n8k32 e4m3
// MMA covers exactly one MXFP4 scale group, whose scale is applied to the
// fresh product in fp32; NVFP4 (16-groups) runs two MMAs per 32 K with the
// other group's lanes zeroed. Activation scales promote per 128 K. Logical K
// inside an MMA is permuted identically in A and B (thread c holds physical
// elements 8c..8c+7 of the group), so each thread loads whole 4-byte code
// words. sm_80 (no FP8 MMA) takes two f16 k16 MMAs per k32.
//
// Split K: with part != 0, CTA z covers K blocks [z*kbPer, (z+1)*kbPer) and
// stores fp32 sums (times G_e) to part[z][Mtot][N] for linear_fp8_reduce.
#include "common.cuh"

DEV u32 prmt(u32 a, u32 b, u32 sel) {
	u32 d;
	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
	return d;
}

// Four e2m1 codes (16 bits, element i in nibble i) -> four e4m3 bytes.
DEV u32 e2m1x4_to_e4m3x4(u32 v) {
	const u32 mag = prmt(0x3C383000u, 0x4C484440u, v & 0x7777u);
	const u32 x = prmt(v, 0u, 0x1100u); // bytes [v0, v0, v1, v1]
	return mag | ((x & 0x00080008u) << 4) | (x & 0x80008000u);
}

extern "C" __global__ void __launch_bounds__(128) moe_fp4_dec(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int nvfp4, int N, int K, float* __restrict__ part, int kbPer, int Mtot)
{
	const int t = blockIdx.y;
	if (t >= scratch[0]) return;
	const int4 tile = reinterpret_cast<const int4*>(scratch + 4)[t];
	const int e = tile.x, mBeg = tile.y, mEnd = tile.z;
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int g = lane >> 2, c = lane & 3;
	const int oA = blockIdx.x * 64 + wid * 16 + g, oB = oA + 8; // output columns (MMA rows)
	const bool okA = oA < N, okB = oB < N;
	const int nkb = K / 128;
	const int kb0 = part ? blockIdx.z * kbPer : 0;
	const int kb1 = part ? min(kb0 + kbPer, nkb) : nkb;
	const int gpr = nvfp4 ? K / 16 : K / 32; // scale groups per weight row
	const u8* we = w + (size_t)e * N * (K / 2);
	const u8* se = wscale + (size_t)e * N * gpr;
	const u8* wA = we + (size_t)(okA ? oA : 0) * (K / 2) + 4 * c;
	const u8* wB = we + (size_t)(okB ? oB : 0) * (K / 2) + 4 * c;
	const u8* sA = se + (size_t)(okA ? oA : 0) * gpr;
	const u8* sB = se + (size_t)(okB ? oB : 0) * gpr;
	const int tokB = mBeg + g; // this thread's B column (token)
	const bool okT = tokB < mEnd;
	const u8* xr = xq + (size_t)(okT ? tokB : 0) * K + 8 * c;
	const int t0 = mBeg + 2 * c, t1 = t0 + 1; // D columns
	float acc[4] = {0.f, 0.f, 0.f, 0.f};
	// Register double buffer: the next block's codes and activations are in
	// flight while this block converts and multiplies.
	u32 nA[4], nB[4];
	uint2 nx[4];
	auto fetch = [&](int kb) {
#pragma unroll
		for (int j = 0; j < 4; j++) {
			nA[j] = okA ? *reinterpret_cast<const u32*>(wA + (size_t)kb * 64 + 16 * j) : 0u;
			nB[j] = okB ? *reinterpret_cast<const u32*>(wB + (size_t)kb * 64 + 16 * j) : 0u;
			nx[j] = okT ? *reinterpret_cast<const uint2*>(xr + (size_t)kb * 128 + 32 * j) : make_uint2(0u, 0u);
		}
	};
	if (kb0 < kb1) fetch(kb0);
	for (int kb = kb0; kb < kb1; kb++) {
		u32 cA[4], cB[4];
		uint2 xv[4];
#pragma unroll
		for (int j = 0; j < 4; j++) { cA[j] = nA[j]; cB[j] = nB[j]; xv[j] = nx[j]; }
		if (kb + 1 < kb1) fetch(kb + 1);
		float blk[4] = {0.f, 0.f, 0.f, 0.f};
		if (!nvfp4) {
			const u32 scA = okA ? *reinterpret_cast<const u32*>(sA + kb * 4) : 0u;
			const u32 scB = okB ? *reinterpret_cast<const u32*>(sB + kb * 4) : 0u;
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const u32 a[4] = {e2m1x4_to_e4m3x4(cA[j] & 0xffffu), e2m1x4_to_e4m3x4(cB[j] & 0xffffu),
					e2m1x4_to_e4m3x4(cA[j] >> 16), e2m1x4_to_e4m3x4(cB[j] >> 16)};
				const u32 b[2] = {xv[j].x, xv[j].y};
				float p[4] = {0.f, 0.f, 0.f, 0.f};
				mma_k32(p, a, b);
				const float fA = e8m0_to_f32((scA >> (8 * j)) & 0xffu), fB = e8m0_to_f32((scB >> (8 * j)) & 0xffu);
				blk[0] = fmaf(p[0], fA, blk[0]);
				blk[1] = fmaf(p[1], fA, blk[1]);
				blk[2] = fmaf(p[2], fB, blk[2]);
				blk[3] = fmaf(p[3], fB, blk[3]);
			}
		} else {
			const uint2 scA = okA ? *reinterpret_cast<const uint2*>(sA + kb * 8) : make_uint2(0u, 0u);
			const uint2 scB = okB ? *reinterpret_cast<const uint2*>(sB + kb * 8) : make_uint2(0u, 0u);
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const u32 a[4] = {e2m1x4_to_e4m3x4(cA[j] & 0xffffu), e2m1x4_to_e4m3x4(cB[j] & 0xffffu),
					e2m1x4_to_e4m3x4(cA[j] >> 16), e2m1x4_to_e4m3x4(cB[j] >> 16)};
				const u32 b[2] = {xv[j].x, xv[j].y};
				const u32 z[4] = {0u, 0u, 0u, 0u};
#pragma unroll
				for (int h = 0; h < 2; h++) { // 16-group 2j+h: lanes c = 2h, 2h+1
					const bool mine = (c >> 1) == h;
					float p[4] = {0.f, 0.f, 0.f, 0.f};
					mma_k32(p, mine ? a : z, b);
					const int grp = 2 * j + h; // byte in the 8 scales of this 128 block
					const u32 wa = grp < 4 ? scA.x : scA.y, wb = grp < 4 ? scB.x : scB.y;
					const float fA = e4m3_to_f32((wa >> (8 * (grp & 3))) & 0xffu);
					const float fB = e4m3_to_f32((wb >> (8 * (grp & 3))) & 0xffu);
					blk[0] = fmaf(p[0], fA, blk[0]);
					blk[1] = fmaf(p[1], fA, blk[1]);
					blk[2] = fmaf(p[2], fB, blk[2]);
					blk[3] = fmaf(p[3], fB, blk[3]);
				}
			}
		}
		const float x0 = t0 < mEnd ? e8m0_to_f32(xs[(size_t)t0 * nkb + kb]) : 0.f;
		const float x1 = t1 < mEnd ? e8m0_to_f32(xs[(size_t)t1 * nkb + kb]) : 0.f;
		acc[0] = fmaf(blk[0], x0, acc[0]);
		acc[1] = fmaf(blk[1], x1, acc[1]);
		acc[2] = fmaf(blk[2], x0, acc[2]);
		acc[3] = fmaf(blk[3], x1, acc[3]);
	}
	const float G = (nvfp4 && gscale) ? gscale[e] : 1.0f;
	// D element (row o, column token): d0 (oA, t0), d1 (oA, t1), d2 (oB, t0), d3 (oB, t1).
	const int os[4] = {oA, oA, oB, oB}, ts[4] = {t0, t1, t0, t1};
#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (os[i] >= N || ts[i] >= mEnd) continue;
		const float v = acc[i] * G;
		if (part) part[((size_t)blockIdx.z * Mtot + ts[i]) * N + os[i]] = v;
		else y[(size_t)ts[i] * N + os[i]] = (u16)f32_to_bf16(v);
	}
}
