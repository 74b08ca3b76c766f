// Hyper-connection collapse (hc pre / hc head), per-head norm and the
// Hadamard + FP4 simulation of the GPU backend, on fp32 activations. Every
// scalar step mirrors backend/cpu (ops.go, linear.go) with explicit _rn
// intrinsics so NVRTC's default FMA contraction cannot change a rounding.
#include "rowops.cuh"
#include "hc_sinkhorn.cuh"

DEV float sigmoid_d(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

// a / s rounded once to fp32, bit for bit __fdiv_rn(a, s), given rs =
// 1.0 / (double)s: the double product is within 2^-52 (relative) of a/s,
// and a quotient of two fp32 values is never closer than 2^-49 to an fp32
// rounding midpoint, so rounding the product rounds the exact quotient.
// One division per row or column instead of N, and the N products overlap.
DEV float div_rs(float a, double rs) { return (float)((double)a * rs); }

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
		const double rs = 1.0 / (double)s;
		for (int k = 0; k < N; k++) row[k] = __fadd_rn(div_rs(row[k], rs), eps);
	}
	for (int it = 0; it < iters; it++) {
		if (it > 0) {
			for (int j = 0; j < N; j++) {
				float s = 0.0f;
				for (int k = 0; k < N; k++) s = __fadd_rn(s, c[j * N + k]);
				const double rs = 1.0 / (double)__fadd_rn(s, eps);
				for (int k = 0; k < N; k++) c[j * N + k] = div_rs(c[j * N + k], rs);
			}
		}
		for (int k = 0; k < N; k++) {
			float s = 0.0f;
			for (int j = 0; j < N; j++) s = __fadd_rn(s, c[j * N + k]);
			const double rs = 1.0 / (double)__fadd_rn(s, eps);
			for (int j = 0; j < N; j++) c[j * N + k] = div_rs(c[j * N + k], rs);
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
	{ PDL_ENTRY();                                                                                             \
		hc_body<N, true>(out, mix, x, fn, base, d, s0, s1, s2, iters, eps, normEps, rnd);                      \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(HC_THREADS) hc_head_f32_n##N(                               \
		float* out, const float* x, const float* fn, const float* base, int d, float s0, float eps,            \
		float normEps, int rnd)                                                                                \
	{ PDL_ENTRY();                                                                                             \
		hc_body<N, false>(out, nullptr, x, fn, base, d, s0, 0.0f, 0.0f, 0, eps, normEps, rnd);                 \
	}

HC_KERNELS(1)
HC_KERNELS(2)
HC_KERNELS(4)
HC_KERNELS(8)

// ---- hc pre, split over many CTAs (small batches and prefill alike) ----
// hc_pre_part: CTA (s, b) takes rows [b*R, b*R+R) and columns [s*C, s*C+C)
// of the flattened width: the MIX partial dots (fn row i on warp i % 8, so a
// warp reduces its own dots) and the partial float64 sum of squares (warp r
// for row r). The partials go to the row's own out buffer, used as scratch
// (the launcher checks they fit in d floats): ss[S] doubles, then part[S][MIX].
// hc_pre_fin (one CTA per row) sums them (a fixed order), runs the scalar mHC
// recipe and only then overwrites out, so no extra buffer is needed.
template <int N, bool PRE>
struct HcSplit {
	static constexpr int MIX = PRE ? (2 + N) * N : N; // hc head: the N pre weights only
	static constexpr int R = N <= 4 ? 8 : 4;    // rows per CTA (fn loads shared)
	static constexpr int RW = (MIX + 7) / 8;   // fn rows per warp
};

// The first column step's fn float4s, weights, are loaded before the PDL
// wait, so they are in flight with x's; rows past `rows` (a CTA of R rows at
// batch 1..R-1) skip their dots and warp sums, which at batch 1 were 7/8 of
// the shuffles.
template <int N, bool PRE>
DEV void hc_part_body(float* __restrict__ out, const float* __restrict__ x, const float* __restrict__ fn,
	int rows, int d, int C, int S)
{
	constexpr int MIX = HcSplit<N, PRE>::MIX, R = HcSplit<N, PRE>::R, RW = HcSplit<N, PRE>::RW;
	extern __shared__ float4 xs4[]; // [R][C/4]
	const int s = blockIdx.x, r0 = blockIdx.y * R;
	const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	const int width = N * d;
	const int c0 = s * C;
	const int C4 = min(C, width - c0) >> 2; // columns of this chunk / 4
	const int CS = C >> 2;                  // smem row stride (float4)
	const int nr = min(R, rows - r0);       // rows of this CTA
	auto fnat = [&](int k, int c4) {
		const int i = w + 8 * k;
		return i < MIX ? *reinterpret_cast<const float4*>(fn + (size_t)i * width + c0 + 4 * c4)
			       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	};
	float4 f0[RW];
	if (lane < C4) {
#pragma unroll
		for (int k = 0; k < RW; k++) f0[k] = fnat(k, lane);
	}
	PDL_ENTRY();
	for (int idx = tid; idx < R * C4; idx += HC_THREADS) {
		const int r = idx / C4, c4 = idx - r * C4;
		float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		if (r0 + r < rows) v = *reinterpret_cast<const float4*>(x + (size_t)(r0 + r) * width + c0 + 4 * c4);
		xs4[r * CS + c4] = v;
	}
	__syncthreads();
	if (w < R && r0 + w < rows) { // partial sum of squares of row r0+w
		double ss = 0.0;
		for (int c4 = lane; c4 < C4; c4 += 32) {
			const float4 v = xs4[w * CS + c4];
			ss += (double)v.x * (double)v.x;
			ss += (double)v.y * (double)v.y;
			ss += (double)v.z * (double)v.z;
			ss += (double)v.w * (double)v.w;
		}
		ss = warp_sum_d(ss);
		if (lane == 0) reinterpret_cast<double*>(out + (size_t)(r0 + w) * d)[s] = ss;
	}
	float acc[RW][R];
#pragma unroll
	for (int k = 0; k < RW; k++)
#pragma unroll
		for (int r = 0; r < R; r++) acc[k][r] = 0.0f;
	auto step = [&](int c4, const float4 (&f)[RW]) {
#pragma unroll
		for (int r = 0; r < R; r++) {
			if (r >= nr) break;
			const float4 v = xs4[r * CS + c4];
#pragma unroll
			for (int k = 0; k < RW; k++) {
				float a = acc[k][r];
				a = fmaf(f[k].x, v.x, a);
				a = fmaf(f[k].y, v.y, a);
				a = fmaf(f[k].z, v.z, a);
				a = fmaf(f[k].w, v.w, a);
				acc[k][r] = a;
			}
		}
	};
	if (lane < C4) step(lane, f0);
#pragma unroll 1 // (unrolling spills on some toolkits; R rows per load keep it busy)
	for (int c4 = lane + 32; c4 < C4; c4 += 32) {
		float4 f[RW];
#pragma unroll
		for (int k = 0; k < RW; k++) f[k] = fnat(k, c4);
		step(c4, f);
	}
#pragma unroll
	for (int k = 0; k < RW; k++) {
		const int i = w + 8 * k;
#pragma unroll
		for (int r = 0; r < R; r++) {
			if (r >= nr) break; // (uniform: whole warps skip the shuffles)
			const float t = warp_sum(acc[k][r]);
			if (i < MIX && lane == 0 && r0 + r < rows) out[(size_t)(r0 + r) * d + 2 * S + s * MIX + i] = t;
		}
	}
}

// Shared memory of the final hc pre/head kernels.
template <int N, bool PRE>
struct HcFin {
	float m[HcSplit<N, PRE>::MIX];
	float c[N * N]; // Sinkhorn input (PRE)
	float pre[N];
	double tot;
};

// The scalar mHC recipe of the final kernels on row r, by threads
// 0..HC_THREADS-1 (any further warps only pass its barriers): the S split
// partials in orow summed (a fixed order), then pre into f.pre and, PRE,
// post into mr and the Sinkhorn input into f.c. Every partial has been read
// on return, so orow may be overwritten.
template <int N, bool PRE>
DEV void hc_fin_mix(HcFin<N, PRE>& f, const float* __restrict__ orow, float* __restrict__ mr,
	const float* __restrict__ base, int d, float s0, float s1, float s2, float eps, float normEps, int S)
{
	constexpr int MIX = HcSplit<N, PRE>::MIX;
	const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	// The S partials of each mix entry: 8 lanes take every 8th split (their
	// loads all in flight, instead of one serial chain of S), then a fixed
	// shuffle tree adds the 8 sums: deterministic.
	if (tid < HC_THREADS) {
		for (int q = tid; q < (MIX * 8 + 31) / 32 * 32; q += HC_THREADS) {
			const int i = q >> 3, j = q & 7;
			float t = 0.0f;
			if (i < MIX) {
				const float* pp = orow + 2 * S + i;
#pragma unroll 8
				for (int s = j; s < S; s += 8) t += pp[s * MIX];
			}
			t += __shfl_xor_sync(0xffffffffu, t, 4);
			t += __shfl_xor_sync(0xffffffffu, t, 2);
			t += __shfl_xor_sync(0xffffffffu, t, 1);
			if (i < MIX && j == 0) f.m[i] = t;
		}
	}
	if (w == HC_THREADS / 32 - 1) {
		const double* ps = reinterpret_cast<const double*>(orow);
		double t = 0.0;
		for (int s = lane; s < S; s += 32) t += ps[s];
		t = warp_sum_d(t);
		if (lane == 0) f.tot = t;
	}
	__syncthreads();
	const int width = N * d;
	const float ms = __fadd_rn((float)(f.tot / (double)width), normEps);
	const float rr = (float)(1.0 / sqrt((double)ms));
	if (tid < MIX) {
		const float v = __fmul_rn(f.m[tid], rr);
		if (tid < N) f.pre[tid] = __fadd_rn(sigmoid_d(__fadd_rn(__fmul_rn(v, s0), base[tid])), eps);
		else if (tid < 2 * N) mr[tid - N] = 2.0f * sigmoid_d(__fadd_rn(__fmul_rn(v, s1), base[tid]));
		else f.c[tid - 2 * N] = __fadd_rn(__fmul_rn(v, s2), base[tid]);
	}
	__syncthreads();
}

// The N streams' float4 at 4i of row xr (streams of d).
template <int N>
DEV void hc_load4(float4 (&v)[N], const float* __restrict__ xr, int d, int i) {
#pragma unroll
	for (int j = 0; j < N; j++) v[j] = *reinterpret_cast<const float4*>(xr + (size_t)j * d + 4 * i);
}

// The hc output's 4 values from hc_load4's v: rnd(Σ_j p_j·v_j), in stream
// order.
template <int N>
DEV float4 hc_wsum4v(const float4 (&v)[N], const float (&p)[N], int rnd) {
	float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
#pragma unroll
	for (int j = 0; j < N; j++) {
		o0 = __fadd_rn(o0, __fmul_rn(p[j], v[j].x));
		o1 = __fadd_rn(o1, __fmul_rn(p[j], v[j].y));
		o2 = __fadd_rn(o2, __fmul_rn(p[j], v[j].z));
		o3 = __fadd_rn(o3, __fmul_rn(p[j], v[j].w));
	}
	if (rnd) { o0 = rbf16(o0); o1 = rbf16(o1); o2 = rbf16(o2); o3 = rbf16(o3); }
	return make_float4(o0, o1, o2, o3);
}

// The hc output's 4 values at 4i of row xr.
template <int N>
DEV float4 hc_wsum4(const float* __restrict__ xr, int d, const float (&p)[N], int i, int rnd) {
	float4 v[N];
	hc_load4<N>(v, xr, d, i);
	return hc_wsum4v<N>(v, p, rnd);
}

// The final hc head kernel (N mix entries, one scale, no Sinkhorn): the
// partials summed by hc_fin_mix, then the pre-weighted sum of the streams.
template <int N>
DEV void hc_head_fin_body(float* __restrict__ out, const float* __restrict__ x, const float* __restrict__ base,
	int d, float s0, float eps, float normEps, int rnd, int S)
{
	__shared__ HcFin<N, false> f;
	const int r = blockIdx.x, tid = threadIdx.x;
	float* orow = out + (size_t)r * d;
	hc_fin_mix<N, false>(f, orow, nullptr, base, d, s0, 0.0f, 0.0f, eps, normEps, S);
	float p[N];
#pragma unroll
	for (int j = 0; j < N; j++) p[j] = f.pre[j];
	const float* xr = x + (size_t)r * N * d;
	const int d4 = d >> 2;
#pragma unroll(N >= 8 ? 1 : 2) // (n8 spills when unrolled)
	for (int i = tid; i < d4; i += HC_THREADS)
		*reinterpret_cast<float4*>(orow + 4 * i) = hc_wsum4<N>(xr, d, p, i, rnd);
}

// ---- hc pre fin ----
// hc_pre_fin_f32 / hc_pre_fin_norm_f32 (one CTA a row; the norm variant also
// runs rmsnorm_f32 on the output row, bit for bit the two launches). At
// decode each memory round trip and each dependent step is on the critical
// path (about half the time of a warp Sinkhorn a call):
// - base and the norm weight (weights) are loaded before the PDL wait, x's
//   first XC float4 sets and all S partials of a thread right after it: one
//   round trip for the partials, base and x together;
// - warp 8 sums the float64 squares and, after the one block barrier, forms
//   the Sinkhorn input itself and runs sinkhorn_lanes (a matrix element a
//   lane, one division a pass, no shared memory) without waiting for the
//   sigmoids;
// - warps 0-7 form pre and post, then the output or (NORM) its RMS norm,
//   rmsnorm_f32's row body (rms_row4_rest) on named barrier 1.
#define HC_NORM_THREADS (HC_THREADS + 32)
#define HC_PB 16 // partials a thread loads before it adds them

// rsqrt of the mean square + eps from the float64 sum of squares, as hc_fin_mix.
DEV float hc_rr(double tot, int width, float normEps) {
	const float ms = __fadd_rn((float)(tot / (double)width), normEps);
	return (float)(1.0 / sqrt((double)ms));
}

// QUANT (with NORM; d % 128 == 0): the normed row's FP8 quantisation too,
// quant_fp8_f32's codes q [rows, d] and e8m0 scales qs [rows, d/128] bit for
// bit (a warp's 32 float4s of one step are one 128-value block), as
// rmsnorm_quant_f32 does: the linears that take the row skip their launch.
template <int N, bool NORM, bool QUANT = false>
DEV void hc_fin2_body(float* __restrict__ y, float* __restrict__ out, float* __restrict__ mixo,
	const float* __restrict__ x, const float* __restrict__ base, const float* __restrict__ nw, int d, float s0,
	float s1, float s2, int iters, float eps, float normEps, int rnd, int S, float neps,
	u8* __restrict__ q = nullptr, u8* __restrict__ qs = nullptr)
{
	constexpr int MIX = HcSplit<N, true>::MIX, NN = N * N, E = SkLayout<N>::E;
	// x float4 sets loaded ahead: N·XC float4 registers (n8 would need 128 at
	// 4; n2 at 4 or 2 spills a word around the sigmoid's float64 division
	// slow-path call under NVRTC 12.4, at 3 not).
	constexpr int XC = N == 1 || N == 4 ? RMS_CACHE : N == 2 ? 3 : 2;
	constexpr int QE = (MIX * 8 + 31) / 32 * 32; // partial-sum threads (whole warps)
	__shared__ float m[MIX];
	__shared__ float pre[N];
	__shared__ double tot;
	__shared__ float red[32];
	const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
	float* orow = out + (size_t)r * d;
	float* mr = mixo + (size_t)r * (N + NN);
	const int width = N * d;
	if (tid >= HC_THREADS) { // warp 8: the squares, then the Sinkhorn
		const SkLayout<N> L(lane);
		float bc[E];
#pragma unroll
		for (int t = 0; t < E; t++) bc[t] = base[2 * N + L.e0 + 32 * t];
		PDL_ENTRY();
		const double* ps = reinterpret_cast<const double*>(orow);
		double a = 0.0; // hc_fin_mix's order: lane-strided, then the warp tree
		for (int sb = lane; sb < S; sb += 32 * 8) {
			double v[8];
#pragma unroll
			for (int k = 0; k < 8; k++) v[k] = sb + 32 * k < S ? ps[sb + 32 * k] : 0.0;
#pragma unroll
			for (int k = 0; k < 8; k++)
				if (sb + 32 * k < S) a += v[k];
		}
		a = warp_sum_d(a); // the same bits on every lane
		if (lane == 0) tot = a;
		__syncthreads();
		const float rr = hc_rr(a, width, normEps);
		float c[E];
#pragma unroll
		for (int t = 0; t < E; t++) c[t] = __fadd_rn(__fmul_rn(__fmul_rn(m[2 * N + L.e0 + 32 * t], rr), s2), bc[t]);
		sinkhorn_lanes<N>(c, max(iters, 1), eps, lane);
		if (lane < NN) {
#pragma unroll
			for (int t = 0; t < E; t++) mr[N + lane + 32 * t] = c[t];
		}
		return;
	}
	const int n4 = d >> 2;
	const float4* w4 = reinterpret_cast<const float4*>(nw);
	const float bp = tid < 2 * N ? base[tid] : 0.0f;
	float4 wv[RMS_CACHE];
	if (NORM) {
#pragma unroll
		for (int k = 0; k < RMS_CACHE; k++)
			if (tid + k * HC_THREADS < n4) wv[k] = w4[tid + k * HC_THREADS];
	}
	PDL_ENTRY();
	const float* xr = x + (size_t)r * width;
	float4 xs[XC][N];
#pragma unroll
	for (int k = 0; k < XC; k++)
		if (tid + k * HC_THREADS < n4) hc_load4<N>(xs[k], xr, d, tid + k * HC_THREADS);
	// The S partials of each mix entry as hc_fin_mix sums them: 8 lanes take
	// every 8th split, then a fixed shuffle tree adds their 8 sums.
#pragma unroll
	for (int q = tid; q < QE; q += HC_THREADS) {
		const int i = q >> 3, j = q & 7;
		float t = 0.0f;
		if (i < MIX) {
			const float* pp = orow + 2 * S + i;
			for (int sb = j; sb < S; sb += 8 * HC_PB) {
				float v[HC_PB];
#pragma unroll
				for (int k = 0; k < HC_PB; k++) v[k] = sb + 8 * k < S ? pp[(sb + 8 * k) * MIX] : 0.0f;
#pragma unroll
				for (int k = 0; k < HC_PB; k++)
					if (sb + 8 * k < S) t += v[k];
			}
		}
		t += __shfl_xor_sync(0xffffffffu, t, 4);
		t += __shfl_xor_sync(0xffffffffu, t, 2);
		t += __shfl_xor_sync(0xffffffffu, t, 1);
		if (i < MIX && j == 0) m[i] = t;
	}
	__syncthreads(); // every partial has been read: out may be written
	if (tid < 2 * N) {
		const float v = __fmul_rn(m[tid], hc_rr(tot, width, normEps));
		if (tid < N) pre[tid] = __fadd_rn(sigmoid_d(__fadd_rn(__fmul_rn(v, s0), bp)), eps);
		else mr[tid - N] = 2.0f * sigmoid_d(__fadd_rn(__fmul_rn(v, s1), bp));
	}
	rms_sync<1>(HC_THREADS);
	float p[N];
#pragma unroll
	for (int j = 0; j < N; j++) p[j] = pre[j];
	float4 xv[RMS_CACHE];
#pragma unroll
	for (int k = 0; k < RMS_CACHE; k++) {
		const int i = tid + k * HC_THREADS;
		if (i < n4) xv[k] = k < XC ? hc_wsum4v<N>(xs[k < XC ? k : 0], p, rnd) : hc_wsum4<N>(xr, d, p, i, rnd);
	}
	auto xat = [&](int i) { return hc_wsum4<N>(xr, d, p, i, rnd); };
	if (NORM) {
		float4* y4 = reinterpret_cast<float4*>(y + (size_t)r * d);
		u8* qr = QUANT ? q + (size_t)r * d : nullptr;
		u8* qsr = QUANT ? qs + (size_t)r * (d >> 7) : nullptr;
		auto put = [&](int i, float4 o) {
			y4[i] = o;
			if (QUANT) {
				const float v[4] = {o.x, o.y, o.z, o.w};
				quant128(v, lane, qr + (i >> 5) * 128, qsr + (i >> 5));
			}
		};
		rms_row4_rest<1>(put, xat, w4, xv, wv, n4, d, neps, rnd, red, tid, HC_THREADS);
		return;
	}
	float4* o4 = reinterpret_cast<float4*>(orow);
#pragma unroll
	for (int k = 0; k < RMS_CACHE; k++)
		if (tid + k * HC_THREADS < n4) o4[tid + k * HC_THREADS] = xv[k];
	for (int i = tid + RMS_CACHE * HC_THREADS; i < n4; i += HC_THREADS) o4[i] = xat(i);
}

#define HC_SPLIT_KERNELS(N)                                                                                     \
	extern "C" __global__ void __launch_bounds__(HC_THREADS) hc_pre_part_f32_n##N(                           \
		float* out, const float* x, const float* fn, int rows, int d, int C, int S)                            \
	{                                                                                                          \
		hc_part_body<N, true>(out, x, fn, rows, d, C, S);                                                      \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(HC_NORM_THREADS) hc_pre_fin_f32_n##N(                       \
		float* out, float* mix, const float* x, const float* base, int d, float s0, float s1, float s2,        \
		int iters, float eps, float normEps, int rnd, int S)                                                   \
	{                                                                                                          \
		hc_fin2_body<N, false>(nullptr, out, mix, x, base, nullptr, d, s0, s1, s2, iters, eps, normEps, rnd, S, \
			0.0f);                                                                                             \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(HC_NORM_THREADS) hc_pre_fin_norm_f32_n##N(                  \
		float* y, float* out, float* mix, const float* x, const float* base, const float* w, int d, float s0,  \
		float s1, float s2, int iters, float eps, float normEps, int rnd, int S, float neps)                   \
	{                                                                                                          \
		hc_fin2_body<N, true>(y, out, mix, x, base, w, d, s0, s1, s2, iters, eps, normEps, rnd, S, neps);      \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(HC_NORM_THREADS) hc_pre_fin_norm_quant_f32_n##N(            \
		float* y, float* out, float* mix, const float* x, const float* base, const float* w, int d, float s0,  \
		float s1, float s2, int iters, float eps, float normEps, int rnd, int S, float neps, u8* q, u8* qs)    \
	{                                                                                                          \
		hc_fin2_body<N, true, true>(y, out, mix, x, base, w, d, s0, s1, s2, iters, eps, normEps, rnd, S, neps, \
			q, qs);                                                                                            \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(HC_THREADS) hc_head_part_f32_n##N(                          \
		float* out, const float* x, const float* fn, int rows, int d, int C, int S)                            \
	{                                                                                                          \
		hc_part_body<N, false>(out, x, fn, rows, d, C, S);                                                     \
	}                                                                                                          \
	extern "C" __global__ void __launch_bounds__(HC_THREADS) hc_head_fin_f32_n##N(                           \
		float* out, const float* x, const float* base, int d, float s0, float eps, float normEps, int rnd,     \
		int S)                                                                                                 \
	{ PDL_ENTRY();                                                                                             \
		hc_head_fin_body<N>(out, x, base, d, s0, eps, normEps, rnd, S);                                        \
	}

