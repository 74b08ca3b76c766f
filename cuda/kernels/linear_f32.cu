// fp32 SIMT linear for the GPU backend: y[m, o] = rnd(sum_k x[m, xoff(o) + k] * W[o, k])
// with W read in its checkpoint format and dequantised exactly to fp32 while it
// is staged in shared memory (fmt: 0 f32, 1 bf16, 2 FP8 block 128x128 e8m0,
// 3 MXFP4 e8m0/32, 4 NVFP4 e4m3/16 * scale2). Used for the fp32 linears
// (compressor, router gate, head), bf16 weights, the grouped output projection
// (gridDim.z = groups: output rows [z*R, (z+1)*R) read x columns [z*K, (z+1)*K))
// and exact mode. Register tiling: a 64x64 tile per 256 threads, 4x4 each.
#include "common.cuh"

#define TM 64
#define TN 64
#define TK 16

DEV float wload(const u8* w, const u8* ws, int fmt, float scale2, int o, int k, int K, int sCols) {
	switch (fmt) {
	case 0: return ((const float*)w)[(size_t)o * K + k];
	case 1: return bf16_to_f32(((const u16*)w)[(size_t)o * K + k]);
	case 2: return e4m3_to_f32(w[(size_t)o * K + k]) * e8m0_to_f32(ws[(size_t)(o / 128) * sCols + k / 128]);
	case 3: {
		u32 by = w[(size_t)o * (K / 2) + k / 2];
		return e2m1_to_f32((k & 1) ? by >> 4 : by & 15u) * e8m0_to_f32(ws[(size_t)o * sCols + k / 32]);
	}
	default: {
		u32 by = w[(size_t)o * (K / 2) + k / 2];
		return e2m1_to_f32((k & 1) ? by >> 4 : by & 15u) * (e4m3_to_f32(ws[(size_t)o * sCols + k / 16]) * scale2);
	}
	}
}

// tile_f32 computes one 64x64 output tile: rows [m0, min(m0+64, mEnd)) of x
// (stride ldx), output rows [o0, min(o0+64, oEnd)) of W, into y (stride N).
DEV void tile_f32(float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
	int fmt, float scale2, int sCols, int m0, int mEnd, int o0, int oEnd, int N, int K, int ldx, int rnd)
{
	__shared__ float xs[TK][TM + 1];
	__shared__ float wt[TK][TN + 1];
	const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
	float acc[4][4] = {};
	for (int k0 = 0; k0 < K; k0 += TK) {
		for (int i = threadIdx.x; i < TK * TM; i += 256) {
			int mm = i / TK, kk = i % TK;
			int m = m0 + mm, k = k0 + kk;
			xs[kk][mm] = (m < mEnd && k < K) ? x[(size_t)m * ldx + k] : 0.0f;
			int o = o0 + mm;
			wt[kk][mm] = (o < oEnd && k < K) ? wload(w, ws, fmt, scale2, o, k, K, sCols) : 0.0f;
		}
		__syncthreads();
#pragma unroll
		for (int kk = 0; kk < TK; kk++) {
			float a[4], bv[4];
#pragma unroll
			for (int i = 0; i < 4; i++) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
			for (int j = 0; j < 4; j++) bv[j] = wt[kk][tx * 4 + j];
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < 4; j++) acc[i][j] += a[i] * bv[j];
		}
		__syncthreads();
	}
#pragma unroll
	for (int i = 0; i < 4; i++) {
		int m = m0 + ty * 4 + i;
		if (m >= mEnd) continue;
#pragma unroll
		for (int j = 0; j < 4; j++) {
			int o = o0 + tx * 4 + j;
			if (o < oEnd) {
				float v = acc[i][j];
				y[(size_t)m * N + o] = rnd ? bf16_to_f32(f32_to_bf16(v)) : v;
			}
		}
	}
}

extern "C" __global__ void __launch_bounds__(256) linear_f32(
	float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
	int fmt, float scale2, int sCols, int M, int N, int K, int R, int ldx, int rnd)
{
	const int g = blockIdx.z;
	const int o0 = g * R + blockIdx.x * TN; // first output row of the tile
	tile_f32(y, x + (size_t)g * K, w, ws, fmt, scale2, sCols, blockIdx.y * TM, M, o0, min((g + 1) * R, N), N, K, ldx, rnd);
}

