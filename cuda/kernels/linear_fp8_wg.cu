// FP8 block-scaled linear on Hopper tensor cores (sm_90a): the same function
// as linear_fp8 (kernels/linear_fp8.cu) for the prefill shapes.
//   y[m, n] = bf16( sum_kb xs[m, kb] * ws[n/128, kb] * sum_{k in kb} xq[m, k] * w[n, k] )
//
// A CTA computes 128 x BN output tiles (persistent: tiles blockIdx.x,
// blockIdx.x + gridDim.x, ...; the producer fills the next tile's stages
// while the math warpgroups store the last one): one producer warpgroup
// whose first thread streams 128-byte-wide tiles of xq (128 rows) and w (BN
// rows) with TMA (128-byte swizzle) into a ring of ST stages guarded by
// mbarriers, and two math warpgroups, each multiplying its 64 rows with four
// wgmma m64nBNk32 e4m3 per 128-K block. The block's products start from zero
// (scale-d = 0) and are promoted into fp32 sums with the two scales after
// each block (DeepGEMM's scheme: the tensor core's own accumulation stays
// within one scale block). Every variant promotes the same block sums in the
// same K order with the same scale products, so for the same K slices all
// give the same bits.
// At BN = 128 each math warpgroup alternates two accumulator sets, issuing
// block i+1's wgmmas before it promotes block i, and loads a block's scale
// bytes when it issues the block's MMAs (a third faster on Flash wo_b at
// 4096 tokens than one set with the scales loaded in front of the MMAs); at
// BN = 192 two sets and the sums do not fit the registers, so it waits for
// each block (the other warpgroup's MMAs fill the gap), and a tile spans two
// 128-row weight scale blocks.
// Out-of-range rows of the last tiles read as zero (TMA bounds), are never
// stored, and N % 8 == 0 keeps stores in pairs. The direct epilogue stores
// each thread's pairs; the staged one (BULK) writes a warpgroup's 64 rows
// into padded shared rows and copies each row out with one cp.async.bulk,
// which runs on while the warpgroup starts its next tile.
// Split K as linear_fp8: with part != 0, CTA z covers K blocks
// [z*kbPer, (z+1)*kbPer) and stores fp32 sums to part[z][M][N].
#include "sm90.cuh"

#ifdef SM90A
// Tile t's origin: the tile rows run in groups of G = group (the last may be
// shorter; G = 1 is n fastest over the whole grid), m fastest inside a
// group, so a wave of CTAs shares G activation tiles and about gridDim/G
// weight panels in L2 instead of one activation tile and gridDim panels.
// Every tile is computed alike whatever the order.
DEV void wg_tile(int t, int ntn, int ntm, int group, int bn, int& m0, int& n0) {
	const int per = group * ntn, gi = t / per, r = t % per;
	const int rows = min(group, ntm - gi * group);
	m0 = (gi * group + r % rows) * 128, n0 = (r / rows) * bn;
}

// d (64 rows x 128 cols of this warpgroup, fp32) = or += A(64x32 e4m3) * B(128x32 e4m3)^T.
DEV void wgmma_e4m3(float (&d)[64], u64 da, u64 db, int accumulate) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
		"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
		: "l"(da), "l"(db), "r"(accumulate));
}
// d (64 rows x 192 cols of this warpgroup, fp32) = or += A(64x32 e4m3) * B(192x32 e4m3)^T.
DEV void wgmma_e4m3(float (&d)[96], u64 da, u64 db, int accumulate) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 "
		"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
		: "l"(da), "l"(db), "r"(accumulate));
}

// Bulk copy of bytes (a multiple of 16, both addresses 16-byte aligned) from
// shared memory to global, in this thread's bulk group.
DEV void bulk_store(void* dst, const void* src, u32 bytes) {
	asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_addr(src)), "r"(bytes) : "memory");
}
DEV void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk copies have read their shared sources (read) or are
// complete and visible.
DEV void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
DEV void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Generic-proxy shared stores made visible to the async proxy (bulk copies).
DEV void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Barrier over one math warpgroup (ids 1 and 2; 0 is __syncthreads).
DEV void bar_wg(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }
#endif

// Shared memory of a variant: the ring, the BULK staging rows (two
// warpgroups x 64 rows of 2*BN + 16 bytes: a bf16 tile row, or half an fp32
// one, padded so that the fragment stores hit 32 banks), the barriers.
template <int BN, int ST, bool BULK>
struct WgLayout {
	static constexpr int A = 128 * 128, B = BN * 128, STAGE = A + B;
	static constexpr int SROW = 2 * BN + 16;
	static constexpr int STG = BULK ? 2 * 64 * SROW : 0;
};

