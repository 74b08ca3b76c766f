// Element-wise and per-row ops of the GPU backend on fp32 activations
// (backend/gpu). `rnd` = 1 rounds results to bf16 like the faithful CPU
// reference (backend/cpu); 0 keeps fp32 (exact mode).
#include "common.cuh"

DEV float rbf(float x, int rnd) { return rnd ? bf16_to_f32(f32_to_bf16(x)) : x; }

DEV float block_sum(float v, float* red) {
	v = warp_sum(v);
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads();
	if (lane == 0) red[w] = v;
	__syncthreads();
	float t = lane < nw ? red[lane] : 0.0f;
	return warp_sum(t);
}

// One block per segment of d values: y = w * (x * rsqrt(mean(x^2) + eps)).
// Latency-bound at decode (one block per row), so every thread issues all of
// its loads before using any: float4 loads when d % 4 == 0 and the pointers
// are 16-byte aligned (x and w of the first RMS_CACHE*1024 values stay in
// registers for the second pass), else a 4-way unrolled scalar loop. The sum
// of squares is per thread in a fixed order, then block_sum: deterministic.
#define RMS_CACHE 4

// The float4 path for the segment xs -> ys. Q (d % 128 == 0): also the FP8
// quantisation of the outputs (quant128) into codes q [d] and scales qs
// [d/128]: a warp's 32 float4s of one step are one 128-value block.
template <bool Q>
DEV void rmsnorm_f4(float* __restrict__ ys, const float* __restrict__ xs, const float* __restrict__ w, int d, float eps,
	int rnd, float* red, u8* __restrict__ q, u8* __restrict__ qs)
{
	const int nt = blockDim.x;
	float ss = 0.0f;
	const int n4 = d >> 2;
	const float4* x4 = reinterpret_cast<const float4*>(xs);
	const float4* w4 = reinterpret_cast<const float4*>(w);
	float4* y4 = reinterpret_cast<float4*>(ys);
	float4 xv[RMS_CACHE], wv[RMS_CACHE];
#pragma unroll
	for (int k = 0; k < RMS_CACHE; k++) {
		const int i = threadIdx.x + k * nt;
		if (i < n4) { xv[k] = x4[i]; wv[k] = w4[i]; }
	}
#pragma unroll
	for (int k = 0; k < RMS_CACHE; k++) {
		if (threadIdx.x + k * nt < n4) {
			ss += xv[k].x * xv[k].x; ss += xv[k].y * xv[k].y;
			ss += xv[k].z * xv[k].z; ss += xv[k].w * xv[k].w;
		}
	}
	for (int i = threadIdx.x + RMS_CACHE * nt; i < n4; i += nt) {
		const float4 v = x4[i];
		ss += v.x * v.x; ss += v.y * v.y; ss += v.z * v.z; ss += v.w * v.w;
	}
	ss = block_sum(ss, red);
	const float r = (float)(1.0 / sqrt((double)(ss / (float)d + eps)));
	auto put = [&](int i, float4 o) {
		y4[i] = o;
		if (Q) {
			const float v[4] = {o.x, o.y, o.z, o.w};
			quant128(v, threadIdx.x & 31, q + (i >> 5) * 128, qs + (i >> 5));
		}
	};
#pragma unroll
	for (int k = 0; k < RMS_CACHE; k++) {
		const int i = threadIdx.x + k * nt;
		if (i < n4) {
			float4 o;
			o.x = rbf(wv[k].x * (xv[k].x * r), rnd); o.y = rbf(wv[k].y * (xv[k].y * r), rnd);
			o.z = rbf(wv[k].z * (xv[k].z * r), rnd); o.w = rbf(wv[k].w * (xv[k].w * r), rnd);
			put(i, o);
		}
	}
	for (int i = threadIdx.x + RMS_CACHE * nt; i < n4; i += nt) {
		const float4 v = x4[i], wq = w4[i];
		float4 o;
		o.x = rbf(wq.x * (v.x * r), rnd); o.y = rbf(wq.y * (v.y * r), rnd);
		o.z = rbf(wq.z * (v.z * r), rnd); o.w = rbf(wq.w * (v.w * r), rnd);
		put(i, o);
	}
}

