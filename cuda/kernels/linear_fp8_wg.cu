// FP8 block-scaled linear on Hopper tensor cores (sm_90a): the same function
// as linear_fp8 (kernels/linear_fp8.cu) for the prefill shapes.
//   y[m, n] = bf16( sum_kb xs[m, kb] * ws[n/128, kb] * sum_{k in kb} xq[m, k] * w[n, k] )
//
// A CTA computes 128x128 output tiles (persistent: tiles blockIdx.x,
// blockIdx.x + gridDim.x, ...; the producer fills the next tile's stages
// while the math warpgroups store the last one): one producer warpgroup
// whose first thread streams 128x128-byte tiles of xq and w with TMA (128-byte swizzle)
// into a ring of WG_STAGES stages guarded by mbarriers, and two math
// warpgroups, each multiplying its 64 rows with four wgmma m64n128k32 e4m3
// per 128-K block. The block's products start from zero (scale-d = 0) and are
// promoted into fp32 sums with the two scales after each block (DeepGEMM's
// scheme: the tensor core's own accumulation stays within one scale block).
// Each math warpgroup alternates two accumulator sets, issuing block i+1's
// wgmmas before it promotes block i, and loads a block's scale bytes when it
// issues the block's MMAs (a third faster on Flash wo_b at 4096 tokens than
// one set with the scales loaded in front of the MMAs).
// Out-of-range rows of the last tiles read as zero (TMA bounds), are never
// stored, and N % 8 == 0 keeps stores in pairs.
// Split K as linear_fp8: with part != 0, CTA z covers K blocks
// [z*kbPer, (z+1)*kbPer) and stores fp32 sums to part[z][M][N].
#include "sm90.cuh"

#define WG_STAGES 6
#define WG_TILE (128 * 128)          // bytes of one operand tile per stage
#define WG_STAGE_BYTES (2 * WG_TILE) // A (activations) then B (weights)

// Tile t's origin: the tile rows run in groups of G = group (the last may be
// shorter; G = 1 is n fastest over the whole grid), m fastest inside a
// group, so a wave of CTAs shares G activation tiles and about gridDim/G
// weight panels in L2 instead of one activation tile and gridDim panels.
// Every tile is computed alike whatever the order.
DEV void wg_tile(int t, int ntn, int ntm, int group, int& m0, int& n0) {
	const int per = group * ntn, gi = t / per, r = t % per;
	const int rows = min(group, ntm - gi * group);
	m0 = (gi * group + r % rows) * 128, n0 = (r / rows) * 128;
}

#ifdef SM90A
// d (64 rows x 128 cols of this warpgroup, fp32) = or += A(64x32 e4m3) * B(128x32 e4m3)^T.
DEV void wgmma_n128_e4m3(float (&d)[64], u64 da, u64 db, int accumulate) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
		"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
		: "l"(da), "l"(db), "r"(accumulate));
}
#endif

