// FP8 block-scaled linear (spec §3.4):
//   y[m, n] = bf16( sum_kb act_scale[m, kb] * w_scale[n/128, kb] * sum_{k in kb} xq[m, k] * wq[n, k] )
// xq: e4m3 [M, K]; xs: e8m0 [M, K/128]; w: e4m3 [N, K]; ws: e8m0 [ceil(N/128), K/128];
// y: bf16 [M, N]. K % 128 == 0, N % 8 == 0.
//
// Tensor cores through mma.sync: a CTA computes a 64x128 tile with 4 warps
// (2x2, 32x64 each), K in blocks of 128 through a 2-stage cp.async pipeline.
// The products of one 128-K block accumulate in fp32 registers and are then
// promoted into the running sum with the two scales (DeepGEMM-style).
// sm_89+: m16n8k32 e4m3 MMA straight from the fp8 bytes.
// sm_80:  e4m3 -> f16 (exact, value * 2^-8) and m16n8k16 f16 MMA; the 2^16 is
//         folded into the promotion factor.
// Split K (decode: few rows, few column tiles): with part != 0, CTA z covers
// K blocks [z*kbPer, (z+1)*kbPer) and stores its fp32 sums to part[z][M][N];
// linear_fp8_reduce adds the splits in order and rounds once to bf16.
#include "common.cuh"

#define BM 64
#define BN 128
#define BK 128
#define SROW 144 // padded smem row (bytes): conflict-free 4-byte fragment loads
#define A_STAGE (BM * SROW)
#define B_STAGE (BN * SROW)
#define STAGE_BYTES (A_STAGE + B_STAGE)

DEV u32 lds32(const u8* p) { return *reinterpret_cast<const u32*>(p); }

