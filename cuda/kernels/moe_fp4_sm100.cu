// MoE grouped GEMM over FP4 expert weights on Blackwell tensor cores
// (sm_100a, tcgen05): the function of moe_fp4_gemm (kernels/moe_fp4.cu),
// y[m, n] = bf16(G_e · x[m, :] · W_e[n, :]) for the rows of the tile list
// moe_tile_map wrote (bm = BT rows a tile).
//
// MXFP4 (moe_fp4_tc<BT>): kind::mxf8f6f4.block_scale with A = the expert's
// weights (128 rows a work item) and B = the token tile (TMA, e4m3 as
// quantised, scale per 128 K repeated per 32). The loader warps unpack the
// FP4 codes to e4m3 (exact) into the 128-byte swizzled K-major layout and
// write the weights' own ue8m0 scales (4 a row per 128 K) into the scale atom.
// NVFP4 (moe_fp4_tc_nv<BT>): ue4m3 per 16 is no ue8m0 block scale, so both
// operands are bf16, exactly as on Hopper (moe_fp4_wg): tc_fp8_to_bf16 widens
// the activations once, the loader warps write e2m1 x e4m3 (at most 6
// significant bits) as bf16, kind::f16 multiplies, G_e is the global scale.
// A work item is 128 output columns of one tile; CTAs past the items exit
// the loops at once, so experts with no rows cost nothing.
#include "tc_gemm.cuh"

// xb[r, k] = bf16(e4m3(xq[r, k]) * 2^(xs[r, k/128] - 127)) for r < rows (the
// NVFP4 GEMM's token operand); 4 values a thread.
extern "C" __global__ void tc_fp8_to_bf16(u16* __restrict__ xb, const u8* __restrict__ xq, const u8* __restrict__ xs, int rows, int K)
{
	PDL_ENTRY();
	const size_t n4 = (size_t)rows * K / 4;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
		const size_t e = i * 4, r = e / K;
		const float sc = e8m0_to_f32(xs[r * (K / 128) + (e % K) / 128]);
		const u32 v = *reinterpret_cast<const u32*>(xq + e);
		uint2 o;
		o.x = pack_bf16x2(e4m3_to_f32(v & 0xffu) * sc, e4m3_to_f32((v >> 8) & 0xffu) * sc);
		o.y = pack_bf16x2(e4m3_to_f32((v >> 16) & 0xffu) * sc, e4m3_to_f32(v >> 24) * sc);
		*reinterpret_cast<uint2*>(xb + e) = o;
	}
}

#ifdef SM100A
// Row t's 128 K of NVFP4 weights (64 bytes of codes, 8 e4m3 scales) as bf16
// in the two 64-K swizzle atoms of Ws; exact (e2m1 x e4m3 has at most 6
// significant bits and stays in bf16's normal range).
DEV void nvfp4_row_bf16(u8* Ws, int t, const u8* codes, const u8* scales) {
	const uint4* src = reinterpret_cast<const uint4*>(codes);
	const uint2 sc8 = *reinterpret_cast<const uint2*>(scales);
#pragma unroll 1
	for (int c = 0; c < 4; c++) {
		const uint4 v = src[c];
		const u32 wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
		for (int j = 0; j < 4; j++) {
			const int idx = 4 * c + j; // 8 values: K [8 idx, 8 idx + 8), one 16-group
			const u32 sb = ((idx < 8 ? sc8.x : sc8.y) >> (8 * ((idx >> 1) & 3))) & 0xffu;
			const float s = e4m3_to_f32(sb);
			u32 o[4];
#pragma unroll
			for (int p = 0; p < 4; p++)
				o[p] = pack_bf16x2(e2m1_to_f32((wv[j] >> (8 * p)) & 0xfu) * s, e2m1_to_f32((wv[j] >> (8 * p + 4)) & 0xfu) * s);
			const int a = idx >> 3, c8 = idx & 7;
			*reinterpret_cast<uint4*>(Ws + a * (128 * 128) + t * 128 + ((c8 ^ (t & 7)) << 4)) = make_uint4(o[0], o[1], o[2], o[3]);
		}
	}
}