extern "C" __global__ void __launch_bounds__(384, 1) linear_fp8_wg(
	u16* __restrict__ y, const __grid_constant__ TmaMap mapA, const __grid_constant__ TmaMap mapB,
	const u8* __restrict__ xs, const u8* __restrict__ ws, int M, int N, int K,
	float* __restrict__ part, int kbPer, int group)
{
	PDL_ENTRY();
#ifdef SM90A
	extern __shared__ __align__(1024) u8 smem_raw[];
	// The 128-byte swizzle repeats every 1024 bytes of shared address: align the ring.
	u8* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
	u64* full = reinterpret_cast<u64*>(smem + WG_STAGES * WG_STAGE_BYTES);
	u64* empty = full + WG_STAGES;
	const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
	const int ntn = (N + 127) / 128, ntm = (M + 127) / 128, ntiles = ntn * ntm;
	const int nkb = K / 128;
	const int kb0 = part ? blockIdx.z * kbPer : 0;
	const int kb1 = part ? min(kb0 + kbPer, nkb) : nkb;
	const int nb = kb1 - kb0;
	if (threadIdx.x == 0) {
		for (int s = 0; s < WG_STAGES; s++) {
			mbar_init(&full[s], 1);
			mbar_init(&empty[s], 8); // lane 0 of each of the 8 math warps
		}
		mbar_init_fence();
	}
	__syncthreads();

	// Tiles t = blockIdx.x + j * gridDim.x (order: wg_tile); the ring's stage and
	// phase run on across tiles (block g of this CTA uses stage g % WG_STAGES).
	if (wg == 0) { // producer: runs ahead into the next tile during the epilogue
		asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
		if (tid == 0) {
			int g = 0;
			for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
				int m0, n0;
				wg_tile(t, ntn, ntm, group, m0, n0);
				for (int kb = kb0; kb < kb1; kb++, g++) {
					const int s = g % WG_STAGES;
					mbar_wait(&empty[s], ((g / WG_STAGES) & 1) ^ 1);
					u8* As = smem + s * WG_STAGE_BYTES;
					mbar_arrive_expect_tx(&full[s], WG_STAGE_BYTES);
					tma_load2d(As, &mapA, &full[s], kb * 128, m0);
					tma_load2d(As + WG_TILE, &mapB, &full[s], kb * 128, n0);
				}
			}
		}
		return;
	}

	asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
	const int cw = wg - 1; // this math warpgroup's 64 rows: m0 + 64*cw ...
	const int w = tid >> 5, l = tid & 31;
	float accA[64], accB[64], fin[64];
	int g = 0;
	for (int t = blockIdx.x; t < ntiles; t += gridDim.x, g += nb) {
		int m0, n0;
		wg_tile(t, ntn, ntm, group, m0, n0);
		const int r0 = m0 + 64 * cw + 16 * w + (l >> 2), r1 = r0 + 8;
#pragma unroll
		for (int i = 0; i < 64; i++) fin[i] = 0.f;
		// Two accumulator sets: block i+1's wgmmas are issued before block i is
		// promoted, so the tensor cores never wait for this warpgroup's FFMAs.
		// Each block's scale bytes are loaded when its MMAs are issued and used
		// only after the next block's issue.
		const u8* wsr = ws + (size_t)(n0 / 128) * nkb;
		const bool ok0 = r0 < M, ok1 = r1 < M;
		const u8* xs0 = xs + (size_t)(ok0 ? r0 : 0) * nkb;
		const u8* xs1 = xs + (size_t)(ok1 ? r1 : 0) * nkb;
		auto issue = [&](float (&acc)[64], int i, u32& bw, u32& b0, u32& b1) {
			const int s = (g + i) % WG_STAGES;
			bw = wsr[kb0 + i];
			b0 = xs0[kb0 + i];
			b1 = xs1[kb0 + i];
			mbar_wait(&full[s], ((g + i) / WG_STAGES) & 1);
			const u8* As = smem + s * WG_STAGE_BYTES;
			const u64 da = desc_sw128(As + 64 * cw * 128), db = desc_sw128(As + WG_TILE);
			wg_pin(acc);
			wg_fence();
#pragma unroll
			for (int ks = 0; ks < 4; ks++) wgmma_n128_e4m3(acc, da + 2 * ks, db + 2 * ks, ks);
			wg_commit();
		};
		auto promote = [&](float (&acc)[64], int i, u32 bw, u32 b0, u32 b1) {
			wg_pin(acc);
			if (l == 0) mbar_arrive(&empty[(g + i) % WG_STAGES]);
			const float wsc = e8m0_to_f32_sel(bw);
			const float f0 = ok0 ? e8m0_to_f32_sel(b0) * wsc : 0.f;
			const float f1 = ok1 ? e8m0_to_f32_sel(b1) * wsc : 0.f;
#pragma unroll
			for (int j = 0; j < 64; j++) fin[j] = fmaf(acc[j], (j & 2) ? f1 : f0, fin[j]);
		};
		// Between iterations exactly block i (in accA) is in flight, so ptxas sees
		// one pipeline state at every read of an accumulator set.
		u32 aw = 0, a0 = 0, a1 = 0, bw = 0, b0 = 0, b1 = 0;
		int i = 0;
		if (nb > 0) {
			issue(accA, 0, aw, a0, a1);
			for (; i + 2 < nb; i += 2) {
				issue(accB, i + 1, bw, b0, b1);
				wg_wait<1>();
				promote(accA, i, aw, a0, a1);
				issue(accA, i + 2, aw, a0, a1);
				wg_wait<1>();
				promote(accB, i + 1, bw, b0, b1);
			}
			if (i + 1 < nb) {
				issue(accB, i + 1, bw, b0, b1);
				wg_wait<1>();
				promote(accA, i, aw, a0, a1);
				wg_wait<0>();
				promote(accB, i + 1, bw, b0, b1);
			} else {
				wg_wait<0>();
				promote(accA, i, aw, a0, a1);
			}
		}

		// d[4q+0..1]: (r0, n0+8q+2c+{0,1}); d[4q+2..3]: (r1, same columns).
		const int c2 = 2 * (l & 3);
#pragma unroll
		for (int q = 0; q < 16; q++) {
			const int col = n0 + 8 * q + c2;
			if (col >= N) continue;
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int r = h ? r1 : r0;
				if (r >= M) continue;
				const float a = fin[4 * q + 2 * h], b = fin[4 * q + 2 * h + 1];
				if (part) *reinterpret_cast<float2*>(part + ((size_t)blockIdx.z * M + r) * N + col) = make_float2(a, b);
				else *reinterpret_cast<u32*>(y + (size_t)r * N + col) = pack_bf16x2(a, b);
			}
		}
	}
#endif
}
