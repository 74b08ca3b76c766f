// Shared by the decode-shaped MoE kernels (moe_fp4_dec, moe_fp4_decf16).
#pragma once
#include "common.cuh"

// Split K in the kernel: the last of the tile's gridDim.z CTAs to count
// itself in adds the partials of rows [mBeg, mEnd) x 64 columns as
// linear_fp8_reduce does (sum_splits: the same bits) and zeroes the counter
// for the next launch or graph replay. Saves the reduce launch.
DEV void dec_fixup(u8* ring, u16* __restrict__ y, const float* part, int* counter, int mBeg, int mEnd, int col0, int N, int Mtot)
{
	// The ring is idle after splitk_last's barrier: it holds the flag.
	if (!splitk_last(counter, gridDim.z, reinterpret_cast<volatile int*>(ring))) return;
	const int cols = min(64, N - col0);
	const size_t plane = (size_t)Mtot * N;
	for (int i = threadIdx.x; i < (mEnd - mBeg) * cols; i += blockDim.x) {
		const size_t o = (size_t)(mBeg + i / cols) * N + col0 + i % cols;
		y[o] = (u16)f32_to_bf16(sum_splits(part + o, plane, gridDim.z));
	}
}