extern "C" __global__ void __launch_bounds__(128) linear_fp8(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const u8* __restrict__ w, const u8* __restrict__ ws, int M, int N, int K,
	float* __restrict__ part, int kbPer)
{
	PDL_ENTRY();
	extern __shared__ __align__(16) u8 smem[];
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const int g = lane >> 2, c = lane & 3;
	const int wm = wid & 1, wn = wid >> 1;
	const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
	const int kb0 = part ? blockIdx.z * kbPer : 0;
	const int kb1 = part ? min(kb0 + kbPer, K / BK) : K / BK;

	auto load_stage = [&](int stage, int kb) {
		u8* As = smem + stage * STAGE_BYTES;
		u8* Bs = As + A_STAGE;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			int ch = tid + i * 128, r = ch >> 3, col = (ch & 7) * 16;
			bool ok = m0 + r < M;
			const u8* src = ok ? xq + (size_t)(m0 + r) * K + (size_t)kb * BK + col : xq;
			cp_async16(As + r * SROW + col, src, ok ? 16 : 0);
		}
#pragma unroll
		for (int i = 0; i < 8; i++) {
			int ch = tid + i * 128, r = ch >> 3, col = (ch & 7) * 16;
			bool ok = n0 + r < N;
			const u8* src = ok ? w + (size_t)(n0 + r) * K + (size_t)kb * BK + col : w;
			cp_async16(Bs + r * SROW + col, src, ok ? 16 : 0);
		}
	};

	float acc[2][8][4];
	zero_acc(acc);

	// Scale bytes, loaded one block ahead and decoded by selects: loaded at the
	// promotion behind bounds and decode branches they put dependent global
	// loads between two blocks' MMAs (seen in the SASS). Two bytes a thread
	// (fewer live registers; four held across the MMAs cost a stack): the
	// weight scale and the act scale of row rA + 8c; thread (g, c) needs rows
	// rA + 8q, q = 0..3, and gets those factors by shuffle from lane 4g + q.
	// Rows >= M read row 0 and their factor is masked to +0.
	const int kblocks = K / BK;
	const int rA = m0 + wm * 32 + g, rOwn = rA + 8 * c;
	const u32 maskOwn = rOwn < M ? ~0u : 0u;
	const u8* wsr = ws + (size_t)(n0 / 128) * kblocks;
	const u8* xsr = xs + (size_t)(rOwn < M ? rOwn : 0) * kblocks;
	u32 nw = 0u, nx = 0u;
	if (kb0 < kb1) nw = wsr[kb0], nx = xsr[kb0];

	load_stage(0, kb0);
	cp_async_commit();
	for (int kb = kb0; kb < kb1; kb++) {
		const u32 bw = nw, bx = nx;
		const int kn = min(kb + 1, kb1 - 1); // the last block reloads its own (in bounds)
		nw = wsr[kn];
		nx = xsr[kn];
		if (kb + 1 < kb1) load_stage((kb + 1 - kb0) & 1, kb + 1);
		cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();

		const u8* As = smem + ((kb - kb0) & 1) * STAGE_BYTES;
		const u8* Bs = As + A_STAGE;
		float part[2][8][4];
		zero_acc(part);

#pragma unroll
		for (int ks = 0; ks < 4; ks++) {
			u32 a[2][4];
#pragma unroll
			for (int mt = 0; mt < 2; mt++) {
				const u8* r0 = As + (wm * 32 + mt * 16 + g) * SROW + ks * 32 + 4 * c;
				a[mt][0] = lds32(r0);
				a[mt][1] = lds32(r0 + 8 * SROW);
				a[mt][2] = lds32(r0 + 16);
				a[mt][3] = lds32(r0 + 8 * SROW + 16);
			}
#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
				const u8* br = Bs + (wn * 64 + nt * 8 + g) * SROW + ks * 32 + 4 * c;
				u32 b[2] = {lds32(br), lds32(br + 16)};
#pragma unroll
				for (int mt = 0; mt < 2; mt++) {
#ifdef MM_HAVE_FP8_MMA
					mma_e4m3_16832(part[mt][nt], a[mt], b);
#else
					// Two k16 f16 MMAs over the same 32 bytes: thread c's 4 bytes map
					// to logical k {2c, 2c+1} (low pair) and {8+2c, 9+2c} (high pair)
					// identically in A and B, so the dot product is unchanged.
#pragma unroll
					for (int h = 0; h < 2; h++) {
						u32 wa0 = a[mt][2 * h], wa1 = a[mt][2 * h + 1], wb = b[h];
						u32 af[4] = {e4m3x2_to_f16x2_scaled(wa0 & 0xffffu), e4m3x2_to_f16x2_scaled(wa1 & 0xffffu),
							e4m3x2_to_f16x2_scaled(wa0 >> 16), e4m3x2_to_f16x2_scaled(wa1 >> 16)};
						u32 bf[2] = {e4m3x2_to_f16x2_scaled(wb & 0xffffu), e4m3x2_to_f16x2_scaled(wb >> 16)};
						mma_f16_16816(part[mt][nt], af, bf);
					}
#endif
				}
			}
		}

		// Promote this K block: acc += part * act_scale[row] * w_scale.
#ifdef MM_HAVE_FP8_MMA
		const float unit = 1.0f;
#else
		const float unit = 65536.0f;
#endif
		const float wsc = e8m0_to_f32_sel(bw) * unit;
		const float fOwn = __uint_as_float(__float_as_uint(e8m0_to_f32_sel(bx) * wsc) & maskOwn);
#pragma unroll
		for (int mt = 0; mt < 2; mt++) {
			const float f0 = __shfl_sync(0xffffffffu, fOwn, (lane & ~3) | (2 * mt));
			const float f1 = __shfl_sync(0xffffffffu, fOwn, (lane & ~3) | (2 * mt + 1));
#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
				acc[mt][nt][0] = fmaf(part[mt][nt][0], f0, acc[mt][nt][0]);
				acc[mt][nt][1] = fmaf(part[mt][nt][1], f0, acc[mt][nt][1]);
				acc[mt][nt][2] = fmaf(part[mt][nt][2], f1, acc[mt][nt][2]);
				acc[mt][nt][3] = fmaf(part[mt][nt][3], f1, acc[mt][nt][3]);
			}
		}
		__syncthreads(); // the stage is refilled next iteration
	}

