// FP8 activation quantisation per 128 columns (spec §3.3, act_quant, block 128):
// amax = max|x| clamped to >= 1e-4; s = 2^ceil(log2(amax * (1/448))) by exponent
// bit arithmetic; q = e4m3(clamp(x / s, -448, 448)) round-to-nearest-even.
// Outputs: q [rows, cols] e4m3 codes, scales [rows, cols/128] e8m0 (exponent + 127).
// One warp per 128-block, 4 elements per lane.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) quant_fp8_act(
	u8* __restrict__ q, u8* __restrict__ scales, const u16* __restrict__ x, int rows, int cols)
{
	PDL_ENTRY();
	const int blocksPerRow = cols >> 7;
	const long long blk = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (blk >= (long long)rows * blocksPerRow) return;
	const int lane = threadIdx.x & 31;
	const size_t base = (size_t)blk * 128 + lane * 4; // rows are contiguous, cols % 128 == 0
	const uint2 raw = *reinterpret_cast<const uint2*>(x + base);
	float v[4] = {bf16_to_f32(raw.x), bf16_to_f32(raw.x >> 16), bf16_to_f32(raw.y), bf16_to_f32(raw.y >> 16)};
	float amax = 0.f;
#pragma unroll
	for (int i = 0; i < 4; i++) amax = fmaxf(amax, fabsf(v[i]));
	amax = fmaxf(warp_max(amax), 1e-4f);
	const float t = amax * (1.0f / 448.0f);
	const u32 tb = __float_as_uint(t);
	int e = (int)((tb >> 23) & 0xffu) - 127 + ((tb & 0x7fffffu) != 0u ? 1 : 0);
	e = min(e, 127); // inf input: keep the scale finite (e8m0 254)
	const float s = __uint_as_float((u32)(e + 127) << 23);
	u32 packed = 0;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		float y = __fdiv_rn(v[i], s);
		y = fminf(fmaxf(y, -448.0f), 448.0f);
		packed |= f32_to_e4m3(y) << (8 * i);
	}
	*reinterpret_cast<u32*>(q + base) = packed;
	if (lane == 0) scales[blk] = (u8)(e + 127);
}
