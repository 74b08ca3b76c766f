// Hyper-connection collapse (hc pre / hc head), per-head norm and the
// Hadamard + FP4 simulation of the GPU backend, on fp32 activations. Every
// scalar step mirrors backend/cpu (ops.go, linear.go) with explicit _rn
// intrinsics so NVRTC's default FMA contraction cannot change a rounding.
#include "common.cuh"

DEV float rbf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

DEV float sigmoid_d(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

DEV double warp_sum_d(double v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

// Go's max(a, b) for the Sinkhorn row max: NaN propagates.
DEV float gomax(float a, float b) { return (b > a || b != b || a != a) ? (a != a ? a : b) : a; }

// Sinkhorn of backend/cpu sinkhorn: c is n×n row-major (one thread).
template <int N>
DEV void sinkhorn(float* c, int iters, float eps) {
	for (int j = 0; j < N; j++) {
		float* row = c + j * N;
		float mx = row[0];
		for (int k = 1; k < N; k++) mx = gomax(mx, row[k]);
		float s = 0.0f;
		for (int k = 0; k < N; k++) {
			row[k] = (float)exp((double)__fsub_rn(row[k], mx));
			s = __fadd_rn(s, row[k]);
		}
		for (int k = 0; k < N; k++) row[k] = __fadd_rn(__fdiv_rn(row[k], s), eps);
	}
	for (int it = 0; it < iters; it++) {
		if (it > 0) {
			for (int j = 0; j < N; j++) {
				float s = 0.0f;
				for (int k = 0; k < N; k++) s = __fadd_rn(s, c[j * N + k]);
				s = __fadd_rn(s, eps);
				for (int k = 0; k < N; k++) c[j * N + k] = __fdiv_rn(c[j * N + k], s);
			}
		}
		for (int k = 0; k < N; k++) {
			float s = 0.0f;
			for (int j = 0; j < N; j++) s = __fadd_rn(s, c[j * N + k]);
			s = __fadd_rn(s, eps);
			for (int j = 0; j < N; j++) c[j * N + k] = __fdiv_rn(c[j * N + k], s);
		}
	}
}

#define HC_THREADS 256

// One block per row of x [rows, N*d]: the mix projections fn [MIX, N*d]·x and
// the sum of squares in one pass, block-reduced, then the scalar mHC recipe
// on thread 0, then out[i] = rnd(Σ_j pre_j·x[j*d+i]). PRE: hc pre (MIX =
// (2+N)*N, 3 scales, Sinkhorn, mix row = post | comb); else hc head (MIX = N).
// Sinkhorn with iters = 0 still runs the first row softmax and column pass,
// like the CPU (its loop runs col() once before iters-1 more rounds).
template <int N, bool PRE>
DEV void hc_body(float* __restrict__ out, float* __restrict__ mixo, const float* __restrict__ x,
	const float* __restrict__ fn, const float* __restrict__ base, int d, float s0, float s1, float s2,
	int iters, float eps, float normEps, int rnd)
{
	constexpr int MIX = PRE ? (2 + N) * N : N;
	constexpr int NW = HC_THREADS / 32;
	__shared__ float red[NW][MIX];
	__shared__ double redss[NW];
	__shared__ float m[MIX];
	__shared__ float pre[N];
	const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	const int width = N * d;
	const float* xr = x + (size_t)r * width;
	float acc[MIX];
#pragma unroll
	for (int i = 0; i < MIX; i++) acc[i] = 0.0f;
	double ss = 0.0;
	for (int c = tid; c < width; c += HC_THREADS) {
		const float v = xr[c];
		ss += (double)v * (double)v;
#pragma unroll
		for (int i = 0; i < MIX; i++) acc[i] += fn[(size_t)i * width + c] * v;
	}
#pragma unroll
	for (int i = 0; i < MIX; i++) {
		float t = warp_sum(acc[i]);
		if (lane == 0) red[w][i] = t;
	}
	ss = warp_sum_d(ss);
	if (lane == 0) redss[w] = ss;
	__syncthreads();
	if (tid < MIX) {
		float t = 0.0f;
		for (int k = 0; k < NW; k++) t += red[k][tid];
		m[tid] = t;
	}
	__syncthreads();
	if (tid == 0) {
		double tot = 0.0;
		for (int k = 0; k < NW; k++) tot += redss[k];
		const float ms = __fadd_rn((float)(tot / (double)width), normEps);
		const float rr = (float)(1.0 / sqrt((double)ms));
		for (int i = 0; i < MIX; i++) m[i] = __fmul_rn(m[i], rr);
		for (int j = 0; j < N; j++) pre[j] = __fadd_rn(sigmoid_d(__fadd_rn(__fmul_rn(m[j], s0), base[j])), eps);
		if (PRE) {
			float* mr = mixo + (size_t)r * (N + N * N);
			float c[N * N];
			for (int j = 0; j < N; j++) mr[j] = 2.0f * sigmoid_d(__fadd_rn(__fmul_rn(m[N + j], s1), base[N + j]));
			for (int i = 0; i < N * N; i++) c[i] = __fadd_rn(__fmul_rn(m[2 * N + i], s2), base[2 * N + i]);
			sinkhorn<N>(c, max(iters, 1), eps);
			for (int i = 0; i < N * N; i++) mr[N + i] = c[i];
		}
	}
	__syncthreads();
	float p[N];
#pragma unroll
	for (int j = 0; j < N; j++) p[j] = pre[j];
	for (int i = tid; i < d; i += HC_THREADS) {
		float s = 0.0f;
#pragma unroll
		for (int j = 0; j < N; j++) s = __fadd_rn(s, __fmul_rn(p[j], xr[(size_t)j * d + i]));
		out[(size_t)r * d + i] = rnd ? rbf16(s) : s;
	}
}

#define HC_KERNELS(N)                                                                                          \
	extern "C" __global__ void __launch_bounds__(HC_THREADS) hc_pre_f32_n##N(                                \
		float* out, float* mix, const float* x, const float* fn, const float* base, int d, float s0, float s1, \
		float s2, int iters, float eps, float normEps, int rnd)                                                \
	{                                                                                                          \
		hc_body<N, true>(out, mix, x, fn, base, d, s0, s1, s2, iters, eps, normEps, rnd);                      \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(HC_THREADS) hc_head_f32_n##N(                               \
		float* out, const float* x, const float* fn, const float* base, int d, float s0, float eps,            \
		float normEps, int rnd)                                                                                \
	{                                                                                                          \
		hc_body<N, false>(out, nullptr, x, fn, base, d, s0, 0.0f, 0.0f, 0, eps, normEps, rnd);                 \
	}

HC_KERNELS(1)
HC_KERNELS(2)
HC_KERNELS(4)
HC_KERNELS(8)

// Weightless per-head RMS norm in place, one warp per segment of hd values.
// Faithful: acc += bf16(v*v) strictly in index order (shuffled to every lane),
// then mean, mean+eps, rsqrt and the products each rounded to bf16. Exact:
// float64 sum, fp32 products.
extern "C" __global__ void __launch_bounds__(256) head_norm_f32(float* __restrict__ x, long long segs, int hd, float eps, int rnd)
{
	const long long seg = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
	const int lane = threadIdx.x & 31;
	if (seg >= segs) return;
	float* q = x + seg * hd;
	float rs;
	if (rnd) {
		float acc = 0.0f;
		for (int c = 0; c < hd; c += 32) {
			const float v = c + lane < hd ? q[c + lane] : 0.0f;
			const float t = rbf16(__fmul_rn(v, v));
			const int k1 = min(32, hd - c);
			for (int k = 0; k < k1; k++) acc = __fadd_rn(acc, __shfl_sync(0xffffffffu, t, k));
		}
		const float mean = rbf16(__fdiv_rn(acc, (float)hd));
		const float ms = rbf16(__fadd_rn(mean, eps));
		rs = rbf16((float)(1.0 / sqrt((double)ms)));
	} else {
		double acc = 0.0;
		for (int i = lane; i < hd; i += 32) acc += (double)q[i] * (double)q[i];
		acc = warp_sum_d(acc);
		rs = (float)(1.0 / sqrt(acc / (double)hd + (double)eps));
	}
	for (int i = lane; i < hd; i += 32) {
		const float v = __fmul_rn(q[i], rs);
		q[i] = rnd ? rbf16(v) : v;
	}
}

// num.F32ToE2M1: clamp-free e2m1 code, nearest with ties to the even code.
DEV u32 f32_to_e2m1_code(float f) {
	if (f != f) return 0u;
	u32 sign = (__float_as_uint(f) >> 31) ? 8u : 0u;
	f = fabsf(f);
	u32 c;
	if (f <= 0.25f) c = 0u;
	else if (f < 0.75f) c = 1u;
	else if (f <= 1.25f) c = 2u;
	else if (f < 1.75f) c = 3u;
	else if (f <= 2.5f) c = 4u;
	else if (f < 3.5f) c = 5u;
	else if (f <= 5.0f) c = 6u;
	else c = 7u;
	return sign | c;
}

// In-place Sylvester Walsh–Hadamard per head of hd (power of two) values,
// scaled by sc = fp32(1/sqrt(hd)); faithful (fp4 = 1): bf16 round, then FP4
// simulation per 32 values with scale 2^ceil(log2(max(amax, 6·2^-126)/6)) as
// backend/cpu quantFP4. One block per head, hd floats of dynamic smem.
extern "C" __global__ void hadamard_fp4_f32(float* __restrict__ x, int hd, float sc, int fp4)
{
	extern __shared__ float sh[];
	float* h = x + (size_t)blockIdx.x * hd;
	for (int i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = h[i];
	__syncthreads();
	for (int s = 1; s < hd; s <<= 1) {
		for (int p = threadIdx.x; p < hd / 2; p += blockDim.x) {
			const int j = (p / s) * 2 * s + p % s;
			const float a = sh[j], c = sh[j + s];
			sh[j] = __fadd_rn(a, c);
			sh[j + s] = __fsub_rn(a, c);
		}
		__syncthreads();
	}
	if (!fp4) {
		for (int i = threadIdx.x; i < hd; i += blockDim.x) h[i] = __fmul_rn(sh[i], sc);
		return;
	}
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	const float inv6 = (float)(1.0 / 6.0);
	const float floor6 = 6.0f * __uint_as_float(0x00800000u); // 6 * 2^-126
	for (int b0 = w * 32; b0 < hd; b0 += nw * 32) {
		const int i = b0 + lane;
		const float v = i < hd ? rbf16(__fmul_rn(sh[i], sc)) : 0.0f;
		float amax = fabsf(v);
		for (int o = 16; o > 0; o >>= 1) {
			float t = __shfl_xor_sync(0xffffffffu, amax, o);
			if (t > amax || t != t) amax = t;
		}
		if (amax == amax) amax = fmaxf(amax, floor6);
		const u32 bits = __float_as_uint(__fmul_rn(amax, inv6));
		int e = (int)((bits >> 23) & 0xffu) - 127;
		if (bits & 0x7fffffu) e++;
		// e >= 128 (Inf/NaN amax): the CPU's scale is +Inf and every value NaN.
		const float s = e >= 128 ? __uint_as_float(0x7f800000u) : __uint_as_float((u32)(e + 127) << 23);
		const float q = fminf(fmaxf(__fdiv_rn(v, s), -6.0f), 6.0f);
		const float y = e >= 128 ? __uint_as_float(0x7fc00000u) : __fmul_rn(e2m1_to_f32(f32_to_e2m1_code(q)), s);
		if (i < hd) h[i] = y;
	}
}
