// The glue around the grouped expert GEMMs, each fused with the FP8
// activation quantisation the next GEMM needs, so that a MoE layer runs
// gather+quant, w13, swiglu+quant, w2 instead of six separate passes.
//
// One warp per (permuted row m, 128-column block), four values per lane;
// rows past offsets[E] (ids outside the experts) are left alone. The
// quantisation is quant_fp8_f32's (kernels/ops_f32.cu) for blk = 128, bit
// for bit: amax with NaN kept, scale 2^ceil(log2(max(amax,1e-4)/448)),
// e4m3 of clamp(v/s) nearest-even; a non-finite block becomes NaN codes
// with scale byte 255.
#include "moe_route.cuh"

// xq [Mtot, d] e4m3 and xs [Mtot, d/128] e8m0 of the rows x[perm[m]/K]
// (fp32 [*, d]) and/or (xg, fp32 [Mtot, d]) the gathered rows themselves.
// d % 128 == 0. Its PDL wait comes before its trigger (PDL_ENTRY), as the
// GEMMs after it, decpre (moe_fp4_decp), read the offsets before their own.
extern "C" __global__ void __launch_bounds__(256) moe_gather_q(
	u8* __restrict__ xq, u8* __restrict__ xs, float* __restrict__ xg, const float* __restrict__ x,
	const int* __restrict__ perm, const int* __restrict__ offsets, int E, int K, int d, int Mtot)
{
	PDL_ENTRY();
	const int nb = d >> 7, lane = threadIdx.x & 31;
	const long long w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
	if (w >= (long long)Mtot * nb) return;
	const int m = (int)(w / nb), b = (int)(w % nb);
	if (m >= offsets[E]) return;
	gather_store(xq, xs, xg, gather_load(x, perm[m], K, d, b, lane), d, m, b, lane);
}

// SwiGLU of the w1/w3 outputs g[m, j] and u[m, j] (row stride ld, bf16;
// exact: fp32; one fused w13 output gives u = g + I) with the clamp (limit <= 0: none) and the
// routing weight weights[perm[m]]: h = w * silu(g) * u, rounded to bf16
// (exact: not). Faithful: hq/hs receive h quantised for w2; h (optional)
// the rounded fp32 values. Exact: h fp32 [Mtot, I]. gf/uf (optional, fp32
// [Mtot, I]) receive g and u for the NaN tracer. I % 128 == 0. PDL_ENTRY
// first, as for moe_gather_q: w2's decpre reads the offsets before its wait.
extern "C" __global__ void __launch_bounds__(256) moe_swiglu_q(
	u8* __restrict__ hq, u8* __restrict__ hs, float* __restrict__ h, const void* __restrict__ gp, const void* __restrict__ up, int ld,
	const int* __restrict__ perm, const int* __restrict__ offsets, int E, const float* __restrict__ weights,
	int I, float limit, float* __restrict__ gf, float* __restrict__ uf, int Mtot, int exact)
{
	PDL_ENTRY();
	const int nb = I >> 7, lane = threadIdx.x & 31;
	const long long w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
	if (w >= (long long)Mtot * nb) return;
	const int m = (int)(w / nb), b = (int)(w % nb);
	if (m >= offsets[E]) return;
	const float wt = weights[perm[m]];
	const size_t gi = (size_t)m * ld + b * 128 + 4 * lane, o = (size_t)m * I + b * 128 + 4 * lane;
	float g[4], u[4], v[4];
	if (exact) {
		const float4 a = *reinterpret_cast<const float4*>((const float*)gp + gi);
		const float4 c = *reinterpret_cast<const float4*>((const float*)up + gi);
		g[0] = a.x; g[1] = a.y; g[2] = a.z; g[3] = a.w;
		u[0] = c.x; u[1] = c.y; u[2] = c.z; u[3] = c.w;
	} else {
		const uint2 a = *reinterpret_cast<const uint2*>((const u16*)gp + gi);
		const uint2 c = *reinterpret_cast<const uint2*>((const u16*)up + gi);
		g[0] = bf16_to_f32(a.x); g[1] = bf16_to_f32(a.x >> 16); g[2] = bf16_to_f32(a.y); g[3] = bf16_to_f32(a.y >> 16);
		u[0] = bf16_to_f32(c.x); u[1] = bf16_to_f32(c.x >> 16); u[2] = bf16_to_f32(c.y); u[3] = bf16_to_f32(c.y >> 16);
	}
	if (gf) {
		*reinterpret_cast<float4*>(gf + o) = make_float4(g[0], g[1], g[2], g[3]);
		*reinterpret_cast<float4*>(uf + o) = make_float4(u[0], u[1], u[2], u[3]);
	}
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float gv = g[i], uv = u[i];
		if (limit > 0.0f) {
			uv = fminf(fmaxf(uv, -limit), limit);
			gv = fminf(gv, limit);
		}
		const float sig = (float)(1.0 / (1.0 + exp(-(double)gv)));
		const float t = wt * (gv * sig * uv);
		v[i] = exact ? t : bf16_to_f32(f32_to_bf16(t));
	}
	if (h) *reinterpret_cast<float4*>(h + o) = make_float4(v[0], v[1], v[2], v[3]);
	if (!exact) quant128(v, lane, hq + (size_t)m * I + b * 128, hs + (size_t)m * nb + b);
}
