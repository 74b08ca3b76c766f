// MoE grouped GEMM over MXFP4 expert weights on Blackwell tensor cores
// (sm_100a, tcgen05): the function of moe_fp4_gemm (kernels/moe_fp4.cu) for
// MXFP4 weights, y[m, n] = bf16(x[m, :] · W_e[n, :]) for the rows of the tile
// list moe_tile_map wrote (bm = BT rows a tile).
//
// kind::mxf8f6f4.block_scale with A = the expert's weights (128 rows a work
// item) and B = the token tile (TMA, e4m3 as quantised, scale per 128 K
// repeated per 32). The loader warps unpack the FP4 codes to e4m3 (exact) into
// the 128-byte swizzled K-major layout and write the weights' own ue8m0
// scales (4 a row per 128 K) into the scale atom. A work item is 128 output
// columns of one tile; CTAs past the items exit the loops at once, so experts
// with no rows cost nothing.
#include "tc_gemm.cuh"

#ifdef SM100A
template <int BT>
DEV void moe_fp4_tc_body(u16* __restrict__ y, const TmaMap* mapX, const int* __restrict__ scratch, const u8* __restrict__ xs,
	const u8* __restrict__ w, const u8* __restrict__ wscale, int N, int K)
{
	const int ncb = (N + 127) / 128;
	const int items = scratch[0] * ncb;
	const int4* tiles = reinterpret_cast<const int4*>(scratch + 4);
	auto item = [&](int i) {
		const int4 tl = tiles[i / ncb];
		return TcItem{tl.x, tl.y, tl.z, (i % ncb) * 128};
	};
	auto fill = [&](const TcItem& ti, int kb, int t, u8* Ws, u8* SFA, u8* SFB) {
		const int n = ti.n0 + t;
		u8* dst = Ws + t * 128;
		u32 sa = 0x7F7F7F7Fu; // rows past N: 2^0, finite
		if (n < N) {
			const size_t row = (size_t)ti.e * N + n;
			const uint4* src = reinterpret_cast<const uint4*>(w + row * (K / 2) + kb * 64);
#pragma unroll
			for (int c = 0; c < 4; c++) {
				const uint4 v = src[c]; // 32 codes: 16-byte chunks 2c and 2c+1 of the row
				const uint4 lo = make_uint4(e2m1x4_to_e4m3(v.x & 0xffffu), e2m1x4_to_e4m3(v.x >> 16), e2m1x4_to_e4m3(v.y & 0xffffu), e2m1x4_to_e4m3(v.y >> 16));
				const uint4 hi = make_uint4(e2m1x4_to_e4m3(v.z & 0xffffu), e2m1x4_to_e4m3(v.z >> 16), e2m1x4_to_e4m3(v.w & 0xffffu), e2m1x4_to_e4m3(v.w >> 16));
				*reinterpret_cast<uint4*>(dst + (((2 * c) ^ (t & 7)) << 4)) = lo;
				*reinterpret_cast<uint4*>(dst + (((2 * c + 1) ^ (t & 7)) << 4)) = hi;
			}
			sa = *reinterpret_cast<const u32*>(wscale + row * (K / 32) + kb * 4);
		} else {
#pragma unroll
			for (int c = 0; c < 8; c++) *reinterpret_cast<uint4*>(dst + 16 * c) = make_uint4(0u, 0u, 0u, 0u);
		}
		*reinterpret_cast<u32*>(SFA + sf_atom_offset(t)) = sa;
		const int m = ti.m0 + t;
		const u32 sb = (t < BT && m < ti.m1) ? xs[(size_t)m * (K / 128) + kb] : 0x7Fu;
		*reinterpret_cast<u32*>(SFB + sf_atom_offset(t)) = sb * 0x01010101u;
	};
	auto store = [&](const TcItem& ti, int r, int j, float v) {
		const int n = ti.n0 + r, m = ti.m0 + j;
		if (n < N && m < ti.m1) y[(size_t)m * N + n] = (u16)f32_to_bf16(v);
	};
	tc_gemm<BT>(items, K / 128, mapX, nullptr, item, fill, store);
}
#define MOE_TC_BODY(BT) moe_fp4_tc_body<BT>(y, &mapX, scratch, xs, w, wscale, N, K)
#else
#define MOE_TC_BODY(BT)
#endif

#define MOE_TC_KERNEL(BT)                                                                                          \
	extern "C" __global__ void __launch_bounds__(TC_THREADS, 1) moe_fp4_tc##BT(u16* __restrict__ y,                  \
		const __grid_constant__ TmaMap mapX, const int* __restrict__ scratch, const u8* __restrict__ xs,             \
		const u8* __restrict__ w, const u8* __restrict__ wscale, int N, int K)                                       \
	{                                                                                                                \
		PDL_ENTRY();                                                                                                 \
		MOE_TC_BODY(BT);                                                                                             \
	}
MOE_TC_KERNEL(16)
MOE_TC_KERNEL(32)
MOE_TC_KERNEL(64)
MOE_TC_KERNEL(128)
