// The row body of rmsnorm_f32's float4 path, shared with the kernels that
// fuse it (hc_pre_fin_norm_f32): one thread->value mapping, one sum order,
// one set of products, so a fused result is the separate kernel's bit for bit.
#pragma once
#include "common.cuh"

#define RMS_CACHE 4

// Barrier of the nt threads that run a row: the whole block (BAR 0), or
// named barrier BAR when other warps of the block do something else.
template <int BAR>
DEV void rms_sync(int nt) {
	if (BAR == 0) __syncthreads();
	else asm volatile("bar.sync %0, %1;" ::"n"(BAR), "r"(nt) : "memory");
}

// Sum of v over the nt threads (threadIdx.x < nt), on every one of them.
template <int BAR>
DEV float rms_block_sum(float v, float* red, int nt) {
	v = warp_sum(v);
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = nt >> 5;
	rms_sync<BAR>(nt);
	if (lane == 0) red[w] = v;
	rms_sync<BAR>(nt);
	float t = lane < nw ? red[lane] : 0.0f;
	return warp_sum(t);
}

DEV float rms_rnd(float x, int rnd) { return rnd ? bf16_to_f32(f32_to_bf16(x)) : x; }

// rms_row4_put after its first loads: xv[k] and wv[k] hold xat(i) and w4[i]
// for i = tid + k·nt < n4 (rms_row4_put, or a caller that issued them early).
template <int BAR, class P, class X>
DEV void rms_row4_rest(P put, X xat, const float4* __restrict__ w4, const float4 (&xv)[RMS_CACHE],
	const float4 (&wv)[RMS_CACHE], int n4, int d, float eps, int rnd, float* red, int tid, int nt)
{
	float ss = 0.0f;
#pragma unroll
	for (int k = 0; k < RMS_CACHE; k++) {
		if (tid + k * nt < n4) {
			ss += xv[k].x * xv[k].x; ss += xv[k].y * xv[k].y;
			ss += xv[k].z * xv[k].z; ss += xv[k].w * xv[k].w;
		}
	}
	for (int i = tid + RMS_CACHE * nt; i < n4; i += nt) {
		const float4 v = xat(i);
		ss += v.x * v.x; ss += v.y * v.y; ss += v.z * v.z; ss += v.w * v.w;
	}
	ss = rms_block_sum<BAR>(ss, red, nt);
	const float r = (float)(1.0 / sqrt((double)(ss / (float)d + eps)));
#pragma unroll
	for (int k = 0; k < RMS_CACHE; k++) {
		const int i = tid + k * nt;
		if (i < n4) {
			float4 o;
			o.x = rms_rnd(wv[k].x * (xv[k].x * r), rnd); o.y = rms_rnd(wv[k].y * (xv[k].y * r), rnd);
			o.z = rms_rnd(wv[k].z * (xv[k].z * r), rnd); o.w = rms_rnd(wv[k].w * (xv[k].w * r), rnd);
			put(i, o);
		}
	}
	for (int i = tid + RMS_CACHE * nt; i < n4; i += nt) {
		const float4 v = xat(i), wq = w4[i];
		float4 o;
		o.x = rms_rnd(wq.x * (v.x * r), rnd); o.y = rms_rnd(wq.y * (v.y * r), rnd);
		o.z = rms_rnd(wq.z * (v.z * r), rnd); o.w = rms_rnd(wq.w * (v.w * r), rnd);
		put(i, o);
	}
}

// put(i, rnd(w4[i] * (x[i] * r))), r = 1/sqrt(mean(x^2) + eps), over one row
// of n4 float4s (d = 4·n4 values), thread tid of nt. xat(i) is the row's
// i-th float4: every thread issues its first RMS_CACHE of them (and of w4)
// before using any, keeps them for the second pass and calls xat again for
// the rest. The threads of a warp put at the same steps (i = tid + k·nt),
// so put may use warp collectives when n4 % 32 == 0.
template <int BAR, class P, class X>
DEV void rms_row4_put(P put, X xat, const float4* __restrict__ w4, int n4, int d, float eps, int rnd, float* red,
	int tid, int nt)
{
	float4 xv[RMS_CACHE], wv[RMS_CACHE];
#pragma unroll
	for (int k = 0; k < RMS_CACHE; k++) {
		const int i = tid + k * nt;
		if (i < n4) { xv[k] = xat(i); wv[k] = w4[i]; }
	}
	rms_row4_rest<BAR>(put, xat, w4, xv, wv, n4, d, eps, rnd, red, tid, nt);
}

// rms_row4_put storing into y4.
template <int BAR, class X>
DEV void rms_row4(float4* __restrict__ y4, X xat, const float4* __restrict__ w4, int n4, int d, float eps, int rnd,
	float* red, int tid, int nt)
{
	rms_row4_put<BAR>([&](int i, float4 o) { y4[i] = o; }, xat, w4, n4, d, eps, rnd, red, tid, nt);
}