// Stages K block kb of weight row n of an item (thread t, rows past N
// zero) from the expert's rows at w/wscale, and the scale atoms: MXFP4 the
// weights' ue8m0 scales and the tokens' xs; NVFP4 needs none.
template <int BT, bool NV>
DEV void moe_tc_fill(const TcItem& ti, int kb, int t, u8* Ws, u8* SFA, u8* SFB, const u8* __restrict__ w,
	const u8* __restrict__ wscale, size_t row0, int N, int K, const u8* __restrict__ xs)
{
	const int n = ti.n0 + t;
	if (NV) {
		if (n < N) {
			const size_t row = row0 + n;
			nvfp4_row_bf16(Ws, t, w + row * (K / 2) + kb * 64, wscale + row * (K / 16) + kb * 8);
		} else {
#pragma unroll
			for (int c = 0; c < 16; c++) *reinterpret_cast<uint4*>(Ws + (c >> 3) * (128 * 128) + t * 128 + 16 * (c & 7)) = make_uint4(0u, 0u, 0u, 0u);
		}
		return;
	}
	u8* dst = Ws + t * 128;
	u32 sa = 0x7F7F7F7Fu; // rows past N: 2^0, finite
	if (n < N) {
		const size_t row = row0 + n;
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
}

// Work item i: tile i / ncb, the 128 columns (i % ncb) * 128 of it.
DEV TcItem moe_tc_item(const int* __restrict__ scratch, int ncb, int i) {
	const int4 tl = reinterpret_cast<const int4*>(scratch + 4)[i / ncb];
	return TcItem{tl.x, tl.y, tl.z, (i % ncb) * 128};
}

template <int BT, bool NV>
DEV void moe_fp4_tc_body(u16* __restrict__ y, const TmaMap* mapX, const int* __restrict__ scratch, const u8* __restrict__ xs,
	const u8* __restrict__ w, const u8* __restrict__ wscale, const float* __restrict__ gscale, int N, int K)
{
	const int ncb = (N + 127) / 128;
	auto item = [&](int i) { return moe_tc_item(scratch, ncb, i); };
	auto fill = [&](const TcItem& ti, int kb, int, int t, u8* Ws, u8* SFA, u8* SFB) {
		moe_tc_fill<BT, NV>(ti, kb, t, Ws, SFA, SFB, w, wscale, (size_t)ti.e * N, N, K, xs);
	};
	auto store = [&](const TcItem& ti, int r, int j, float v) {
		const int n = ti.n0 + r, m = ti.m0 + j;
		if (NV) v *= gscale ? gscale[ti.e] : 1.0f;
		if (n < N && m < ti.m1) y[(size_t)m * N + n] = (u16)f32_to_bf16(v);
	};
	auto epi = [&](const TcItem& ti, int r, u32 taddr, float*) { tc_epi_store<BT>(ti, r, taddr, store); };
	tc_gemm<BT, NV, 1>(scratch[0] * ncb, K / 128, mapX, nullptr, item, fill, epi);
}

// The w1/w3 GEMM with moe_swiglu_q (kernels/moe_fused.cu) as its epilogue,
// bit for bit: an item multiplies the gate rows (wg) and the up rows (wu) of
// the same 128 columns of h by its token tile into two accumulators; the
// epilogue rounds g and u to bf16 as the GEMM's stores would (NVFP4: times
// the global scales gg, gu), h = bf16(w · silu(min(g, L)) · clamp(u, ±L))
// with w = weights[perm[m]], and quantises each token's 128 values of h to
// e4m3 with their power-of-two scale (quant128's arithmetic; the block's
// amax over the 4 epilogue warps through red). Expert e's rows start at row
// e * estride of wg and wu. I % 128 == 0.
template <int BT, bool NV>
DEV void moe_fp4_tc_swiglu_body(u8* __restrict__ hq, u8* __restrict__ hs, const TmaMap* mapX, const int* __restrict__ scratch,
	const u8* __restrict__ xs, const u8* __restrict__ wg, const u8* __restrict__ sg, const float* __restrict__ gg,
	const u8* __restrict__ wu, const u8* __restrict__ su, const float* __restrict__ gu, int estride,
	const int* __restrict__ perm, const float* __restrict__ weights, int I, int K, float limit)
{
	const int ncb = I / 128;
	auto item = [&](int i) { return moe_tc_item(scratch, ncb, i); };
	auto fill = [&](const TcItem& ti, int kb, int h, int t, u8* Ws, u8* SFA, u8* SFB) {
		moe_tc_fill<BT, NV>(ti, kb, t, Ws, SFA, SFB, h ? wu : wg, h ? su : sg, (size_t)ti.e * estride, I, K, xs);
	};
	int chunk = 0; // chunks of 8 tokens so far, over the items: their parity picks red's buffer
	auto epi = [&](const TcItem& ti, int r, u32 taddr, float* red) {
		const int q = r >> 5, lane = r & 31;
		const float fg = NV ? gg[ti.e] : 1.0f, fu = NV ? gu[ti.e] : 1.0f;
#pragma unroll 1
		for (int j = 0; j < ti.m1 - ti.m0; j += 8) { // the same bound on every epilogue thread
			float g[8], u[8], v[8], amax[8];
			tmem_ld8(taddr + j, g);
			tmem_ld8(taddr + BT + j, u);
			float* buf = red + (chunk++ & 1) * 32;
#pragma unroll
			for (int i = 0; i < 8; i++) {
				const int m = ti.m0 + j + i;
				v[i] = 0.0f;
				if (m < ti.m1) {
					float gv = bf16_to_f32(f32_to_bf16(NV ? g[i] * fg : g[i]));
					float uv = bf16_to_f32(f32_to_bf16(NV ? u[i] * fu : u[i]));
					if (limit > 0.0f) {
						uv = fminf(fmaxf(uv, -limit), limit);
						gv = fminf(gv, limit);
					}
					const float sig = (float)(1.0 / (1.0 + exp(-(double)gv)));
					v[i] = bf16_to_f32(f32_to_bf16(weights[perm[m]] * (gv * sig * uv)));
				}
				amax[i] = warp_amax(fabsf(v[i]));
				if (lane == 0) buf[8 * q + i] = amax[i];
			}
			tc_epi_sync(); // buf is written again two chunks later, after the next sync
#pragma unroll
			for (int i = 0; i < 8; i++) {
				float a = buf[i];
#pragma unroll
				for (int w = 1; w < 4; w++) {
					const float t = buf[8 * w + i];
					if (t > a || t != t) a = t;
				}
				const int m = ti.m0 + j + i;
				if (m >= ti.m1) continue;
				u32 code = 0x7fu;
				int e = 128; // a non-finite block: NaN codes, scale byte 255
				if (a <= 3.0e38f) {
					e = fp8_scale_exp(a);
					const float sc = __uint_as_float((u32)(e + 127) << 23);
					code = f32_to_e4m3(fminf(fmaxf(__fdiv_rn(v[i], sc), -448.0f), 448.0f));
				}
				hq[(size_t)m * I + ti.n0 + r] = (u8)code;
				if (r == 0) hs[(size_t)m * ncb + ti.n0 / 128] = (u8)(e + 127);
			}
		}
	};
	tc_gemm<BT, NV, 2>(scratch[0] * ncb, K / 128, mapX, nullptr, item, fill, epi);
}
#define MOE_TC_BODY(BT, NV) moe_fp4_tc_body<BT, NV>(y, &mapX, scratch, xs, w, wscale, gscale, N, K)
#define MOE_TC_SWIGLU_BODY(BT, NV) \
	moe_fp4_tc_swiglu_body<BT, NV>(hq, hs, &mapX, scratch, xs, wg, sg, gg, wu, su, gu, estride, perm, weights, I, K, limit)
#else
#define MOE_TC_BODY(BT, NV)
#define MOE_TC_SWIGLU_BODY(BT, NV)
#endif

// xs: the activations' e8m0 scales (MXFP4; NVFP4 reads bf16 tokens through
// mapX, xs unused); gscale: NVFP4's global scales.
#define MOE_TC_KERNEL(NAME, BT, NV)                                                                                \
	extern "C" __global__ void __launch_bounds__(TC_THREADS, 1) NAME(u16* __restrict__ y,                            \
		const __grid_constant__ TmaMap mapX, const int* __restrict__ scratch, const u8* __restrict__ xs,             \
		const u8* __restrict__ w, const u8* __restrict__ wscale, const float* __restrict__ gscale, int N, int K)     \
	{                                                                                                                \
		PDL_ENTRY();                                                                                                 \
		MOE_TC_BODY(BT, NV);                                                                                         \
	}
MOE_TC_KERNEL(moe_fp4_tc16, 16, false)
MOE_TC_KERNEL(moe_fp4_tc32, 32, false)
MOE_TC_KERNEL(moe_fp4_tc64, 64, false)
MOE_TC_KERNEL(moe_fp4_tc128, 128, false)
MOE_TC_KERNEL(moe_fp4_tc_nv16, 16, true)
MOE_TC_KERNEL(moe_fp4_tc_nv32, 32, true)
MOE_TC_KERNEL(moe_fp4_tc_nv64, 64, true)
MOE_TC_KERNEL(moe_fp4_tc_nv128, 128, true)

// hq/hs: h quantised for w2 ([rows, I] e4m3, [rows, I/128] e8m0); wg/sg/gg
// and wu/su/gu: the gate and up weights, scales and (NVFP4) global scales.
#define MOE_TC_SWIGLU_KERNEL(NAME, BT, NV)                                                                         \
	extern "C" __global__ void __launch_bounds__(TC_THREADS, 1) NAME(u8* __restrict__ hq, u8* __restrict__ hs,      \
		const __grid_constant__ TmaMap mapX, const int* __restrict__ scratch, const u8* __restrict__ xs,             \
		const u8* __restrict__ wg, const u8* __restrict__ sg, const float* __restrict__ gg, const u8* __restrict__ wu, \
		const u8* __restrict__ su, const float* __restrict__ gu, int estride, const int* __restrict__ perm,           \
		const float* __restrict__ weights, int I, int K, float limit)                                                \
	{                                                                                                                \
		PDL_ENTRY();                                                                                                 \
		MOE_TC_SWIGLU_BODY(BT, NV);                                                                                  \
	}
MOE_TC_SWIGLU_KERNEL(moe_fp4_tc_swiglu16, 16, false)
MOE_TC_SWIGLU_KERNEL(moe_fp4_tc_swiglu32, 32, false)
MOE_TC_SWIGLU_KERNEL(moe_fp4_tc_swiglu64, 64, false)
MOE_TC_SWIGLU_KERNEL(moe_fp4_tc_swiglu128, 128, false)
MOE_TC_SWIGLU_KERNEL(moe_fp4_tc_swiglu_nv16, 16, true)
MOE_TC_SWIGLU_KERNEL(moe_fp4_tc_swiglu_nv32, 32, true)
MOE_TC_SWIGLU_KERNEL(moe_fp4_tc_swiglu_nv64, 64, true)
MOE_TC_SWIGLU_KERNEL(moe_fp4_tc_swiglu_nv128, 128, true)
