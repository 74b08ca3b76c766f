// hc post (spec §4.2) of one element, shared by hc_post_f32_n* and the
// kernels that run it in their epilogue (moe_combine_post_n*), so both give
// the same bits.
#pragma once
#include "common.cuh"

// out[k*d+i] = rbf(post[k]*ov + sum_j comb[j][k]*x[j*d+i]) for k < N, with
// out and x a row's N streams and m its mix row (post[N] | comb[N*N]): its
// N inputs and the N+N·N mix values are loaded at once into registers.
// out may alias x (the inputs are read before any output is written).
template <int N>
DEV void hc_post_at(float* out, const float* x, float ov, const float* __restrict__ m, int d, int i, int rnd)
{
	float res[N], mm[N + N * N];
#pragma unroll
	for (int j = 0; j < N; j++) res[j] = x[(size_t)j * d + i];
#pragma unroll
	for (int q = 0; q < N + N * N; q++) mm[q] = m[q];
#pragma unroll
	for (int k = 0; k < N; k++) {
		float s = 0.0f;
#pragma unroll
		for (int j = 0; j < N; j++) s += mm[N + j * N + k] * res[j];
		out[(size_t)k * d + i] = rbf(mm[k] * ov + s, rnd);
	}
}
