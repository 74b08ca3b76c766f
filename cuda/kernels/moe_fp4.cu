// MoE grouped GEMM over FP4 (e2m1) expert weights (spec §3.4 FP4 expert
// linear; §9 NVFP4). Rows are already permuted: expert e owns rows
// [off[e], off[e+1]). For each such row m and output column n:
//   y[m, n] = bf16( G_e * sum_kb act_scale[m, kb] * sum_{k in kb} xq[m, k] * W_e[n, k] )
// with W_e[n, k] = e2m1(code) * s, s = 2^(e8m0-127) per 32 K (MXFP4) or
// e4m3 per 16 K (NVFP4, G_e = the fp32 per-expert global scale; MXFP4 G_e = 1).
// xq: e4m3 [Mtot, K]; xs: e8m0 [Mtot, K/128]; w: [E][N][K/2] (element 2i in
// the low nibble); wscale: [E][N][K/32] e8m0 or [E][N][K/16] e4m3; y: bf16 [Mtot, N].
//
// moe_tile_map turns the offsets into a list of bm-row tiles (64 here, 8 for
// moe_fp4_dec; experts with no rows produce none); moe_fp4_gemm runs one CTA per (tile, 128 columns) and
// exits at once past the list, so empty experts cost nothing and rows outside
// every range are never written.
//
// Split K (decode): with part != 0, CTA z covers K blocks [z*kbPer,
// (z+1)*kbPer) and stores fp32 sums (times G_e) to part[z][Mtot][N];
// linear_fp8_reduce adds the splits in order over the owned rows.
//
// Unpacking: fp4 * scale has at most 2+4 significant bits, so it is exact in
// bf16; e4m3 activations are exact in bf16 too. The MMA is m16n8k16 bf16 with
// fp32 accumulation, promoted per 128-K block by the activation scale.
#include "moe_route.cuh"

#define BM 64
#define BN 128
#define BK 128
#define AROW 144 // fp8 activation row in smem (bytes, padded)
#define BROW 80  // packed fp4 weight row in smem: 64 bytes + 16 pad
#define A_STAGE (BM * AROW)
#define B_STAGE (BN * BROW)
#define S_STAGE (BN * 8 * 4) // up to 8 fp32 scales per row per 128-K block
#define STAGE_BYTES (A_STAGE + B_STAGE + S_STAGE)

// Tile list layout (tile_map_block): int count at [0]; int4 tiles {expert,
// row_begin, row_end, 0} from byte 16.
extern "C" __global__ void __launch_bounds__(1024) moe_tile_map(
	const int* __restrict__ offsets, int E, int Mtot, int* __restrict__ scratch, int maxTiles, int bm)
{
	PDL_ENTRY();
	__shared__ int warpSums[32];
	tile_map_block(offsets, E, Mtot, scratch, maxTiles, bm, warpSums);
}

DEV u32 lds32(const u8* p) { return *reinterpret_cast<const u32*>(p); }
DEV u32 lds16(const u8* p) { return *reinterpret_cast<const u16*>(p); }

// One packed byte (2 codes) times scale s -> bf16x2 (low half = low nibble).
DEV u32 fp4x2_to_bf16x2(u32 byte, float s) {
	return f32_to_bf16(e2m1_to_f32(byte & 0xfu) * s) | (f32_to_bf16(e2m1_to_f32((byte >> 4) & 0xfu) * s) << 16);
}