HC_SPLIT_KERNELS(1)
HC_SPLIT_KERNELS(2)
HC_SPLIT_KERNELS(4)
HC_SPLIT_KERNELS(8)

// Weightless per-head RMS norm in place (head_norm_seg), one warp per
// segment of hd values (8 warps per block).
extern "C" __global__ void __launch_bounds__(256) head_norm_f32(float* __restrict__ x, long long segs, int hd, float eps, int rnd)
{
	PDL_ENTRY();
	__shared__ __align__(16) float ts[8][HN_CHUNK];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const long long seg = blockIdx.x * 8LL + warp;
	if (seg >= segs) return; // whole warps only: the block never syncs, warps only __syncwarp
	head_norm_seg(x + seg * hd, hd, eps, rnd, ts[warp], lane);
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

// The Walsh–Hadamard of hadamard_fp4_f32 on the head already in sh (hd
// floats, visible to the block), written to h.
DEV void hadamard_fp4_seg(float* __restrict__ h, float* sh, int hd, float sc, int fp4)
{
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

// In-place Sylvester Walsh–Hadamard per head of hd (power of two) values,
// scaled by sc = fp32(1/sqrt(hd)); faithful (fp4 = 1): bf16 round, then FP4
// simulation per 32 values with scale 2^ceil(log2(max(amax, 6·2^-126)/6)) as
// backend/cpu quantFP4. One block per head, hd floats of dynamic smem.
extern "C" __global__ void hadamard_fp4_f32(float* __restrict__ x, int hd, float sc, int fp4)
{
	PDL_ENTRY();
	extern __shared__ float sh[];
	float* h = x + (size_t)blockIdx.x * hd;
	for (int i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = h[i];
	__syncthreads();
	hadamard_fp4_seg(h, sh, hd, sc, fp4);
}

// The indexer's q epilogue in one launch, bit for bit rope_f32 (the last rd
// of every head of hd values, position pos[head / heads]) and then
// hadamard_fp4_f32: one block a head, which rotates its rope pairs in shared
// memory before the transform (fp4 is also rope_f32's faithful).
extern "C" __global__ void rope_hadamard_fp4_f32(float* __restrict__ x, const int* __restrict__ pos,
	const float* __restrict__ f32, const double* __restrict__ f64, int heads, int hd, int rd, int inverse, float sc,
	int fp4)
{
	PDL_ENTRY();
	extern __shared__ float sh[];
	float* h = x + (size_t)blockIdx.x * hd;
	for (int i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = h[i];
	__syncthreads();
	const int t = pos[blockIdx.x / heads];
	for (int p = threadIdx.x; p < rd / 2; p += blockDim.x) rope_pair(sh + hd - rd + 2 * p, t, f32, f64, p, inverse, fp4);
	__syncthreads();
	hadamard_fp4_seg(h, sh, hd, sc, fp4);
}