#pragma unroll
	for (int mt = 0; mt < 2; mt++) {
		int r0 = m0 + wm * 32 + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
		for (int nt = 0; nt < 8; nt++) {
			int col = n0 + wn * 64 + nt * 8 + 2 * c;
			if (col >= N) continue;
			if (part) {
				float* pz = part + (size_t)blockIdx.z * M * N;
				if (r0 < M) *reinterpret_cast<float2*>(pz + (size_t)r0 * N + col) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
				if (r1 < M) *reinterpret_cast<float2*>(pz + (size_t)r1 * N + col) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
				continue;
			}
			if (r0 < M) *reinterpret_cast<u32*>(y + (size_t)r0 * N + col) = pack_bf16x2(acc[mt][nt][0], acc[mt][nt][1]);
			if (r1 < M) *reinterpret_cast<u32*>(y + (size_t)r1 * N + col) = pack_bf16x2(acc[mt][nt][2], acc[mt][nt][3]);
		}
	}
}

// y[r, n] = bf16(sum_z part[z][r][n]) in z order (sum_splits), for rows r in [r0, r1) of a
// [rows, N] output (rows outside are left alone: MoE rows no expert owns).
// bounds (optional) holds r0 at [0] and r1 at [E] (the MoE offsets).
extern "C" __global__ void linear_fp8_reduce(
	u16* __restrict__ y, const float* __restrict__ part, int splits, int rows, int N,
	const int* __restrict__ bounds, int E)
{
	PDL_ENTRY();
	int r0 = 0, r1 = rows;
	if (bounds) {
		r0 = min(max(bounds[0], 0), rows);
		r1 = min(max(bounds[E], r0), rows);
	}
	const size_t plane = (size_t)rows * N;
	for (size_t i = (size_t)r0 * N + blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)r1 * N; i += (size_t)gridDim.x * blockDim.x)
		y[i] = (u16)f32_to_bf16(sum_splits(part + i, plane, splits));
}

