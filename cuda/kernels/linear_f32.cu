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
	PDL_ENTRY();
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
	PDL_ENTRY();
	const int e = blockIdx.z;
	const int lo = offsets[e], hi = offsets[e + 1];
	const int m0 = lo + blockIdx.y * TM;
	if (m0 >= hi) return;
	const float scale2 = gscale ? gscale[e] : 1.0f;
	tile_f32(y, x, w + e * wStride, ws + e * sStride, fmt, scale2, sCols, m0, hi, blockIdx.x * TN, N, N, K, K, 0);
}

// ---- Decode GEMV ----
DEV float e4m3_to_f32_fast(u32 b) {
	float v[4];
	e4m3x4_to_f32(b & 0xffu, v);
	return v[0];
}
// Eight e2m1 nibbles (nibble i = weight i) -> v[0..8). Nibbles i and i+4 go
// to the halves of an f16x2 as sign<<15 | (q&7)<<9, the f16 of e2m1(q)*2^-14
// (exponent and mantissa bits map one to one; exponent 0 is the f16
// subnormal 0.5*2^-14), then times 2^14 in f16 (exact: a power of two, the
// result at most 6), then f16 -> f32.
DEV void e2m1x8_to_f32(u32 r, float* v) {
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const u32 m = i < 3 ? r << (9 - 4 * i) : r >> 3, s = r << (12 - 4 * i);
		u32 h = (m & 0x0e000e00u) | (s & 0x80008000u);
		asm("mul.rn.f16x2 %0, %0, %1;\n" : "+r"(h) : "r"(0x74007400u)); // 2^14
		f16x2_to_f32(h, v[i], v[i + 4]);
	}
}

// Per format F, in units of 8 weights (k % 8 == 0): UW 32-bit words a unit,
// U units a lane loads per step (64 bytes for f32/bf16/FP8, 32 for FP4: its
// per-unit scale bytes take a register each). Lane l's unit u of a step at
// k0 is k0 + u*256 + l*8: each load instruction of a warp reads one
// contiguous run. A unit never straddles a scale block (128, 32 or 16
// weights, all multiples of 8), so it has one scale. FP8's scales are
// loaded once a step by the warp (SC = 1: lane l holds the byte of 128-block
// k0/128 + l; a step of 2048 weights spans at most 17 blocks) and handed to
// the units by shuffles; FP4 loads one scale byte a unit (SC = U).
template <int F> struct GV {
	static constexpr int UW = F == 0 ? 8 : F == 1 ? 4 : F == 2 ? 2 : 1;
	static constexpr int U = F == 0 ? 2 : F == 1 ? 4 : 8;
	static constexpr int SC = F == 2 ? 1 : F >= 3 ? U : 0;
};

// The registers of one step: weights, scale bytes.
template <int F> struct GBuf {
	u32 r[GV<F>::U][GV<F>::UW];
	u32 s[GV<F>::SC > 0 ? GV<F>::SC : 1];
};

// A lane's pointers for the step at k0 (of a slice that ends at kend): wq
// to the weights of its unit 0 (k0 + lane*8), sq to its scale byte (FP8:
// that of 128-block k0/128 + lane, lanes past the slice's last block take
// that block's: any lane loads one, no predicate; FP4: that of its unit 0,
// unit u's is 8u or 16u bytes on). A step moves them WSTEP and SSTEP bytes.
template <int F> struct GP {
	static constexpr int STEP = GV<F>::U * 256;
	static constexpr int WSTEP = F == 0 ? STEP * 4 : F == 1 ? STEP * 2 : F == 2 ? STEP : STEP / 2;
	static constexpr int SSTEP = F == 2 ? STEP / 128 : F == 3 ? STEP / 32 : STEP / 16;
	static __device__ __forceinline__ const u8* w(const u8* wr, int k0, int lane) {
		const int k = k0 + lane * 8;
		return F == 0 ? wr + (size_t)k * 4 : F == 1 ? wr + (size_t)k * 2 : F == 2 ? wr + k : wr + k / 2;
	}
	static __device__ __forceinline__ const u8* s(const u8* sr, int k0, int kend, int lane) {
		const int k = k0 + lane * 8;
		return F == 2 ? sr + (k0 >> 7) + min(lane, ((kend - 1) >> 7) - (k0 >> 7)) : F == 3 ? sr + k / 32 : sr + k / 16;
	}
};

