// fp32 SIMT linear for the GPU backend: y[m, o] = rnd(sum_k x[m, xoff(o) + k] * W[o, k])
// with W read in its checkpoint format and dequantised exactly to fp32 while it
// is staged in shared memory (fmt: 0 f32, 1 bf16, 2 FP8 block 128x128 e8m0,
// 3 MXFP4 e8m0/32, 4 NVFP4 e4m3/16 * scale2). Used for the fp32 linears
// (compressor, router gate, head), bf16 weights, the grouped output projection
// (gridDim.z = groups: output rows [z*R, (z+1)*R) read x columns [z*K, (z+1)*K))
// and exact mode. Register tiling: a 64x64 tile per 256 threads, 4x4 each.
#include "common.cuh"

#define TM 64
#define TN 64
#define TK 16

DEV float wload(const u8* w, const u8* ws, int fmt, float scale2, int o, int k, int K, int sCols) {
	switch (fmt) {
	case 0: return ((const float*)w)[(size_t)o * K + k];
	case 1: return bf16_to_f32(((const u16*)w)[(size_t)o * K + k]);
	case 2: return e4m3_to_f32(w[(size_t)o * K + k]) * e8m0_to_f32(ws[(size_t)(o / 128) * sCols + k / 128]);
	case 3: {
		u32 by = w[(size_t)o * (K / 2) + k / 2];
		return e2m1_to_f32((k & 1) ? by >> 4 : by & 15u) * e8m0_to_f32(ws[(size_t)o * sCols + k / 32]);
	}
	default: {
		u32 by = w[(size_t)o * (K / 2) + k / 2];
		return e2m1_to_f32((k & 1) ? by >> 4 : by & 15u) * (e4m3_to_f32(ws[(size_t)o * sCols + k / 16]) * scale2);
	}
	}
}

// tile_f32 computes one 64x64 output tile: rows [m0, min(m0+64, mEnd)) of x
// (stride ldx), output rows [o0, min(o0+64, oEnd)) of W, into y (stride N).
DEV void tile_f32(float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
	int fmt, float scale2, int sCols, int m0, int mEnd, int o0, int oEnd, int N, int K, int ldx, int rnd)
{
	__shared__ float xs[TK][TM + 1];
	__shared__ float wt[TK][TN + 1];
	const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
	float acc[4][4] = {};
	for (int k0 = 0; k0 < K; k0 += TK) {
		for (int i = threadIdx.x; i < TK * TM; i += 256) {
			int mm = i / TK, kk = i % TK;
			int m = m0 + mm, k = k0 + kk;
			xs[kk][mm] = (m < mEnd && k < K) ? x[(size_t)m * ldx + k] : 0.0f;
			int o = o0 + mm;
			wt[kk][mm] = (o < oEnd && k < K) ? wload(w, ws, fmt, scale2, o, k, K, sCols) : 0.0f;
		}
		__syncthreads();
#pragma unroll
		for (int kk = 0; kk < TK; kk++) {
			float a[4], bv[4];
#pragma unroll
			for (int i = 0; i < 4; i++) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
			for (int j = 0; j < 4; j++) bv[j] = wt[kk][tx * 4 + j];
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < 4; j++) acc[i][j] += a[i] * bv[j];
		}
		__syncthreads();
	}
#pragma unroll
	for (int i = 0; i < 4; i++) {
		int m = m0 + ty * 4 + i;
		if (m >= mEnd) continue;
#pragma unroll
		for (int j = 0; j < 4; j++) {
			int o = o0 + tx * 4 + j;
			if (o < oEnd) {
				float v = acc[i][j];
				y[(size_t)m * N + o] = rnd ? bf16_to_f32(f32_to_bf16(v)) : v;
			}
		}
	}
}

extern "C" __global__ void __launch_bounds__(256) linear_f32(
	float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
	int fmt, float scale2, int sCols, int M, int N, int K, int R, int ldx, int rnd)
{
	const int g = blockIdx.z;
	const int o0 = g * R + blockIdx.x * TN; // first output row of the tile
	tile_f32(y, x + (size_t)g * K, w, ws, fmt, scale2, sCols, blockIdx.y * TM, M, o0, min((g + 1) * R, N), N, K, ldx, rnd);
}