extern "C" __global__ void __launch_bounds__(256) rmsnorm_f32(
	float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ w, int d, float eps, int rnd)
{
	PDL_ENTRY();
	__shared__ float red[32];
	const float* xs = x + (size_t)blockIdx.x * d;
	float* ys = y + (size_t)blockIdx.x * d;
	const int nt = blockDim.x;
	if ((d & 3) == 0 && (((size_t)x | (size_t)y | (size_t)w) & 15) == 0) {
		rmsnorm_f4<false>(ys, xs, w, d, eps, rnd, red, nullptr, nullptr);
		return;
	}
	float ss = 0.0f;
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

// rmsnorm_f32 of rows of d values that also writes the FP8 input of the
// linear that takes them (quant_fp8_f32's codes q [rows, d] and e8m0 scales
// qs [rows, d/128], bit for bit), saving that linear's quantisation launch.
// d % 128 == 0, x, y and w 16-byte aligned (the float4 path).
extern "C" __global__ void __launch_bounds__(256) rmsnorm_quant_f32(
	float* __restrict__ y, u8* __restrict__ q, u8* __restrict__ qs, const float* __restrict__ x,
	const float* __restrict__ w, int d, float eps, int rnd)
{
	PDL_ENTRY();
	__shared__ float red[32];
	const size_t row = blockIdx.x;
	rmsnorm_f4<true>(y + row * d, x + row * d, w, d, eps, rnd, red, q + row * d, qs + row * (d >> 7));
}

// Embedding gather: out[r, s*d + i] = table[ids[r], i] for every stream s.
extern "C" __global__ void embed_f32(
	float* __restrict__ out, const void* __restrict__ table, int bf16, const int* __restrict__ ids, int d, int streams)
{
	PDL_ENTRY();
	const int r = blockIdx.x;
	const size_t id = (size_t)ids[r];
	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		float v = bf16 ? bf16_to_f32(((const u16*)table)[id * d + i]) : ((const float*)table)[id * d + i];
		for (int s = 0; s < streams; s++) out[((size_t)r * streams + s) * d + i] = v;
	}
}

// x[r, j] = rnd(x[r, j] + e[r, j % d]) over n = rows*cols elements.
extern "C" __global__ void add_streams_f32(float* __restrict__ x, const float* __restrict__ e, int cols, int d, long long n, int rnd)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		long long r = i / cols;
		int j = (int)(i - r * cols);
		x[i] = rbf(x[i] + e[r * d + j % d], rnd);
	}
}

extern "C" __global__ void scale_f32(float* __restrict__ x, float s, long long n, int rnd)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		x[i] = rbf(x[i] * s, rnd);
}

extern "C" __global__ void add_f32(float* __restrict__ out, const float* __restrict__ a, const float* __restrict__ b, long long n, int rnd)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		out[i] = rbf(a[i] + b[i], rnd);
}

// Clamped SwiGLU (spec §6.2) exactly as the CPU: w * (g * sigmoid(g) * u).
// limit <= 0 disables the clamp.
DEV float swiglu1(float gv, float uv, float limit, int rnd)
{
	if (limit > 0.0f) {
		uv = fminf(fmaxf(uv, -limit), limit);
		gv = fminf(gv, limit);
	}
	float sig = (float)(1.0 / (1.0 + exp(-(double)gv)));
	return rbf(gv * sig * uv, rnd);
}

extern "C" __global__ void swiglu_f32(float* __restrict__ out, const float* __restrict__ g, const float* __restrict__ u, long long n, float limit, int rnd)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		out[i] = swiglu1(g[i], u[i], limit, rnd);
}

