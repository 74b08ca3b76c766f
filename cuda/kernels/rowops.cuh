// Per-row device code of the norm, RoPE and FP8-simulation kernels, shared by
// the separate kernels (rmsnorm_f32, head_norm_f32, rope_f32, quant_fp8_f32)
// and their fused forms (ops_f32.cu), so that both compile to the same
// floating-point instructions and give the same bits. `rnd` = 1 rounds to
// bf16 like the faithful CPU reference; 0 keeps fp32 (exact mode).
#pragma once
#include "common.cuh"
#include "rms_row.cuh"

DEV float rbf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

DEV double warp_sum_d(double v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

DEV float block_sum(float v, float* red) { return rms_block_sum<0>(v, red, blockDim.x); }

// RMSNorm of segment seg of d values by the whole block:
// y = w * (x * rsqrt(mean(x^2) + eps)). Latency-bound at decode (one block
// per row), so every thread issues all of its loads before using any: float4
// loads when d % 4 == 0 and the pointers are 16-byte aligned (rms_row4 of
// rms_row.cuh, shared with hc_pre_fin_norm_f32: x and w of the first
// RMS_CACHE*1024 values stay in registers for the second pass), else a
// 4-way unrolled scalar loop. The sum of squares is per thread in a fixed
// order, then block_sum: deterministic. Each thread writes the outputs it
// computed; others see them only after a __syncthreads.
DEV void rmsnorm_seg(float* y, const float* x, const float* w, unsigned seg, int d, float eps, int rnd, float* red)
{
	const float* xs = x + (size_t)seg * d;
	float* ys = y + (size_t)seg * d;
	const int nt = blockDim.x;
	float ss = 0.0f;
	if ((d & 3) == 0 && (((size_t)x | (size_t)y | (size_t)w) & 15) == 0) {
		const float4* x4 = reinterpret_cast<const float4*>(xs);
		rms_row4<0>(reinterpret_cast<float4*>(ys), [&](int i) { return x4[i]; }, reinterpret_cast<const float4*>(w),
			d >> 2, d, eps, rnd, red, threadIdx.x, nt);
		return;
	}
	for (int i0 = threadIdx.x; i0 < d; i0 += 4 * nt) {
		float v[4];
#pragma unroll
		for (int k = 0; k < 4; k++) v[k] = i0 + k * nt < d ? xs[i0 + k * nt] : 0.0f;
#pragma unroll
		for (int k = 0; k < 4; k++) ss += v[k] * v[k];
	}
	ss = block_sum(ss, red);
	const float r = (float)(1.0 / sqrt((double)(ss / (float)d + eps)));
	for (int i0 = threadIdx.x; i0 < d; i0 += 4 * nt) {
		float v[4], wq[4];
#pragma unroll
		for (int k = 0; k < 4; k++) {
			const int i = i0 + k * nt;
			if (i < d) { v[k] = xs[i]; wq[k] = w[i]; }
		}
#pragma unroll
		for (int k = 0; k < 4; k++) {
			const int i = i0 + k * nt;
			if (i < d) ys[i] = rbf(wq[k] * (v[k] * r), rnd);
		}
	}
}

// Weightless RMS norm of the hd values at q in place, by one warp (t: the
// warp's HN_CHUNK floats of shared memory). Faithful: acc += bf16(v*v)
// strictly in index order, then mean, mean+eps, rsqrt and the products each
// rounded to bf16. Exact: float64 sum (per-lane strided partials + warp
// reduction), fp32 products. The segment is read in chunks of HN_CHUNK:
// every lane loads its values at once (kept in registers when hd <=
// HN_CHUNK), the warp writes the rounded squares to shared memory and lane 0
// runs the add chain over them with vector loads, so the chain is only
// dependent fp32 adds (the old per-value shuffles made it shuffle-latency
// bound). Bit-identical to the serial sum. Other lanes see the outputs only
// after a __syncwarp.
#define HN_CHUNK 512
DEV void head_norm_seg(float* q, int hd, float eps, int rnd, float* t, int lane)
{
	const float4* t4 = reinterpret_cast<const float4*>(t);
	float v[HN_CHUNK / 32];
	float facc = 0.0f;
	double dacc = 0.0;
	for (int c = 0; c < hd; c += HN_CHUNK) {
#pragma unroll
		for (int k = 0; k < HN_CHUNK / 32; k++) {
			const int i = c + lane + 32 * k;
			v[k] = i < hd ? q[i] : 0.0f;
		}
		if (rnd) {
#pragma unroll
			for (int k = 0; k < HN_CHUNK / 32; k++)
				if (c + lane + 32 * k < hd) t[lane + 32 * k] = rbf16(__fmul_rn(v[k], v[k]));
			__syncwarp();
			if (lane == 0) {
				const int n = min(HN_CHUNK, hd - c);
				int i = 0;
				for (; i + 32 <= n; i += 32) { // 8 loads issued before the 32 adds
					float4 s[8];
#pragma unroll
					for (int k = 0; k < 8; k++) s[k] = t4[(i >> 2) + k];
#pragma unroll
					for (int k = 0; k < 8; k++) {
						facc = __fadd_rn(facc, s[k].x);
						facc = __fadd_rn(facc, s[k].y);
						facc = __fadd_rn(facc, s[k].z);
						facc = __fadd_rn(facc, s[k].w);
					}
				}
				for (; i < n; i++) facc = __fadd_rn(facc, t[i]);
			}
			__syncwarp(); // t is rewritten by the next chunk
		} else {
#pragma unroll
			for (int k = 0; k < HN_CHUNK / 32; k++)
				if (c + lane + 32 * k < hd) dacc += (double)v[k] * (double)v[k];
		}
	}
	float rs;
	if (rnd) {
		const float acc = __shfl_sync(0xffffffffu, facc, 0);
		const float mean = rbf16(__fdiv_rn(acc, (float)hd));
		const float ms = rbf16(__fadd_rn(mean, eps));
		rs = rbf16((float)(1.0 / sqrt((double)ms)));
	} else {
		const double acc = warp_sum_d(dacc);
		rs = (float)(1.0 / sqrt(acc / (double)hd + (double)eps));
	}
	if (hd <= HN_CHUNK) {
#pragma unroll
		for (int k = 0; k < HN_CHUNK / 32; k++) {
			const int i = lane + 32 * k;
			if (i < hd) {
				const float o = __fmul_rn(v[k], rs);
				q[i] = rnd ? rbf16(o) : o;
			}
		}
	} else {
		for (int i = lane; i < hd; i += 32) {
			const float o = __fmul_rn(q[i], rs);
			q[i] = rnd ? rbf16(o) : o;
		}
	}
}

// Interleaved RoPE of the pair v[0], v[1] (pair p of a head's rope dims) at
// position t (spec §5.2). Faithful: fp32 angle fp32(t)*f32[p], cos/sin in
// double rounded to fp32, products and sums in fp32, bf16 out (as
// backend/cpu). Exact: double throughout.
DEV void rope_pair(float* v, int t, const float* f32, const double* f64, int p, int inverse, int faithful)
{
	if (faithful) {
		float a = (float)t * f32[p];
		float c = (float)cos((double)a), s = (float)sin((double)a);
		if (inverse) s = -s;
		float x0 = v[0], x1 = v[1];
		float p00 = x0 * c, p11 = x1 * s, p01 = x0 * s, p10 = x1 * c;
		v[0] = bf16_to_f32(f32_to_bf16(p00 - p11));
		v[1] = bf16_to_f32(f32_to_bf16(p01 + p10));
	} else {
		double a = (double)t * f64[p];
		double c = cos(a), s = sin(a);
		if (inverse) s = -s;
		double x0 = v[0], x1 = v[1];
		v[0] = (float)(x0 * c - x1 * s);
		v[1] = (float)(x0 * s + x1 * c);
	}
}

// Per-block FP8 quantisation (spec §3.3) of block b of row r by one warp:
// the block's bl values at x + r*cols + b*blk, scale
// 2^ceil(log2(max(amax,1e-4)/448)), e4m3 round-to-nearest-even. Writes codes
// q + e8m0 scales (each may be null) and, if sim != null, the simulated
// values q*s as fp32 (sim may be x: each lane reads its values before it
// writes them).
DEV void fp8_block(u8* q, u8* scales, float* sim, const float* x, int r, int b, int bl, int cols, int width, int blk,
	int nb, int lane)
{
	const float* xs = x + (size_t)r * cols + (size_t)b * blk;
	float amax = 0.0f;
	for (int i = lane; i < bl; i += 32) {
		float a = fabsf(xs[i]);
		if (a > amax || a != a) amax = a;
	}
	amax = warp_amax(amax);
	// A NaN or Inf in the block makes every value NaN, as on the CPU (there the
	// scale becomes 2^128 = Inf and q*s = 0*Inf or Inf/Inf).
	if (!(amax <= 3.0e38f)) {
		for (int i = lane; i < bl; i += 32) {
			if (q) q[(size_t)r * width + (size_t)b * blk + i] = 0x7f;
			if (sim) sim[(size_t)r * cols + (size_t)b * blk + i] = __uint_as_float(0x7fc00000u);
		}
		if (lane == 0 && scales) scales[(size_t)r * nb + b] = 255;
		return;
	}
	const int e = fp8_scale_exp(amax);
	const float s = __uint_as_float((u32)(e + 127) << 23);
	for (int i = lane; i < bl; i += 32) {
		float v = fminf(fmaxf(xs[i] / s, -448.0f), 448.0f);
		u32 c = f32_to_e4m3(v);
		if (q) q[(size_t)r * width + (size_t)b * blk + i] = (u8)c;
		if (sim) sim[(size_t)r * cols + (size_t)b * blk + i] = e4m3_to_f32(c) * s;
	}
	if (lane == 0 && scales) scales[(size_t)r * nb + b] = (u8)(e + 127);
}