// gload_unit issues the loads of unit u of a step (for FP4 its scale byte
// too; FP8's per-step byte is gload_step's).
template <int F> DEV void gload_unit(GBuf<F>& b, int u, const u8* wq, const u8* sq) {
	if (F == 0) {
		const uint4 x0 = ldw16(wq + u * 1024), x1 = ldw16(wq + u * 1024 + 16);
		b.r[u][0] = x0.x; b.r[u][1] = x0.y; b.r[u][2] = x0.z; b.r[u][3] = x0.w;
		b.r[u][4] = x1.x; b.r[u][5] = x1.y; b.r[u][6] = x1.z; b.r[u][7] = x1.w;
	} else if (F == 1) {
		const uint4 x0 = ldw16(wq + u * 512);
		b.r[u][0] = x0.x; b.r[u][1] = x0.y; b.r[u][2] = x0.z; b.r[u][3] = x0.w;
	} else if (F == 2) {
		const uint2 x0 = ldw8(wq + u * 256);
		b.r[u][0] = x0.x; b.r[u][1] = x0.y;
	} else {
		// unit u's 256 weights on: 128 bytes, 8 (per 32) or 16 (per 16) scales
		b.r[u][0] = ldw4(wq + u * 128);
		b.s[F >= 3 ? u : 0] = lds1(sq + u * (F == 3 ? 8 : 16));
	}
}

// gload_step issues the loads of a step: units u with u*256 < lim (when CHK;
// all otherwise), and for FP8 the lane's scale byte.
template <int F, bool CHK> DEV void gload_step(GBuf<F>& b, const u8* wq, const u8* sq, int lim) {
#pragma unroll
	for (int u = 0; u < GV<F>::U; u++)
		if (!CHK || u * 256 < lim) gload_unit<F>(b, u, wq, sq);
	if (F == 2) b.s[0] = lds1(sq);
}