// Exact-mode grouped expert linear: for expert e = blockIdx.z and rows m in
// [offsets[e], offsets[e+1]), y[m, :] = x[m, :] · W_eᵀ in fp32, W_e the FP4
// weights of expert e (fmt 3 MXFP4 or 4 NVFP4, scale2 = gscale[e]) at byte
// strides wStride/sStride. Blocks past an expert's rows return at once.
extern "C" __global__ void __launch_bounds__(256) moe_linear_f32(
	float* __restrict__ y, const float* __restrict__ x, const int* __restrict__ offsets,
	const u8* __restrict__ w, const u8* __restrict__ ws, const float* __restrict__ gscale,
	int fmt, long long wStride, long long sStride, int sCols, int N, int K)
{
	const int e = blockIdx.z;
	const int lo = offsets[e], hi = offsets[e + 1];
	const int m0 = lo + blockIdx.y * TM;
	if (m0 >= hi) return;
	const float scale2 = gscale ? gscale[e] : 1.0f;
	tile_f32(y, x, w + e * wStride, ws + e * sStride, fmt, scale2, sCols, m0, hi, blockIdx.x * TN, N, N, K, K, 0);
}

// w8 loads weights [o, k..k+8) of row o as fp32 (k % 8 == 0, K % 8 == 0).
DEV void w8(const u8* w, const u8* ws, int fmt, float scale2, int o, int k, int K, int sCols, float* v) {
	switch (fmt) {
	case 0: {
		const float4* p = reinterpret_cast<const float4*>(w + ((size_t)o * K + k) * 4);
		float4 a = p[0], b = p[1];
		v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
		return;
	}
	case 1: {
		uint4 q = *reinterpret_cast<const uint4*>(w + ((size_t)o * K + k) * 2);
		u32 u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
		for (int i = 0; i < 4; i++) { v[2 * i] = bf16_to_f32(u[i] & 0xffffu); v[2 * i + 1] = bf16_to_f32(u[i] >> 16); }
		return;
	}
	case 2: {
		uint2 q = *reinterpret_cast<const uint2*>(w + (size_t)o * K + k);
		const float s = e8m0_to_f32(ws[(size_t)(o / 128) * sCols + k / 128]);
#pragma unroll
		for (int i = 0; i < 4; i++) { v[i] = e4m3_to_f32((q.x >> (8 * i)) & 0xffu) * s; v[4 + i] = e4m3_to_f32((q.y >> (8 * i)) & 0xffu) * s; }
		return;
	}
	default:
#pragma unroll
		for (int i = 0; i < 8; i++) v[i] = wload(w, ws, fmt, scale2, o, k + i, K, sCols);
	}
}

// Decode GEMV (M <= 8 rows), same function as linear_f32: one warp per
// output row o streams W[o, :] in its format (8 weights per lane per step,
// coalesced) against every row of x, then a warp reduction. x rows need
// 16-byte alignment (ldx % 4 == 0, K % 8 == 0).
extern "C" __global__ void __launch_bounds__(256) gemv_f32(
	float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
	int fmt, float scale2, int sCols, int M, int N, int K, int R, int ldx, int rnd)
{
	const int o = blockIdx.x * 8 + (threadIdx.x >> 5);
	if (o >= N) return;
	const int lane = threadIdx.x & 31;
	const float* xg = x + (size_t)(o / R) * K;
	float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
	for (int k = lane * 8; k < K; k += 256) {
		float v[8];
		w8(w, ws, fmt, scale2, o, k, K, sCols, v);
#pragma unroll
		for (int m = 0; m < 8; m++) {
			if (m >= M) break;
			const float4* xp = reinterpret_cast<const float4*>(xg + (size_t)m * ldx + k);
			float4 a = xp[0], b = xp[1];
			acc[m] += a.x * v[0] + a.y * v[1] + a.z * v[2] + a.w * v[3] + b.x * v[4] + b.y * v[5] + b.z * v[6] + b.w * v[7];
		}
	}
#pragma unroll
	for (int m = 0; m < 8; m++) {
		if (m >= M) break;
		const float s = warp_sum(acc[m]);
		if (lane == 0) y[(size_t)m * N + o] = rnd ? bf16_to_f32(f32_to_bf16(s)) : s;
	}
}
