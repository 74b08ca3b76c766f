// RMSNorm (spec §3.1): y = bf16( w * (x * r) ), r = 1/sqrt(mean(x^2) + eps),
// everything in fp32, one rounding. One block per row; dim must be even.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) rmsnorm_bf16(
	u16* __restrict__ out, const u16* __restrict__ x, const u16* __restrict__ w, int dim, float eps)
{
	PDL_ENTRY();
	const int row = blockIdx.x;
	const u32* xr = reinterpret_cast<const u32*>(x + (size_t)row * dim);
	const u32* wr = reinterpret_cast<const u32*>(w);
	u32* yr = reinterpret_cast<u32*>(out + (size_t)row * dim);
	const int pairs = dim >> 1;

	float ss = 0.f;
	for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
		u32 v = xr[i];
		float a = bf16_to_f32(v), b = bf16_to_f32(v >> 16);
		ss = fmaf(a, a, ss);
		ss = fmaf(b, b, ss);
	}
	__shared__ float red[32];
	ss = warp_sum(ss);
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	if (lane == 0) red[wid] = ss;
	__syncthreads();
	if (wid == 0) {
		float t = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.f;
		t = warp_sum(t);
		if (lane == 0) red[0] = t;
	}
	__syncthreads();
	// IEEE sqrt and division (no rsqrtf approximation).
	const float r = 1.0f / sqrtf(red[0] / (float)dim + eps);
	for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
		u32 v = xr[i], g = wr[i];
		float a = bf16_to_f32(g) * (bf16_to_f32(v) * r);
		float b = bf16_to_f32(g >> 16) * (bf16_to_f32(v >> 16) * r);
		yr[i] = pack_bf16x2(a, b);
	}
}