// Exact-mode grouped expert linear: for expert e = blockIdx.z and rows m in
// [offsets[e], offsets[e+1]), y[m, :] = x[m, :] · W_eᵀ in fp32, W_e the FP4
// weights of expert e (fmt 3 MXFP4 or 4 NVFP4, scale2 = gscale[e]) at byte
// strides wStride/sStride. Blocks past an expert's rows return at once.
extern "C" __global__ void __launch_bounds__(256) moe_linear_f32(
	float* __restrict__ y, const float* __restrict__ x, const int* __restrict__ offsets,
	const u8* __restrict__ w, const u8* __restrict__ ws, const float* __restrict__ gscale,
	int fmt, long long wStride, long long sStride, int sCols, int N, int K)
{
	const int e = blockIdx.z;
	const int lo = offsets[e], hi = offsets[e + 1];
	const int m0 = lo + blockIdx.y * TM;
	if (m0 >= hi) return;
	const float scale2 = gscale ? gscale[e] : 1.0f;
	tile_f32(y, x, w + e * wStride, ws + e * sStride, fmt, scale2, sCols, m0, hi, blockIdx.x * TN, N, N, K, K, 0);
}

// ---- Decode GEMV ----
// Weight-stream loads: every weight is read once, so bypass L1 and let L2
// fetch 256-byte lines. volatile: never speculated past a bounds check.
DEV uint4 ldw16(const u8* p) {
	uint4 r;
	asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
		: "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
	return r;
}
DEV uint2 ldw8(const u8* p) {
	uint2 r;
	asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
	return r;
}
DEV u32 ldw4(const u8* p) {
	u32 r;
	asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];\n" : "=r"(r) : "l"(p));
	return r;
}
// Scale bytes are shared by neighbouring lanes and rows: keep them in L1.
DEV u32 lds1(const u8* p) {
	u32 r;
	asm volatile("ld.global.nc.u8 %0, [%1];\n" : "=r"(r) : "l"(p));
	return r;
}

// Per format F, in units of 8 weights (k % 8 == 0): UW 32-bit words a unit,
// U units a lane loads per step (64 bytes for f32/bf16; FP8/FP4 fewer, as
// their dequantisation and scale bytes cost registers). Lane l's unit u of a
// step at k0 is k0 + u*256 + l*8: each load instruction of a warp reads one
// contiguous run.
template <int F> struct GV {
	static constexpr int UW = F == 0 ? 8 : F == 1 ? 4 : F == 2 ? 2 : 1;
	static constexpr int U = F == 0 ? 2 : 4;
};

// gload issues the loads of the unit at k of row wr (scale row sr).
template <int F> DEV void gload(const u8* wr, const u8* sr, int k, u32* r, u32& s) {
	if (F == 0) {
		const uint4 a = ldw16(wr + (size_t)k * 4), b = ldw16(wr + (size_t)k * 4 + 16);
		r[0] = a.x; r[1] = a.y; r[2] = a.z; r[3] = a.w; r[4] = b.x; r[5] = b.y; r[6] = b.z; r[7] = b.w;
	} else if (F == 1) {
		const uint4 a = ldw16(wr + (size_t)k * 2);
		r[0] = a.x; r[1] = a.y; r[2] = a.z; r[3] = a.w;
	} else if (F == 2) {
		const uint2 a = ldw8(wr + k);
		r[0] = a.x; r[1] = a.y;
		s = lds1(sr + k / 128);
	} else {
		r[0] = ldw4(wr + k / 2);
		s = lds1(sr + k / (F == 3 ? 32 : 16));
	}
}