// Decode-shaped FP8 linear (M <= 16): the same function as linear_fp8 with
// the weights as the MMA's A operand (16 output rows per warp) and the tokens
// as B (one or two 8-token tiles per warp, so the weights are read once for
// all rows), both streamed from global memory straight into registers: no
// shared memory staging, two register buffers of one 128-K block each, so
// while one block is consumed the next is in flight and a warp waiting on
// its data still has two blocks outstanding.
// A CTA of W = blockDim/32 warps holds W/S row groups of 16 outputs and splits
// K into S contiguous slices over its warps; the slices are summed through
// shared memory in slice order (deterministic), so one launch does all, with
// no scratch and no reduce kernel. yf != 0: the bf16-rounded outputs are
// stored widened to fp32 there (what the fp32 backend tensors hold) instead
// of as bf16 to y, saving the widening pass.
// Inside a 128-K block the weight scale is one value per warp, so the
// physical order of K inside the block is free: thread c holds bytes
// [16c, 16c+16) and [64+16c, 80+16c) of the block (each 16-byte load of the
// warp then covers whole 32-byte sectors), 8 of them per k32 MMA, in A and B
// alike.
// fp8_dec is the work of CTA bx() of such a grid (linear_fp8_dec2 runs two
// grids as one; a functor, so that linear_fp8_dec reads blockIdx.x where it
// always did and compiles to the same SASS).
template <class BX>
DEV void fp8_dec(BX bx, u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const u8* __restrict__ w, const u8* __restrict__ ws, int M, int N, int K, int S, float* __restrict__ yf)
{
	if (threadIdx.x == 0) { // this CTA's weight rows, while the previous kernel finishes
		const int rows = (blockDim.x >> 5) / S * 16, r0 = bx() * rows;
		if (r0 < N) prefetch_l2(w + (size_t)r0 * K, (unsigned long long)min(rows, N - r0) * K);
	}
	PDL_ENTRY();
	__shared__ float red[16 * 2 * 128]; // [warp][tile][4][32] partial sums, 16 warps max
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int g = lane >> 2, c = lane & 3;
	const int R = (blockDim.x >> 5) / S, r = wid % R, s = wid / R;
	const int nkb = K / BK, per = (nkb + S - 1) / S;
	const int o0 = (bx() * R + r) * 16;
	const int oA = o0 + g, oB = oA + 8;
	const bool okA = oA < N, okB = oB < N;
	// An idle warp (rows past N) runs an empty K range but still meets the barrier.
	const int kb0 = o0 < N ? min(s * per, nkb) : nkb;
	const int kb1 = min(kb0 + per, nkb);
	// Byte offsets of this lane's rows, 32-bit (the weights are under 4 GiB)
	// to keep one 64-bit base per tensor in registers.
	const u32 offA = (u32)(okA ? oA : 0) * (u32)K + 16u * c, offB = offA + 8u * (u32)K;
	auto ld16 = [](const u8* base, u32 off) { return *reinterpret_cast<const uint4*>(base + off); };
	const u8* wsr = ws + (size_t)(o0 < N ? o0 / 128 : 0) * nkb;
	const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
	// Scale bytes, one per lane, fetched with the block's data and decoded by
	// selects (loaded after the MMAs and decoded by branches, they stalled every
	// block): lanes 0..15 the act scale of token lane (rows >= M read row 0,
	// factor masked to +0), lanes 16..31 the weight scale; the factors reach
	// the lanes that need them by shuffle.
	const int xr = lane & 15;
	const u8* scp = lane >= 16 ? wsr : xs + (size_t)(xr < M ? xr : 0) * nkb;
	const u32 scMask = xr < M ? ~0u : 0u;

	// T token tiles of 8 (T = 1 for M <= 8, else 2); sizeof picks it at compile time.
	auto run = [&](auto tag) {
		constexpr int T = sizeof(tag);
		u32 offX[T];
		bool okT[T];
		int t0[T];
#pragma unroll
		for (int t = 0; t < T; t++) {
			const int tok = t * 8 + g;
			okT[t] = tok < M;
			offX[t] = (u32)(okT[t] ? tok : 0) * (u32)K + 16u * c;
			t0[t] = t * 8 + 2 * c;
		}
		// Two buffers (index sizeof(tag) - 1, a constant so that they stay in
		// registers): weight rows A/B and tokens, two 16-byte halves each.
		uint4 bA[2][2], bB[2][2], bX[2][T][2];
		u32 bS[2];
		// Weight blocks further ahead go to L2 only (no registers): a warp then
		// has about 4 blocks of DRAM traffic in flight, and its register loads
		// see L2 latency.
		auto pf = [&](int kb) {
			if (kb >= kb1) return;
#pragma unroll
			for (int h = 0; h < 2; h++) {
				if (okA) asm volatile("prefetch.global.L2 [%0];" ::"l"(w + offA + 128u * kb + 64u * h));
				if (okB) asm volatile("prefetch.global.L2 [%0];" ::"l"(w + offB + 128u * kb + 64u * h));
			}
		};
		auto fetch = [&](auto buf, int kb) {
			constexpr int b = sizeof(buf) - 1;
			pf(kb + 4);
			bS[b] = scp[kb];
#pragma unroll
			for (int h = 0; h < 2; h++) {
				bA[b][h] = okA ? ld16(w, offA + 128u * kb + 64u * h) : zero;
				bB[b][h] = okB ? ld16(w, offB + 128u * kb + 64u * h) : zero;
#pragma unroll
				for (int t = 0; t < T; t++) bX[b][t][h] = okT[t] ? ld16(xq, offX[t] + 128u * kb + 64u * h) : zero;
			}
		};
		float acc[T][4];
#pragma unroll
		for (int t = 0; t < T; t++)
#pragma unroll
			for (int i = 0; i < 4; i++) acc[t][i] = 0.f;
		// Promote one K block: acc += (sum over the block) * act_scale * w_scale.
		auto consume = [&](auto buf, int kb) {
			constexpr int b = sizeof(buf) - 1;
			float blk[T][4];
#pragma unroll
			for (int t = 0; t < T; t++)
#pragma unroll
				for (int i = 0; i < 4; i++) blk[t][i] = 0.f;
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const uint4 &va = bA[b][j >> 1], &vb = bB[b][j >> 1];
				const bool hi = j & 1;
				const u32 a[4] = {hi ? va.z : va.x, hi ? vb.z : vb.x, hi ? va.w : va.y, hi ? vb.w : vb.y};
#pragma unroll
				for (int t = 0; t < T; t++) {
					const uint4& vx = bX[b][t][j >> 1];
					const u32 bf[2] = {hi ? vx.z : vx.x, hi ? vx.w : vx.y};
					mma_k32(blk[t], a, bf);
				}
			}
			const float d = e8m0_to_f32_sel(bS[b]);
			const float wsc = __shfl_sync(0xffffffffu, d, 16);
			const float fOwn = __uint_as_float(__float_as_uint(d * wsc) & scMask);
#pragma unroll
			for (int t = 0; t < T; t++) {
				const float x0 = __shfl_sync(0xffffffffu, fOwn, t0[t]);
				const float x1 = __shfl_sync(0xffffffffu, fOwn, t0[t] + 1);
				acc[t][0] = fmaf(blk[t][0], x0, acc[t][0]);
				acc[t][1] = fmaf(blk[t][1], x1, acc[t][1]);
				acc[t][2] = fmaf(blk[t][2], x0, acc[t][2]);
				acc[t][3] = fmaf(blk[t][3], x1, acc[t][3]);
			}
		};
		if (kb0 < kb1) fetch(char{}, kb0);
		if (kb0 + 1 < kb1) fetch(short{}, kb0 + 1);
		pf(kb0 + 2);
		pf(kb0 + 3);
		for (int kb = kb0; kb < kb1; kb += 2) {
			consume(char{}, kb);
			if (kb + 2 < kb1) fetch(char{}, kb + 2);
			if (kb + 1 < kb1) {
				consume(short{}, kb + 1);
				if (kb + 3 < kb1) fetch(short{}, kb + 3);
			}
		}

		// Slice s > 0 hands its sums to slice 0 of its row group, which adds
		// them in slice order.
		if (S > 1) {
			if (s > 0) {
#pragma unroll
				for (int t = 0; t < T; t++)
#pragma unroll
					for (int i = 0; i < 4; i++) red[(wid * 2 + t) * 128 + i * 32 + lane] = acc[t][i];
			}
			__syncthreads();
			if (s > 0) return;
			for (int q = 1; q < S; q++) {
				const int wq = q * R + r;
#pragma unroll
				for (int t = 0; t < T; t++)
#pragma unroll
					for (int i = 0; i < 4; i++) acc[t][i] += red[(wq * 2 + t) * 128 + i * 32 + lane];
			}
		}
#pragma unroll
		for (int t = 0; t < T; t++) {
			const int os[4] = {oA, oA, oB, oB}, ts[4] = {t0[t], t0[t] + 1, t0[t], t0[t] + 1};
#pragma unroll
			for (int i = 0; i < 4; i++)
				if (os[i] < N && ts[i] < M) {
					const u32 v = f32_to_bf16(acc[t][i]);
					if (yf) yf[(size_t)ts[i] * N + os[i]] = bf16_to_f32(v);
					else y[(size_t)ts[i] * N + os[i]] = (u16)v;
				}
		}
	};
	if (M <= 8) run(char{});
	else run(short{});
}

