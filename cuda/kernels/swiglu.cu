// Clamped SwiGLU (spec §6.2): g = min(gate, L); u = clamp(up, -L, L);
// h = silu(g) * u * w_row (fp32), out = bf16(h). gate/up rows have stride ld
// elements (so a fused [rows, 2*inter] w1|w3 output works); out is [rows, inter].
// weights may be null (routing weight 1, shared expert).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) swiglu_bf16(
	u16* __restrict__ out, const u16* __restrict__ gate, const u16* __restrict__ up, int ld,
	const float* __restrict__ weights, int rows, int inter, float limit)
{
	PDL_ENTRY();
	const int row = blockIdx.x;
	const int i = blockIdx.y * blockDim.x + threadIdx.x; // pair index
	if (row >= rows || 2 * i >= inter) return;
	const u32 gv = *reinterpret_cast<const u32*>(gate + (size_t)row * ld + 2 * i);
	const u32 uv = *reinterpret_cast<const u32*>(up + (size_t)row * ld + 2 * i);
	const float w = weights ? weights[row] : 1.0f;
	float h[2];
#pragma unroll
	for (int j = 0; j < 2; j++) {
		float g = fminf(bf16_to_f32(gv >> (16 * j)), limit);
		float u = fminf(fmaxf(bf16_to_f32(uv >> (16 * j)), -limit), limit);
		float silu = g / (1.0f + expf(-g));
		h[j] = silu * u * w;
	}
	*reinterpret_cast<u32*>(out + (size_t)row * inter + 2 * i) = pack_bf16x2(h[0], h[1]);
}