// gfma dequantises a unit exactly as wload does and accumulates it against
// x[m, k..k+8) (xk = &x[0, k]) for the M <= MM rows.
template <int F, int MM> DEV void gfma(const u32* r, u32 s, float scale2, const float* xk, int ldx, int M, float* acc) {
	float v[8];
	if (F == 0) {
#pragma unroll
		for (int i = 0; i < 8; i++) v[i] = __uint_as_float(r[i]);
	} else if (F == 1) {
#pragma unroll
		for (int i = 0; i < 4; i++) { v[2 * i] = __uint_as_float(r[i] << 16); v[2 * i + 1] = __uint_as_float(r[i] & 0xffff0000u); }
	} else if (F == 2) {
		const float sc = e8m0_to_f32(s);
#pragma unroll
		for (int i = 0; i < 8; i++) v[i] = e4m3_to_f32((r[i / 4] >> (8 * (i % 4))) & 0xffu) * sc;
	} else {
		const float sc = F == 3 ? e8m0_to_f32(s) : e4m3_to_f32(s) * scale2;
#pragma unroll
		for (int i = 0; i < 8; i++) v[i] = e2m1_to_f32((r[0] >> (4 * i)) & 15u) * sc;
	}
#pragma unroll
	for (int m = 0; m < MM; m++) {
		if (MM > 1 && m >= M) break; // M == MM == 1 needs no check: x loads can be hoisted
		const float4* xp = reinterpret_cast<const float4*>(xk + (size_t)m * ldx);
		const float4 a = xp[0], b = xp[1];
		float t = acc[m];
		t = fmaf(a.x, v[0], t); t = fmaf(a.y, v[1], t); t = fmaf(a.z, v[2], t); t = fmaf(a.w, v[3], t);
		t = fmaf(b.x, v[4], t); t = fmaf(b.y, v[5], t); t = fmaf(b.z, v[6], t); t = fmaf(b.w, v[7], t);
		acc[m] = t;
	}
}

// gemv_slice accumulates weights [kb, ke) of one row into this lane's acc:
// first the ragged rem = (ke-kb) % (U*256) weights (loads checked), then whole
// steps of U*256, software-pipelined over two register buffers so that the
// loads of the next step are in flight while this step's FMAs run.
template <int F, int MM> DEV void gemv_slice(float* acc, const u8* wr, const u8* sr, const float* xg, float scale2,
	int M, int ldx, int kb, int ke, int lane)
{
	constexpr int U = GV<F>::U, UW = GV<F>::UW, STEP = U * 256;
	u32 ra[U][UW], sa[U], rb[U][UW], sb[U];
	const int kf = kb + (ke - kb) % STEP; // whole steps cover [kf, ke)
	const int kl = lane * 8;
	if (kb < kf) {
#pragma unroll
		for (int u = 0; u < U; u++)
			if (kb + u * 256 + kl < kf) gload<F>(wr, sr, kb + u * 256 + kl, rb[u], sb[u]);
	}
	if (kf < ke) {
#pragma unroll
		for (int u = 0; u < U; u++) gload<F>(wr, sr, kf + u * 256 + kl, ra[u], sa[u]);
	}
	if (kb < kf) {
#pragma unroll
		for (int u = 0; u < U; u++)
			if (kb + u * 256 + kl < kf) gfma<F, MM>(rb[u], sb[u], scale2, xg + kb + u * 256 + kl, ldx, M, acc);
	}
	for (int kw = kf; kw < ke;) {
		if (kw + STEP < ke) {
#pragma unroll
			for (int u = 0; u < U; u++) gload<F>(wr, sr, kw + STEP + u * 256 + kl, rb[u], sb[u]);
		}
#pragma unroll
		for (int u = 0; u < U; u++) gfma<F, MM>(ra[u], sa[u], scale2, xg + kw + u * 256 + kl, ldx, M, acc);
		kw += STEP;
		if (kw >= ke) break;
		if (kw + STEP < ke) {
#pragma unroll
			for (int u = 0; u < U; u++) gload<F>(wr, sr, kw + STEP + u * 256 + kl, ra[u], sa[u]);
		}
#pragma unroll
		for (int u = 0; u < U; u++) gfma<F, MM>(rb[u], sb[u], scale2, xg + kw + u * 256 + kl, ldx, M, acc);
		kw += STEP;
	}
}

