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
#pragma unroll
	for (int i = 0; i < 2; i++)
#pragma unroll
		for (int j = 0; j < 8; j++)
#pragma unroll
			for (int k = 0; k < 4; k++) acc[i][j][k] = 0.f;

	load_stage(0, kb0);
	cp_async_commit();
	for (int kb = kb0; kb < kb1; kb++) {
		if (kb + 1 < kb1) load_stage((kb + 1 - kb0) & 1, kb + 1);
		cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();

		const u8* As = smem + ((kb - kb0) & 1) * STAGE_BYTES;
		const u8* Bs = As + A_STAGE;
		float part[2][8][4];
#pragma unroll
		for (int i = 0; i < 2; i++)
#pragma unroll
			for (int j = 0; j < 8; j++)
#pragma unroll
				for (int k = 0; k < 4; k++) part[i][j][k] = 0.f;

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
		const int kblocks = K / BK;
		const float wsc = e8m0_to_f32(ws[(size_t)(n0 / 128) * kblocks + kb]) * unit;
#pragma unroll
		for (int mt = 0; mt < 2; mt++) {
			int r0 = m0 + wm * 32 + mt * 16 + g, r1 = r0 + 8;
			float f0 = r0 < M ? e8m0_to_f32(xs[(size_t)r0 * kblocks + kb]) * wsc : 0.f;
			float f1 = r1 < M ? e8m0_to_f32(xs[(size_t)r1 * kblocks + kb]) * wsc : 0.f;
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

// y[r, n] = bf16(sum_z part[z][r][n]) in z order, for rows r in [r0, r1) of a
// [rows, N] output (rows outside are left alone: MoE rows no expert owns).
// bounds (optional) holds r0 at [0] and r1 at [E] (the MoE offsets).
extern "C" __global__ void linear_fp8_reduce(
	u16* __restrict__ y, const float* __restrict__ part, int splits, int rows, int N,
	const int* __restrict__ bounds, int E)
{
	int r0 = 0, r1 = rows;
	if (bounds) {
		r0 = min(max(bounds[0], 0), rows);
		r1 = min(max(bounds[E], r0), rows);
	}
	const size_t plane = (size_t)rows * N;
	for (size_t i = (size_t)r0 * N + blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)r1 * N; i += (size_t)gridDim.x * blockDim.x) {
		float a = 0.f;
		for (int z = 0; z < splits; z++) a += part[z * plane + i];
		y[i] = (u16)f32_to_bf16(a);
	}
}

// Decode-shaped FP8 linear (M <= 16): the same function as linear_fp8 with
// the weights as the MMA's A operand (16 output rows per warp, 64 per CTA)
// and 8 tokens per CTA row as B, both streamed from global memory straight
// into registers (no shared memory; a register double buffer keeps the next
// 128-K block in flight). Inside a 128-K block the weight scale is one value
// per warp, so the physical order of K inside the block is free: thread c
// holds bytes [32c, 32c+32) of the block, 8 of them per k32 MMA, in A and B
// alike. Split K as linear_fp8 (part, kbPer).
extern "C" __global__ void __launch_bounds__(128) linear_fp8_dec(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const u8* __restrict__ w, const u8* __restrict__ ws, int M, int N, int K,
	float* __restrict__ part, int kbPer)
{
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int g = lane >> 2, c = lane & 3;
	const int o0 = blockIdx.x * 64 + wid * 16;
	const int oA = o0 + g, oB = oA + 8;
	const bool okA = oA < N, okB = oB < N;
	const int m0 = blockIdx.y * 8;
	const int tokB = m0 + g;
	const bool okT = tokB < M;
	const int nkb = K / BK;
	const int kb0 = part ? blockIdx.z * kbPer : 0;
	const int kb1 = part ? min(kb0 + kbPer, nkb) : nkb;
	if (o0 >= N) return;
	const uint4* wA = reinterpret_cast<const uint4*>(w + (size_t)(okA ? oA : 0) * K + 32 * c);
	const uint4* wB = reinterpret_cast<const uint4*>(w + (size_t)(okB ? oB : 0) * K + 32 * c);
	const uint4* xr = reinterpret_cast<const uint4*>(xq + (size_t)(okT ? tokB : 0) * K + 32 * c);
	const u8* wsr = ws + (size_t)(o0 / 128) * nkb;
	const int t0 = m0 + 2 * c, t1 = t0 + 1;
	const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
	uint4 nA[2], nB[2], nX[2];
	auto fetch = [&](int kb) {
#pragma unroll
		for (int h = 0; h < 2; h++) {
			nA[h] = okA ? wA[(size_t)kb * 8 + h] : zero;
			nB[h] = okB ? wB[(size_t)kb * 8 + h] : zero;
			nX[h] = okT ? xr[(size_t)kb * 8 + h] : zero;
		}
	};
	float acc[4] = {0.f, 0.f, 0.f, 0.f};
	if (kb0 < kb1) fetch(kb0);
	for (int kb = kb0; kb < kb1; kb++) {
		const uint4 cA[2] = {nA[0], nA[1]}, cB[2] = {nB[0], nB[1]}, cX[2] = {nX[0], nX[1]};
		if (kb + 1 < kb1) fetch(kb + 1);
		float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
		for (int j = 0; j < 4; j++) {
			const uint4 &va = cA[j >> 1], &vb = cB[j >> 1], &vx = cX[j >> 1];
			const bool hi = j & 1;
			const u32 a[4] = {hi ? va.z : va.x, hi ? vb.z : vb.x, hi ? va.w : va.y, hi ? vb.w : vb.y};
			const u32 b[2] = {hi ? vx.z : vx.x, hi ? vx.w : vx.y};
			mma_k32(blk, a, b);
		}
		const float wsc = e8m0_to_f32(wsr[kb]);
		const float x0 = t0 < M ? e8m0_to_f32(xs[(size_t)t0 * nkb + kb]) * wsc : 0.f;
		const float x1 = t1 < M ? e8m0_to_f32(xs[(size_t)t1 * nkb + kb]) * wsc : 0.f;
		acc[0] = fmaf(blk[0], x0, acc[0]);
		acc[1] = fmaf(blk[1], x1, acc[1]);
		acc[2] = fmaf(blk[2], x0, acc[2]);
		acc[3] = fmaf(blk[3], x1, acc[3]);
	}
	const int os[4] = {oA, oA, oB, oB}, ts[4] = {t0, t1, t0, t1};
#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (os[i] >= N || ts[i] >= M) continue;
		if (part) part[((size_t)blockIdx.z * M + ts[i]) * N + os[i]] = acc[i];
		else y[(size_t)ts[i] * N + os[i]] = (u16)f32_to_bf16(acc[i]);
	}
}
