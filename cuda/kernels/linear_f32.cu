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

extern "C" __global__ void __launch_bounds__(256) linear_f32(
	float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
	int fmt, float scale2, int sCols, int M, int N, int K, int R, int ldx, int rnd)
{
	__shared__ float xs[TK][TM + 1];
	__shared__ float wt[TK][TN + 1];
	const int g = blockIdx.z;
	const int o0 = g * R + blockIdx.x * TN; // first output row of the tile
	const int oEnd = min((g + 1) * R, N);
	const int m0 = blockIdx.y * TM;
	const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
	const float* xg = x + (size_t)g * K;
	float acc[4][4] = {};
	for (int k0 = 0; k0 < K; k0 += TK) {
		for (int i = threadIdx.x; i < TK * TM; i += 256) {
			int mm = i / TK, kk = i % TK;
			int m = m0 + mm, k = k0 + kk;
			xs[kk][mm] = (m < M && k < K) ? xg[(size_t)m * ldx + k] : 0.0f;
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
		if (m >= M) continue;
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