// Decode GEMV (M <= MM <= 8 rows), same function as linear_f32. A CTA of 8
// warps takes rpc output rows (rpc = 1 << lrpc, 1..8); the 8/rpc warps of a
// row each stream a contiguous K slice (a multiple of 8 weights) of W[o, :]
// in its format, and the slices' sums are added in slice order
// (deterministic). x rows need 16-byte alignment (ldx % 4 == 0, K % 8 == 0).
template <int F, int MM> DEV void gemv(float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w,
	const u8* __restrict__ ws, float scale2, int sCols, int M, int N, int K, int R, int ldx, int rnd, int lrpc)
{
	__shared__ float red[8][MM]; // [warp][m]
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int ls = 3 - lrpc; // log2(warps per row)
	const int o = (blockIdx.x << lrpc) + (warp >> ls), j = warp & ((1 << ls) - 1);
	const int sl = (((K - 1) >> ls) + 8) & ~7; // ceil(K / 2^ls) rounded up to 8
	const int kb = min(K, j * sl), ke = min(K, kb + sl);
	float acc[MM];
#pragma unroll
	for (int m = 0; m < MM; m++) acc[m] = 0.f;
	if (o < N) {
		const float* xg = x + (size_t)(o / R) * K;
		if (F == 0) gemv_slice<F, MM>(acc, w + (size_t)o * K * 4, ws, xg, scale2, M, ldx, kb, ke, lane);
		if (F == 1) gemv_slice<F, MM>(acc, w + (size_t)o * K * 2, ws, xg, scale2, M, ldx, kb, ke, lane);
		if (F == 2) gemv_slice<F, MM>(acc, w + (size_t)o * K, ws + (size_t)(o / 128) * sCols, xg, scale2, M, ldx, kb, ke, lane);
		if (F >= 3) gemv_slice<F, MM>(acc, w + (size_t)o * (K / 2), ws + (size_t)o * sCols, xg, scale2, M, ldx, kb, ke, lane);
	}
	// Every thread reaches the barrier; rows past N only add zeros to red.
#pragma unroll
	for (int m = 0; m < MM; m++) {
		if (m >= M) break;
		const float s = warp_sum(acc[m]);
		if (lane == 0) red[warp][m] = s;
	}
	__syncthreads();
	if (j == 0 && o < N && lane < M) {
		float s = red[warp][lane];
#pragma unroll
		for (int i = 1; i < 8; i++)
			if (i < (1 << ls)) s += red[warp + i][lane];
		y[(size_t)lane * N + o] = rnd ? bf16_to_f32(f32_to_bf16(s)) : s;
	}
}

// linear_f32's arguments (fmt picks the kernel) and lrpc.
#define GEMV_ARGS float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws, \
	int fmt, float scale2, int sCols, int M, int N, int K, int R, int ldx, int rnd, int lrpc
#define GEMV_KERNEL(name, F, MM, CTAS) \
	extern "C" __global__ void __launch_bounds__(256, CTAS) name(GEMV_ARGS) { \
		gemv<F, MM>(y, x, w, ws, scale2, sCols, M, N, K, R, ldx, rnd, lrpc); \
	}
// One kernel per weight format, for M == 1 (decode: 4 CTAs an SM, <= 64
// registers) and M <= 8 (3 CTAs, <= 80 registers), each with the registers of
// its own loop.
GEMV_KERNEL(gemv_f32_w0, 0, 8, 3)
GEMV_KERNEL(gemv_f32_w1, 1, 8, 3)
GEMV_KERNEL(gemv_f32_w2, 2, 8, 3)
GEMV_KERNEL(gemv_f32_w3, 3, 8, 3)
GEMV_KERNEL(gemv_f32_w4, 4, 8, 3)
GEMV_KERNEL(gemv1_f32_w0, 0, 1, 4)
GEMV_KERNEL(gemv1_f32_w1, 1, 1, 4)
GEMV_KERNEL(gemv1_f32_w2, 2, 1, 4)
GEMV_KERNEL(gemv1_f32_w3, 3, 1, 4)
GEMV_KERNEL(gemv1_f32_w4, 4, 1, 4)