extern "C" __global__ void __launch_bounds__(128) moe_fp4_gemm(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int nvfp4, int N, int K, float* __restrict__ part, int kbPer, int Mtot)
{
	PDL_ENTRY();
	const int t = blockIdx.y;
	if (t >= scratch[0]) return;
	const int4 tile = reinterpret_cast<const int4*>(scratch + 4)[t];
	const int e = tile.x, mBeg = tile.y, mEnd = tile.z;

	extern __shared__ __align__(16) u8 smem[];
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const int g = lane >> 2, c = lane & 3;
	const int wm = wid & 1, wn = wid >> 1;
	const int n0 = blockIdx.x * BN;
	const int kb0 = part ? blockIdx.z * kbPer : 0;
	const int kb1 = part ? min(kb0 + kbPer, K / BK) : K / BK;
	const int groupsPerRow = nvfp4 ? K / 16 : K / 32;
	const u8* we = w + (size_t)e * N * (K / 2);
	const u8* se = wscale + (size_t)e * N * groupsPerRow;

	auto load_stage = [&](int stage, int kb) {
		u8* As = smem + stage * STAGE_BYTES;
		u8* Bs = As + A_STAGE;
		float* Ss = reinterpret_cast<float*>(Bs + B_STAGE);
#pragma unroll
		for (int i = 0; i < 4; i++) {
			int ch = tid + i * 128, r = ch >> 3, col = (ch & 7) * 16;
			bool ok = mBeg + r < mEnd;
			const u8* src = ok ? xq + (size_t)(mBeg + r) * K + (size_t)kb * BK + col : xq;
			cp_async16(As + r * AROW + col, src, ok ? 16 : 0);
		}
#pragma unroll
		for (int i = 0; i < 4; i++) {
			int ch = tid + i * 128, r = ch >> 2, col = (ch & 3) * 16;
			bool ok = n0 + r < N;
			const u8* src = ok ? we + (size_t)(n0 + r) * (K / 2) + (size_t)kb * (BK / 2) + col : we;
			cp_async16(Bs + r * BROW + col, src, ok ? 16 : 0);
		}
		// Scales: converted to fp32 on the way in (plain loads and stores).
		const int per = nvfp4 ? 8 : 4;
		for (int i = tid; i < BN * per; i += 128) {
			int r = i / per, j = i % per;
			float v = 0.f;
			if (n0 + r < N) {
				u32 b = se[(size_t)(n0 + r) * groupsPerRow + kb * per + j];
				v = nvfp4 ? e4m3_to_f32(b) : e8m0_to_f32(b);
			}
			Ss[r * 8 + j] = v;
		}
	};

	float acc[2][8][4];
	zero_acc(acc);

	// Act scales: one row a thread (thread (g, c) gets the factors of rows
	// mBeg + wm*32 + g + 8q by shuffle from lane 4g + q), decoded by selects,
	// the byte prefetched to L1 at the top of the iteration: four loads at the
	// promotion, each behind its decode branches, stalled every block. Not
	// loaded ahead into a register held across the MMAs as in linear_fp8, nor
	// masked by bits: either gives 255 registers and an 88-byte stack here
	// (NVRTC 12.4, sm_90a and sm_80).
	const int kblocks = K / BK;
	const int rOwn = mBeg + wm * 32 + g + 8 * c;
	const u8* xsr = xs + (size_t)(rOwn < mEnd ? rOwn : 0) * kblocks; // in bounds for the prefetch

	load_stage(0, kb0);
	cp_async_commit();
	for (int kb = kb0; kb < kb1; kb++) {
		asm volatile("prefetch.global.L1 [%0];" ::"l"(xsr + kb));
		if (kb + 1 < kb1) load_stage((kb + 1 - kb0) & 1, kb + 1);
		cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();

		const u8* As = smem + ((kb - kb0) & 1) * STAGE_BYTES;
		const u8* Bs = As + A_STAGE;
		const float* Ss = reinterpret_cast<const float*>(Bs + B_STAGE);
		float part[2][8][4];
		zero_acc(part);

		// Logical k16 step j covers physical K [16j, 16j+16) of this block. Thread c
		// holds physical k 16j+4c..16j+4c+3 as logical {2c,2c+1} and {8+2c,9+2c}, in
		// A and B alike.
#pragma unroll
		for (int j = 0; j < 8; j++) {
			u32 a[2][4];
#pragma unroll
			for (int mt = 0; mt < 2; mt++) {
				const u8* r0 = As + (wm * 32 + mt * 16 + g) * AROW + 16 * j + 4 * c;
				u32 lo = lds32(r0), hi = lds32(r0 + 8 * AROW);
				a[mt][0] = e4m3x2_to_bf16x2(lo & 0xffffu);
				a[mt][1] = e4m3x2_to_bf16x2(hi & 0xffffu);
				a[mt][2] = e4m3x2_to_bf16x2(lo >> 16);
				a[mt][3] = e4m3x2_to_bf16x2(hi >> 16);
			}
			const int grp = nvfp4 ? j : (j >> 1);
#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
				const int n = wn * 64 + nt * 8 + g;
				const u32 packed = lds16(Bs + n * BROW + 8 * j + 2 * c);
				const float s = Ss[n * 8 + grp];
				u32 b[2] = {fp4x2_to_bf16x2(packed & 0xffu, s), fp4x2_to_bf16x2(packed >> 8, s)};
#pragma unroll
				for (int mt = 0; mt < 2; mt++) mma_bf16_16816(part[mt][nt], a[mt], b);
			}
		}

		const float fOwn = rOwn < mEnd ? e8m0_to_f32_sel(xsr[kb]) : 0.f;
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
		__syncthreads();
	}

	const float G = (nvfp4 && gscale) ? gscale[e] : 1.0f;
#pragma unroll
	for (int mt = 0; mt < 2; mt++) {
		int r0 = mBeg + wm * 32 + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
		for (int nt = 0; nt < 8; nt++) {
			int col = n0 + wn * 64 + nt * 8 + 2 * c;
			if (col >= N) continue;
			if (part) {
				float* pz = part + (size_t)blockIdx.z * Mtot * N;
				if (r0 < mEnd) *reinterpret_cast<float2*>(pz + (size_t)r0 * N + col) = make_float2(acc[mt][nt][0] * G, acc[mt][nt][1] * G);
				if (r1 < mEnd) *reinterpret_cast<float2*>(pz + (size_t)r1 * N + col) = make_float2(acc[mt][nt][2] * G, acc[mt][nt][3] * G);
				continue;
			}
			if (r0 < mEnd) *reinterpret_cast<u32*>(y + (size_t)r0 * N + col) = pack_bf16x2(acc[mt][nt][0] * G, acc[mt][nt][1] * G);
			if (r1 < mEnd) *reinterpret_cast<u32*>(y + (size_t)r1 * N + col) = pack_bf16x2(acc[mt][nt][2] * G, acc[mt][nt][3] * G);
		}
	}
}