extern "C" __global__ void __launch_bounds__(512) linear_fp8_dec(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const u8* __restrict__ w, const u8* __restrict__ ws, int M, int N, int K, int S, float* __restrict__ yf)
{
	fp8_dec([] { return (int)blockIdx.x; }, y, xq, xs, w, ws, M, N, K, S, yf);
}

// Two linear_fp8_dec launches on one input (same M, K and CTA size; each
// its own N, S and weights) as one: CTAs [0, ctas0) are the first grid's,
// the rest the second's, each doing exactly what it does in its own launch
// (one launch and one ramp instead of two).
extern "C" __global__ void __launch_bounds__(512) linear_fp8_dec2(
	const u8* __restrict__ xq, const u8* __restrict__ xs, int M, int K, int ctas0,
	u16* y0, const u8* w0, const u8* ws0, int N0, int S0, float* yf0,
	u16* y1, const u8* w1, const u8* ws1, int N1, int S1, float* yf1)
{
	const bool b = blockIdx.x >= ctas0;
	const int bx = b ? blockIdx.x - ctas0 : blockIdx.x;
	fp8_dec([bx] { return bx; }, b ? y1 : y0, xq, xs, b ? w1 : w0, b ? ws1 : ws0, M, b ? N1 : N0,
		K, b ? S1 : S0, b ? yf1 : yf0);
}