template <int BN, int ST, bool BULK>
DEV void wg_linear(u16* __restrict__ y, const TmaMap* mapA, const TmaMap* mapB,
	const u8* __restrict__ xs, const u8* __restrict__ ws, int M, int N, int K,
	float* __restrict__ part, int kbPer, int group)
{
#ifdef SM90A
	using L = WgLayout<BN, ST, BULK>;
	constexpr int R = BN / 2, QN = BN / 8; // accumulators a thread, 8-column groups
	extern __shared__ __align__(1024) u8 smem_raw[];
	// The 128-byte swizzle repeats every 1024 bytes of shared address: align the ring.
	u8* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
	u8* stg = smem + ST * L::STAGE;
	u64* full = reinterpret_cast<u64*>(stg + L::STG);
	u64* empty = full + ST;
	const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
	const int ntn = (N + BN - 1) / BN, ntm = (M + 127) / 128, ntiles = ntn * ntm;
	const int nkb = K / 128, nwb = (N + 127) / 128;
	const int kb0 = part ? blockIdx.z * kbPer : 0;
	const int kb1 = part ? min(kb0 + kbPer, nkb) : nkb;
	const int nb = kb1 - kb0;
	if (threadIdx.x == 0) {
		for (int s = 0; s < ST; s++) {
			mbar_init(&full[s], 1);
			mbar_init(&empty[s], 8); // lane 0 of each of the 8 math warps
		}
		mbar_init_fence();
	}
	__syncthreads();

	// Tiles t = blockIdx.x + j * gridDim.x (order: wg_tile); the ring's stage and
	// phase run on across tiles (block g of this CTA uses stage g % ST).
	if (wg == 0) { // producer: runs ahead into the next tile during the epilogue
		asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
		if (tid == 0) {
			int g = 0;
			for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
				int m0, n0;
				wg_tile(t, ntn, ntm, group, BN, m0, n0);
				for (int kb = kb0; kb < kb1; kb++, g++) {
					const int s = g % ST;
					mbar_wait(&empty[s], ((g / ST) & 1) ^ 1);
					u8* As = smem + s * L::STAGE;
					mbar_arrive_expect_tx(&full[s], L::STAGE);
					tma_load2d(As, mapA, &full[s], kb * 128, m0);
					tma_load2d(As + L::A, mapB, &full[s], kb * 128, n0);
				}
			}
		}
		return;
	}

	asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
	const int cw = wg - 1; // this math warpgroup's 64 rows: m0 + 64*cw ...
	const int w = tid >> 5, l = tid & 31;
	float fin[R];
	int g = 0;
	for (int t = blockIdx.x; t < ntiles; t += gridDim.x, g += nb) {
		int m0, n0;
		wg_tile(t, ntn, ntm, group, BN, m0, n0);
		const int r0 = m0 + 64 * cw + 16 * w + (l >> 2), r1 = r0 + 8;
#pragma unroll
		for (int i = 0; i < R; i++) fin[i] = 0.f;
		// Columns [0, split) of the tile take weight scale row n0/128, the rest
		// the next row (BN = 192 only; clamped: past N nothing is stored).
		const int split = 128 - (n0 & 127);
		const u8* wsr = ws + (size_t)(n0 / 128) * nkb;
		const u8* wsr2 = ws + (size_t)min(n0 / 128 + 1, nwb - 1) * nkb;
		const bool ok0 = r0 < M, ok1 = r1 < M;
		const u8* xs0 = xs + (size_t)(ok0 ? r0 : 0) * nkb;
		const u8* xs1 = xs + (size_t)(ok1 ? r1 : 0) * nkb;
		// Each block's scale bytes are loaded when its MMAs are issued.
		struct Sc { u32 bw, bw2, b0, b1; };
		auto issue = [&](float (&acc)[R], int i, Sc& sc) {
			const int s = (g + i) % ST;
			sc.bw = wsr[kb0 + i];
			if (BN > 128) sc.bw2 = wsr2[kb0 + i];
			sc.b0 = xs0[kb0 + i];
			sc.b1 = xs1[kb0 + i];
			mbar_wait(&full[s], ((g + i) / ST) & 1);
			const u8* As = smem + s * L::STAGE;
			const u64 da = desc_sw128(As + 64 * cw * 128), db = desc_sw128(As + L::A);
			wg_pin(acc);
			wg_fence();
#pragma unroll
			for (int ks = 0; ks < 4; ks++) wgmma_e4m3(acc, da + 2 * ks, db + 2 * ks, ks);
			wg_commit();
		};
		auto promote = [&](float (&acc)[R], int i, const Sc& sc) {
			wg_pin(acc);
			if (l == 0) mbar_arrive(&empty[(g + i) % ST]);
			const float wsc = e8m0_to_f32_sel(sc.bw);
			const float f0 = ok0 ? e8m0_to_f32_sel(sc.b0) * wsc : 0.f;
			const float f1 = ok1 ? e8m0_to_f32_sel(sc.b1) * wsc : 0.f;
			if (BN > 128) {
				const float wsc2 = e8m0_to_f32_sel(sc.bw2);
				const float g0 = ok0 ? e8m0_to_f32_sel(sc.b0) * wsc2 : 0.f;
				const float g1 = ok1 ? e8m0_to_f32_sel(sc.b1) * wsc2 : 0.f;
#pragma unroll
				for (int j = 0; j < R; j++) {
					const bool lo = 8 * (j / 4) < split;
					fin[j] = fmaf(acc[j], (j & 2) ? (lo ? f1 : g1) : (lo ? f0 : g0), fin[j]);
				}
			} else {
#pragma unroll
				for (int j = 0; j < R; j++) fin[j] = fmaf(acc[j], (j & 2) ? f1 : f0, fin[j]);
			}
		};
		if (BN == 128) {
			// Two accumulator sets: block i+1's wgmmas are issued before block i is
			// promoted, so the tensor cores never wait for this warpgroup's FFMAs.
			// Between iterations exactly block i (in accA) is in flight, so ptxas
			// sees one pipeline state at every read of an accumulator set.
			float accA[R], accB[R];
			Sc a{}, b{};
			int i = 0;
			if (nb > 0) {
				issue(accA, 0, a);
				for (; i + 2 < nb; i += 2) {
					issue(accB, i + 1, b);
					wg_wait<1>();
					promote(accA, i, a);
					issue(accA, i + 2, a);
					wg_wait<1>();
					promote(accB, i + 1, b);
				}
				if (i + 1 < nb) {
					issue(accB, i + 1, b);
					wg_wait<1>();
					promote(accA, i, a);
					wg_wait<0>();
					promote(accB, i + 1, b);
				} else {
					wg_wait<0>();
					promote(accA, i, a);
				}
			}
		} else {
			float acc[R];
			Sc a{};
			for (int i = 0; i < nb; i++) {
				issue(acc, i, a);
				wg_wait<0>();
				promote(acc, i, a);
			}
		}

		// fin[4q+0..1]: (r0, n0+8q+2c+{0,1}); fin[4q+2..3]: (r1, same columns).
		const int c2 = 2 * (l & 3);
		if (!BULK) {
#pragma unroll
			for (int q = 0; q < QN; q++) {
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
			continue;
		}
		// Staged: one pass of bf16 rows, or two of half-rows of fp32 partials.
		// Thread tid < 64 copies local row tid; before a pass overwrites the rows
		// the copies of the last pass (or tile) have read them.
		u8* rows = stg + cw * 64 * L::SROW;
		const int lr0 = 16 * w + (l >> 2), lr1 = lr0 + 8;
		const int passes = part ? 2 : 1;
		for (int p = 0; p < passes; p++) {
			if (tid < 64) bulk_wait_read();
			bar_wg(1 + cw);
#pragma unroll
			for (int q = 0; q < QN; q++) {
				if (part) {
					if ((q < QN / 2) != (p == 0)) continue;
					const int off = (8 * (q % (QN / 2)) + c2) * 4;
					*reinterpret_cast<float2*>(rows + lr0 * L::SROW + off) = make_float2(fin[4 * q], fin[4 * q + 1]);
					*reinterpret_cast<float2*>(rows + lr1 * L::SROW + off) = make_float2(fin[4 * q + 2], fin[4 * q + 3]);
				} else {
					const int off = (8 * q + c2) * 2;
					*reinterpret_cast<u32*>(rows + lr0 * L::SROW + off) = pack_bf16x2(fin[4 * q], fin[4 * q + 1]);
					*reinterpret_cast<u32*>(rows + lr1 * L::SROW + off) = pack_bf16x2(fin[4 * q + 2], fin[4 * q + 3]);
				}
			}
			fence_async_smem();
			bar_wg(1 + cw);
			if (tid < 64) {
				const int r = m0 + 64 * cw + tid;
				const int c0 = n0 + p * (BN / 2), width = part ? BN / 2 : BN;
				const int cols = min(width, N - c0);
				if (r < M && cols > 0) {
					if (part) bulk_store(part + ((size_t)blockIdx.z * M + r) * N + c0, rows + tid * L::SROW, cols * 4);
					else bulk_store(y + (size_t)r * N + c0, rows + tid * L::SROW, cols * 2);
				}
				bulk_commit();
			}
		}
	}
	if (BULK && tid < 64) bulk_wait();
#endif
}

// The variants (cuda/linear_wg.go's wgVariants): BN, stages, epilogue.
#define WG_KERNEL(name, BN, ST, BULK)                                                                               \
	extern "C" __global__ void __launch_bounds__(384, 1) name(u16* __restrict__ y, const __grid_constant__ TmaMap mapA, \
		const __grid_constant__ TmaMap mapB, const u8* __restrict__ xs, const u8* __restrict__ ws, int M, int N, int K, \
		float* __restrict__ part, int kbPer, int group) {                                                             \
		PDL_ENTRY();                                                                                                   \
		wg_linear<BN, ST, BULK>(y, &mapA, &mapB, xs, ws, M, N, K, part, kbPer, group);                                 \
	}
WG_KERNEL(linear_fp8_wg, 128, 6, false)
WG_KERNEL(linear_fp8_wg_bulk, 128, 5, true)
WG_KERNEL(linear_fp8_wg_n192, 192, 4, true)
WG_KERNEL(linear_fp8_wg_n192d, 192, 5, false)
WG_KERNEL(linear_fp8_wg_s5, 128, 5, false)