// swiglu_f32 on [rows, inter] that also writes the FP8 input of the linear
// that takes h (quant_fp8_f32's codes q [rows, inter] and e8m0 scales qs
// [rows, inter/128], bit for bit): one warp per (row, 128-value block), four
// values a lane. inter % 128 == 0, pointers 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256) swiglu_quant_f32(
	float* __restrict__ h, u8* __restrict__ q, u8* __restrict__ qs, const float* __restrict__ g,
	const float* __restrict__ u, int rows, int inter, float limit, int rnd)
{
	PDL_ENTRY();
	const long long blk = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
	if (blk >= (long long)rows * (inter >> 7)) return;
	const int lane = threadIdx.x & 31;
	const size_t o = (size_t)blk * 128 + 4 * lane; // rows are contiguous
	const float4 a = *reinterpret_cast<const float4*>(g + o), c = *reinterpret_cast<const float4*>(u + o);
	const float v[4] = {swiglu1(a.x, c.x, limit, rnd), swiglu1(a.y, c.y, limit, rnd), swiglu1(a.z, c.z, limit, rnd),
		swiglu1(a.w, c.w, limit, rnd)};
	*reinterpret_cast<float4*>(h + o) = make_float4(v[0], v[1], v[2], v[3]);
	quant128(v, lane, q + (size_t)blk * 128, qs + blk);
}

// bf16 bits -> fp32 (outputs of the tensor-core linears).
extern "C" __global__ void bf16_to_f32_k(float* __restrict__ out, const u16* __restrict__ in, long long n)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		out[i] = bf16_to_f32(in[i]);
}

// Per-block FP8 activation quantisation of fp32 x (spec §3.3), one warp per
// block of `blk` values (blk % 32 == 0): scale 2^ceil(log2(max(amax,1e-4)/448)),
// e4m3 round-to-nearest-even. Writes codes q + e8m0 scales (q may be null) and,
// if sim != null, the simulated values q*s as fp32.
extern "C" __global__ void quant_fp8_f32(
	u8* __restrict__ q, u8* __restrict__ scales, float* __restrict__ sim, const float* __restrict__ x,
	int rows, int cols, int width, int blk)
{
	PDL_ENTRY();
	const int lane = threadIdx.x & 31;
	const int nb = (width + blk - 1) / blk;
	const long long gw = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
	if (gw >= (long long)rows * nb) return;
	const int r = (int)(gw / nb), b = (int)(gw % nb);
	const int bl = min(blk, width - b * blk); // the last block may be partial
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

// Interleaved RoPE on the last rd dims of every head (spec §5.2): one thread
// per (row, head, pair). Faithful: fp32 angle fp32(pos)*f32[p], cos/sin in
// double rounded to fp32, products and sums in fp32, bf16 out (as backend/cpu).
// Exact: double throughout.
extern "C" __global__ void rope_f32(
	float* __restrict__ x, const int* __restrict__ pos, const float* __restrict__ f32, const double* __restrict__ f64,
	int rows, int heads, int headDim, int rd, int inverse, int faithful)
{
	PDL_ENTRY();
	const int pairs = rd / 2;
	const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (i >= (long long)rows * heads * pairs) return;
	const int p = (int)(i % pairs);
	const int h = (int)((i / pairs) % heads);
	const int r = (int)(i / ((long long)pairs * heads));
	float* v = x + (size_t)r * heads * headDim + (size_t)h * headDim + headDim - rd + 2 * p;
	const int t = pos[r];
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

// hc post (spec §4.2): out[k*d+i] = rnd(post[k]*o[i] + sum_j comb[j][k]*x[j*d+i]).
// mix row = post[n] | comb[n*n]. out may alias x (each thread reads its n
// inputs before writing its n outputs).
extern "C" __global__ void hc_post_f32(
	float* out, const float* x, const float* __restrict__ o, const float* __restrict__ mix, int n, int d, int rnd)
{
	PDL_ENTRY();
	const int r = blockIdx.y;
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= d) return;
	const float* m = mix + (size_t)r * (n + n * n);
	float res[8];
	for (int j = 0; j < n; j++) res[j] = x[(size_t)r * n * d + (size_t)j * d + i];
	const float ov = o[(size_t)r * d + i];
	for (int k = 0; k < n; k++) {
		float s = 0.0f;
		for (int j = 0; j < n; j++) s += m[n + j * n + k] * res[j];
		out[(size_t)r * n * d + (size_t)k * d + i] = rbf(m[k] * ov + s, rnd);
	}
}
