// FP8 dense linear on Blackwell tensor cores (sm_100a, tcgen05): y = x · Wᵀ
// with DeepSeek's block scaling (spec §3.4), the function of linear_fp8
// (kernels/linear_fp8.cu). Swap-AB: 128 weight rows are the MMA's M, BT
// tokens its N, so decode shapes waste no weight bandwidth.
//
// The power-of-two 128x128 weight scales and 1x128 activation scales are
// exact ue8m0 block scales: kind::mxf8f6f4.block_scale reads each one four
// times (once per 32 K), as DeepGEMM's sm100 FP8 GEMM does, and the tensor
// core applies them. Both tiles come by TMA; the loader warps write only
// the scale atoms. Work item i: weight block i % ncb, token block i / ncb.
#include "tc_gemm.cuh"

#ifdef SM100A
template <int BT>
DEV void linear_fp8_tc_body(u16* __restrict__ y, float* __restrict__ yf, const TmaMap* mapX, const TmaMap* mapW,
	const u8* __restrict__ xs, const u8* __restrict__ ws, int M, int N, int K)
{
	const int ncb = (N + 127) / 128;
	const int items = ncb * ((M + BT - 1) / BT);
	auto item = [&](int i) {
		const int m0 = (i / ncb) * BT;
		return TcItem{0, m0, min(m0 + BT, M), (i % ncb) * 128};
	};
	auto fill = [&](const TcItem& ti, int kb, int, int t, u8*, u8* SFA, u8* SFB) {
		const u32 sa = ws[(size_t)(ti.n0 / 128) * (K / 128) + kb]; // one scale for the 128 rows
		*reinterpret_cast<u32*>(SFA + sf_atom_offset(t)) = sa * 0x01010101u;
		const int m = ti.m0 + t;
		const u32 sb = (t < BT && m < ti.m1) ? xs[(size_t)m * (K / 128) + kb] : 0x7Fu;
		*reinterpret_cast<u32*>(SFB + sf_atom_offset(t)) = sb * 0x01010101u;
	};
	auto store = [&](const TcItem& ti, int r, int j, float v) {
		const int n = ti.n0 + r, m = ti.m0 + j;
		if (n < N && m < ti.m1) {
			const u32 h = f32_to_bf16(v);
			if (y) y[(size_t)m * N + n] = (u16)h;
			if (yf) yf[(size_t)m * N + n] = bf16_to_f32(h);
		}
	};
	auto epi = [&](const TcItem& ti, int r, u32 taddr, float*) { tc_epi_store<BT>(ti, r, taddr, store); };
	tc_gemm<BT, false, 1>(items, K / 128, mapX, mapW, item, fill, epi);
}
#define LINEAR_TC_BODY(BT) linear_fp8_tc_body<BT>(y, yf, &mapX, &mapW, xs, ws, M, N, K)
#else
#define LINEAR_TC_BODY(BT)
#endif

#define LINEAR_TC_KERNEL(BT)                                                                                       \
	extern "C" __global__ void __launch_bounds__(TC_THREADS, 1) linear_fp8_tc##BT(u16* __restrict__ y,               \
		float* __restrict__ yf, const __grid_constant__ TmaMap mapX, const __grid_constant__ TmaMap mapW,            \
		const u8* __restrict__ xs, const u8* __restrict__ ws, int M, int N, int K)                                   \
	{                                                                                                                \
		PDL_ENTRY();                                                                                                 \
		LINEAR_TC_BODY(BT);                                                                                          \
	}
LINEAR_TC_KERNEL(16)
LINEAR_TC_KERNEL(32)
LINEAR_TC_KERNEL(64)
LINEAR_TC_KERNEL(128)