// gfma dequantises a unit exactly as wload does (times scale sc for FP8)
// and accumulates it against x[m, k..k+8) (xk = &x[0, k]) for the M <= MM
// rows.
template <int F, int MM> DEV void gfma(const u32* r, u32 s, float sc, float scale2, const float* xk, int ldx, int M, float* acc) {
	float v[8];
	if (F == 0) {
#pragma unroll
		for (int i = 0; i < 8; i++) v[i] = __uint_as_float(r[i]);
	} else if (F == 1) {
#pragma unroll
		for (int i = 0; i < 4; i++) { v[2 * i] = __uint_as_float(r[i] << 16); v[2 * i + 1] = __uint_as_float(r[i] & 0xffff0000u); }
	} else if (F == 2) {
		e4m3x4_to_f32(r[0], v);
		e4m3x4_to_f32(r[1], v + 4);
#pragma unroll
		for (int i = 0; i < 8; i++) v[i] *= sc;
	} else {
		const float su = F == 3 ? e8m0_to_f32_sel(s) : e4m3_to_f32_fast(s) * scale2;
		e2m1x8_to_f32(r[0], v);
#pragma unroll
		for (int i = 0; i < 8; i++) v[i] *= su;
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

// gmath_step accumulates the step that gload_step loaded into b, xq =
// &x[0, k0 + lane*8]; units u with u*256 >= lim are skipped when CHK. The
// whole warp runs it (FP8's shuffles): unit u of lane l is in 128-block
// (k0 + u*256 + l*8)/128 = k0/128 + d + 2u, d = (k0%128 + l*8)/128 (0..2),
// whose scale lane d + 2u holds. (The shuffle reads only bits 0..4 of the
// lane: the loop passes d + 32n, so that d + 2u is not hoisted out of it
// into 8 registers.)
template <int F, int MM, bool CHK> DEV void gmath_step(const GBuf<F>& b, const float* xq, float scale2, int M, int ldx,
	int lim, int d, float* acc)
{
	constexpr int U = GV<F>::U;
	const float sl = F == 2 ? e8m0_to_f32_sel(b.s[0]) : 0.f;
#pragma unroll
	for (int u = 0; u < U; u++) {
		const float sc = F == 2 ? __shfl_sync(0xffffffffu, sl, d + 2 * u) : 0.f;
		if (!CHK || u * 256 < lim) gfma<F, MM>(b.r[u], b.s[F >= 3 ? u : 0], sc, scale2, xq + u * 256, ldx, M, acc);
	}
}

// gemv_slice accumulates weights [kb, ke) of one row into this lane's acc:
// first the ragged rem = (ke-kb) % (U*256) weights (loads checked), then whole
// steps of U*256, software-pipelined over two register buffers so that the
// loads of the next step are in flight while this step's FMAs run. The
// whole warp runs it.
template <int F, int MM> DEV void gemv_slice(float* acc, const u8* wr, const u8* sr, const float* xg, float scale2,
	int M, int ldx, int kb, int ke, int lane)
{
	using P = GP<F>;
	GBuf<F> ba, bb;
	const int kf = kb + (ke - kb) % P::STEP; // whole steps cover [kf, ke)
	int n = (ke - kf) / P::STEP;
	const int lim = kf - kb - lane * 8; // the tail's units u < lim/256 of this lane
	if (kb < kf) gload_step<F, true>(bb, P::w(wr, kb, lane), P::s(sr, kb, kf, lane), lim);
	const u8* wq = P::w(wr, kf, lane);
	const u8* sq = P::s(sr, kf, kf + P::STEP, lane); // the same lane clamp for every whole step
	const float* xq = xg + kf + lane * 8;
	const int d = ((kf & 127) + lane * 8) >> 7;
	if (n > 0) gload_step<F, false>(ba, wq, sq, 0);
	if (kb < kf) gmath_step<F, MM, true>(bb, xg + kb + lane * 8, scale2, M, ldx, lim, ((kb & 127) + lane * 8) >> 7, acc);
	while (n > 0) {
		if (n > 1) gload_step<F, false>(bb, wq + P::WSTEP, sq + P::SSTEP, 0);
		gmath_step<F, MM, false>(ba, xq, scale2, M, ldx, 0, d + (n << 5), acc);
		if (--n == 0) break;
		wq += P::WSTEP; sq += P::SSTEP; xq += P::STEP;
		if (n > 1) gload_step<F, false>(ba, wq + P::WSTEP, sq + P::SSTEP, 0);
		gmath_step<F, MM, false>(bb, xq, scale2, M, ldx, 0, d + (n << 5), acc);
		--n;
		wq += P::WSTEP; sq += P::SSTEP; xq += P::STEP;
	}
}

// gstep_roll is gmath_step for one register buffer: each unit's registers,
// once its FMAs are issued, take the loads of the same unit of the next
// step (at wn, sn) when nxt, so that a whole step's bytes stay in flight.
// (ptxas may still issue a refill late in the step: it hoists the x loads
// of the next units first, and the refills wait for their registers.)
template <int F, int MM, bool CHK> DEV void gstep_roll(GBuf<F>& b, const float* xq, float scale2, int M, int ldx,
	int lim, int d, bool nxt, const u8* wn, const u8* sn, float* acc)
{
	constexpr int U = GV<F>::U;
	const float sl = F == 2 ? e8m0_to_f32_sel(b.s[0]) : 0.f;
	if (F == 2 && nxt) b.s[0] = lds1(sn);
#pragma unroll
	for (int u = 0; u < U; u++) {
		const float sc = F == 2 ? __shfl_sync(0xffffffffu, sl, d + 2 * u) : 0.f;
		if (!CHK || u * 256 < lim) gfma<F, MM>(b.r[u], b.s[F >= 3 ? u : 0], sc, scale2, xq + u * 256, ldx, M, acc);
		if (nxt) gload_unit<F>(b, u, wn, sn);
	}
}

// gemv_slice_roll is gemv_slice with one rolling register buffer (FP8,
// FP4: the registers their dequantisation needs stay free).
template <int F, int MM> DEV void gemv_slice_roll(float* acc, const u8* wr, const u8* sr, const float* xg, float scale2,
	int M, int ldx, int kb, int ke, int lane)
{
	using P = GP<F>;
	GBuf<F> b;
	const int kf = kb + (ke - kb) % P::STEP; // whole steps cover [kf, ke)
	int n = (ke - kf) / P::STEP;
	const u8* wq = P::w(wr, kf, lane);
	const u8* sq = P::s(sr, kf, kf + P::STEP, lane); // the same lane clamp for every whole step
	const float* xq = xg + kf + lane * 8;
	const int d = ((kf & 127) + lane * 8) >> 7;
	if (kb < kf) {
		const int lim = kf - kb - lane * 8; // the tail's units u < lim/256 of this lane
		gload_step<F, true>(b, P::w(wr, kb, lane), P::s(sr, kb, kf, lane), lim);
		gstep_roll<F, MM, true>(b, xg + kb + lane * 8, scale2, M, ldx, lim, ((kb & 127) + lane * 8) >> 7, n > 0, wq, sq, acc);
	} else if (n > 0) {
		gload_step<F, false>(b, wq, sq, 0);
	}
	for (; n > 0; n--) {
		gstep_roll<F, MM, false>(b, xq, scale2, M, ldx, 0, d + (n << 5), n > 1, wq + P::WSTEP, sq + P::SSTEP, acc);
		wq += P::WSTEP; sq += P::SSTEP; xq += P::STEP;
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
		if (F == 2) gemv_slice_roll<F, MM>(acc, w + (size_t)o * K, ws + (size_t)(o / 128) * sCols, xg, scale2, M, ldx, kb, ke, lane);
		if (F >= 3) gemv_slice_roll<F, MM>(acc, w + (size_t)o * (K / 2), ws + (size_t)o * sCols, xg, scale2, M, ldx, kb, ke, lane);
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

// The CTA's weight rows to L2 before its PDL wait (weights only).
template <int F> DEV void gemv_prefetch(const u8* w, int N, int K, int lrpc) {
	const int o0 = blockIdx.x << lrpc;
	if (threadIdx.x != 0 || o0 >= N) return;
	const size_t rb = F == 0 ? (size_t)K * 4 : F == 1 ? (size_t)K * 2 : F == 2 ? (size_t)K : (size_t)K / 2;
	prefetch_l2(w + o0 * rb, min(1 << lrpc, N - o0) * rb);
}

// linear_f32's arguments (fmt picks the kernel) and lrpc.
#define GEMV_ARGS float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws, \
	int fmt, float scale2, int sCols, int M, int N, int K, int R, int ldx, int rnd, int lrpc
#define GEMV_KERNEL(name, F, MM, CTAS) \
	extern "C" __global__ void __launch_bounds__(256, CTAS) name(GEMV_ARGS) { \
		gemv_prefetch<F>(w, N, K, lrpc); \
		PDL_ENTRY(); \
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

// ---- Decode GEMV, several output rows a warp (bf16 weights) ----
// gemv<F, MM> loads x once per output row: at 2-8 rows its x loads (8M L1
// wavefronts per 256 weights of a row, against 4 for the weights) bound it,
// not the weights. gemvr<MM, RW, NB> has each warp stream RW output rows of
// one K slice, so that an x value loaded serves RW rows. Each (row m,
// output o) sum is gemv<1, 1>'s bit for bit at the same lrpc: the same K
// slices; lane l's fmaf(x, w, acc) over the tail's units (those
// gemv_slice's checked step takes), then the whole steps' units, in order;
// warp_sum; the slices added in slice order.

// gemvr_cvt widens one unit (8 bf16 weights, 4 words) of each row.
template <int RW> DEV void gemvr_cvt(const u32 (&r)[RW][4], float (&v)[RW][8]) {
#pragma unroll
	for (int q = 0; q < RW; q++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			v[q][2 * i] = __uint_as_float(r[q][i] << 16);
			v[q][2 * i + 1] = __uint_as_float(r[q][i] & 0xffff0000u);
		}
}

// gemvr_fma accumulates a unit's weights v against x[m, k..k+8) (xk =
// &x[0, k]) for the M <= MM rows, in gfma's order.
template <int MM, int RW> DEV void gemvr_fma(const float (&v)[RW][8], const float* xk, int ldx, int M, float (&acc)[RW][MM]) {
#pragma unroll
	for (int m = 0; m < MM; m++) {
		if (m >= M) break;
		const float4* xp = reinterpret_cast<const float4*>(xk + (size_t)m * ldx);
		const float4 a = xp[0], b = xp[1];
#pragma unroll
		for (int q = 0; q < RW; q++) {
			float t = acc[q][m];
			t = fmaf(a.x, v[q][0], t); t = fmaf(a.y, v[q][1], t); t = fmaf(a.z, v[q][2], t); t = fmaf(a.w, v[q][3], t);
			t = fmaf(b.x, v[q][4], t); t = fmaf(b.y, v[q][5], t); t = fmaf(b.z, v[q][6], t); t = fmaf(b.w, v[q][7], t);
			acc[q][m] = t;
		}
	}
}

// gemvr_load issues the loads of one unit at k of each row (wr[q]: row q).
template <int RW> DEV void gemvr_load(u32 (&r)[RW][4], const u8* const (&wr)[RW], int k) {
#pragma unroll
	for (int q = 0; q < RW; q++) {
		const uint4 t = ldw16(wr[q] + (size_t)k * 2);
		r[q][0] = t.x; r[q][1] = t.y; r[q][2] = t.z; r[q][3] = t.w;
	}
}

// gemvr_slice accumulates weights [kb, ke) of RW rows into this lane's
// acc. The lane's units, in gemv_slice's order: nt tail units at kb +
// t*256 + lane*8 (t*256 < lim), then kf + (t-nt)*256 + lane*8. NB register
// buffers: a unit's loads are issued NB units ahead, as soon as the buffer
// they reuse is widened.
template <int MM, int RW, int NB> DEV void gemvr_slice(float (&acc)[RW][MM], const u8* const (&wr)[RW], const float* xg,
	int M, int ldx, int kb, int ke, int lane)
{
	const int kf = kb + (ke - kb) % GP<1>::STEP;
	const int lim = kf - kb - lane * 8;
	const int nt = lim > 0 ? (lim + 255) >> 8 : 0;
	const int T = nt + ((ke - kf) >> 8);
#define GEMVR_K(t) (((t) < nt ? kb + ((t) << 8) : kf + (((t) - nt) << 8)) + lane * 8)
	u32 ra[RW][4], rb[RW][4];
	float v[RW][8];
	if (NB == 1) {
		if (T > 0) gemvr_load<RW>(ra, wr, GEMVR_K(0));
		for (int t = 0; t < T; t++) {
			gemvr_cvt<RW>(ra, v);
			if (t + 1 < T) gemvr_load<RW>(ra, wr, GEMVR_K(t + 1));
			gemvr_fma<MM, RW>(v, xg + GEMVR_K(t), ldx, M, acc);
		}
	} else {
		if (T > 0) gemvr_load<RW>(ra, wr, GEMVR_K(0));
		if (T > 1) gemvr_load<RW>(rb, wr, GEMVR_K(1));
		for (int t = 0; t < T; t += 2) {
			gemvr_cvt<RW>(ra, v);
			if (t + 2 < T) gemvr_load<RW>(ra, wr, GEMVR_K(t + 2));
			gemvr_fma<MM, RW>(v, xg + GEMVR_K(t), ldx, M, acc);
			if (t + 1 >= T) break;
			gemvr_cvt<RW>(rb, v);
			if (t + 3 < T) gemvr_load<RW>(rb, wr, GEMVR_K(t + 3));
			gemvr_fma<MM, RW>(v, xg + GEMVR_K(t + 1), ldx, M, acc);
		}
	}
#undef GEMVR_K
}

// gemvr: y[m, o] for M <= MM rows, bf16 weights, groups of R output rows
// (R % RW == 0: a warp's rows share their x columns). A CTA of 8 warps
// takes RW << lrpc output rows: warp w streams K slice j = w % 2^ls of
// rows o0 + [0, RW), o0 = (blockIdx.x << lrpc | w >> ls) * RW, ls = 3 -
// lrpc (gemv's slices). Rows past N load row N-1 and are not written.
// Weights only are read before PDL_ENTRY.
template <int MM, int RW, int NB> DEV void gemvr(float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w,
	int M, int N, int K, int R, int ldx, int rnd, int lrpc)
{
	__shared__ float red[8][RW][MM]; // [warp][row q][m]
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int ls = 3 - lrpc;
	const int o0 = ((blockIdx.x << lrpc) + (warp >> ls)) * RW, j = warp & ((1 << ls) - 1);
	const int sl = (((K - 1) >> ls) + 8) & ~7;
	const int kb = min(K, j * sl), ke = min(K, kb + sl);
	const u8* wr[RW];
#pragma unroll
	for (int q = 0; q < RW; q++) wr[q] = w + (size_t)min(o0 + q, N - 1) * K * 2;
	// The first half of each row's slice to L2 before the PDL wait: at most
	// 128 KB a CTA (32 head rows), the bytes gemv1's 4 CTAs an SM ask for
	// (the whole rows of 2 CTAs, 512 KB an SM, would be more than L2 holds
	// over all SMs).
	if (lane == 0)
#pragma unroll
		for (int q = 0; q < RW; q++)
			if (o0 + q < N) prefetch_l2(wr[q] + (size_t)kb * 2, (ke - kb) & ~15);
	PDL_ENTRY();
	float acc[RW][MM];
#pragma unroll
	for (int q = 0; q < RW; q++)
#pragma unroll
		for (int m = 0; m < MM; m++) acc[q][m] = 0.f;
	if (o0 < N) gemvr_slice<MM, RW, NB>(acc, wr, x + (size_t)(o0 / R) * K, M, ldx, kb, ke, lane);
	// Every thread reaches the barrier; warps past N only add zeros to red.
#pragma unroll
	for (int q = 0; q < RW; q++)
#pragma unroll
		for (int m = 0; m < MM; m++) {
			if (m >= M) break;
			const float s = warp_sum(acc[q][m]);
			if (lane == 0) red[warp][q][m] = s;
		}
	__syncthreads();
	const int q = lane / M, m = lane - q * M; // RW * M <= 32
	if (j == 0 && q < RW && o0 + q < N) {
		float s = red[warp][q][m];
#pragma unroll
		for (int i = 1; i < 8; i++)
			if (i < (1 << ls)) s += red[warp + i][q][m];
		y[(size_t)m * N + o0 + q] = rnd ? bf16_to_f32(f32_to_bf16(s)) : s;
	}
}

#define GEMVR_ARGS float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w, \
	int M, int N, int K, int R, int ldx, int rnd, int lrpc
#define GEMVR_KERNEL(name, MM, RW, NB) \
	extern "C" __global__ void __launch_bounds__(256, 2) name(GEMVR_ARGS) { \
		gemvr<MM, RW, NB>(y, x, w, M, N, K, R, ldx, rnd, lrpc); \
	}
// The planner's picks and the variants bench kernels times (kernels_f32.go:
// gemvRowsKernels): rows MM, RW output rows a warp, NB weight buffers.
GEMVR_KERNEL(gemvr_m2_r4_b2, 2, 4, 2)
GEMVR_KERNEL(gemvr_m2_r4_b1, 2, 4, 1)
GEMVR_KERNEL(gemvr_m2_r2_b2, 2, 2, 2)
GEMVR_KERNEL(gemvr_m4_r4_b2, 4, 4, 2)
GEMVR_KERNEL(gemvr_m4_r4_b1, 4, 4, 1)
GEMVR_KERNEL(gemvr_m4_r2_b2, 4, 2, 2)
GEMVR_KERNEL(gemvr_m8_r4_b1, 8, 4, 1)
GEMVR_KERNEL(gemvr_m8_r2_b2, 8, 2, 2)
