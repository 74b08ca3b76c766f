// The persistent warp-specialised GEMM of the sm_100a kernels (swap-AB:
// 128 weight rows are the MMA's M, a tile of BT tokens its N, K in blocks of
// 128: e4m3 values with ue8m0 scales per 32 (kind::mxf8f6f4.block_scale), or
// with BF16 bf16 values as two 64-K swizzle atoms (kind::f16, no scales)).
// A work item multiplies P weight blocks (P = 2: the gate and up rows of
// the same 128 columns, for the fused SwiGLU epilogue) by one token tile,
// into P accumulators side by side. docs/blackwell.md has the design.
//
//   warps 0-3 (loaders): wait empty[s]; fill() writes the weight tile (when
//     it is not loaded by TMA) and the two scale-factor atoms; thread 0 then
//     arrives with the TMA bytes and loads the token tile (and weight tile).
//   warp 8 (MMA): allocates TMEM; its lane 0 copies the scale atoms into
//     TMEM, issues 4 MMAs per K block into accumulator h of stage a, commits
//     to empty[s] and, after the item's last K block, to tmem_full[a].
//   warps 4-7 (epilogue): wait tmem_full[a], epi() reads their 32 lanes
//     (weight rows) with tcgen05.ld and stores, release tmem_empty[a].
#pragma once
#include "sm100.cuh"

struct TcItem {
	int e, m0, m1, n0; // expert, token rows [m0, m1), first weight row
};

template <int BT, bool BF16 = false, int P = 1>
struct TcCfg {
	static_assert(P == 1 || P == 2, "weight blocks an item");
	static_assert(BT == 16 || BT == 32 || BT == 64 || BT == 128, "token tile");
	static constexpr int STAGES = BT >= 128 ? 3 : 4;
	static constexpr int EB = BF16 ? 2 : 1; // bytes an element: 128 K are EB 128-byte atoms a row
	static constexpr int W = EB * 128 * 128, X = EB * BT * 128, SF = 512;
	static constexpr int STAGE = W + X + 2 * SF; // a multiple of 1024: every W and X starts on 1024 bytes
	// Two accumulator stages (P accumulators each) so the epilogue of one
	// item overlaps the MMAs of the next, where TMEM holds them and SFA, SFB.
	static constexpr int ASTAGES = 2 * P * BT + 8 <= 512 ? 2 : 1;
	static constexpr int ACC_COLS = ASTAGES * P * BT + 8;
	static constexpr int COLS = ACC_COLS <= 32 ? 32 : ACC_COLS <= 64 ? 64 : ACC_COLS <= 128 ? 128 : ACC_COLS <= 256 ? 256 : 512;
	static constexpr int BARS = 2 * STAGES + 4;
	static constexpr int RED = 2 * 4 * 8 * 4; // the epilogue warps' exchange: 2 buffers x 4 warps x 8 floats
	static constexpr int SMEM = STAGES * STAGE + BARS * 8 + 16 + RED + 1024; // + slack to align the ring
};

#ifdef SM100A
// The 128 epilogue threads (warps 4-7) wait for one another.
DEV void tc_epi_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }

// The plain epilogue: store(ti, r, j, v) for every token column j of weight
// row r, v the fp32 accumulator at taddr.
template <int BT, class StoreF>
DEV void tc_epi_store(const TcItem& ti, int r, u32 taddr, StoreF store) {
#pragma unroll 1
	for (int j = 0; j < BT; j += 8) {
		float v[8];
		tmem_ld8(taddr + j, v);
#pragma unroll
		for (int i = 0; i < 8; i++) store(ti, r, j + i, v[i]);
	}
}

// fill(ti, kb, h, t, Ws, SFA, SFB) stages K block kb of weight block h;
// epi(ti, r, taddr, red) runs on epilogue thread r (weight row r of the
// item) with accumulator h at taddr + h * BT and the 256-byte exchange red.
template <int BT, bool BF16, int P, class ItemF, class FillF, class EpiF>
DEV void tc_gemm(int items, int nkb, const TmaMap* mapX, const TmaMap* mapW, ItemF item, FillF fill, EpiF epi) {
	using C = TcCfg<BT, BF16, P>;
	extern __shared__ __align__(1024) u8 smem_raw[];
	u8* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
	u64* full = reinterpret_cast<u64*>(smem + C::STAGES * C::STAGE);
	u64* empty = full + C::STAGES;
	u64* tfull = empty + C::STAGES;
	u64* tempty = tfull + 2;
	u32* tslot = reinterpret_cast<u32*>(tempty + 2);
	float* red = reinterpret_cast<float*>(smem + C::STAGES * C::STAGE + C::BARS * 8 + 16);
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int first = blockIdx.x, stride = gridDim.x;

	if (threadIdx.x == 0) {
		for (int s = 0; s < C::STAGES; s++) {
			tc_mbar_init(&full[s], TC_LOADERS);
			tc_mbar_init(&empty[s], 1);
		}
		for (int a = 0; a < 2; a++) {
			tc_mbar_init(&tfull[a], 1);
			tc_mbar_init(&tempty[a], 128);
		}
		tc_mbar_init_fence();
	}
	if (warp == TC_MMA_WARP) tmem_alloc(tslot, C::COLS);
	tc_fence_before();
	__syncthreads();
	tc_fence_after();
	const u32 tbase = *tslot;
	const u32 sfa = tbase + C::ASTAGES * P * BT, sfb = sfa + 4;

	if (threadIdx.x < TC_LOADERS) {
		const int t = threadIdx.x;
		const u32 bytes = C::X + (mapW ? C::W : 0);
		int g = 0;
		for (int it = first; it < items; it += stride) {
			const TcItem ti = item(it);
			for (int kh = 0; kh < nkb * P; kh++, g++) {
				const int s = g % C::STAGES, kb = kh / P;
				tc_mbar_wait(&empty[s], ((g / C::STAGES) & 1) ^ 1);
				u8* Ws = smem + s * C::STAGE;
				u8* Xs = Ws + C::W;
				u8* SFA = Xs + C::X;
				fill(ti, kb, kh % P, t, Ws, SFA, SFA + C::SF);
				tc_fence_async_smem();
				if (t == 0) {
					tc_mbar_arrive_tx(&full[s], bytes);
#pragma unroll
					for (int a = 0; a < C::EB; a++) // bf16: the two 64-K atoms of the 256-byte block
						tc_tma_load2d(Xs + a * (C::X / C::EB), mapX, &full[s], (kb * C::EB + a) * 128, ti.m0);
					if (mapW) tc_tma_load2d(Ws, mapW, &full[s], kb * 128, ti.n0);
				} else {
					tc_mbar_arrive(&full[s]);
				}
			}
		}
	} else if (warp == TC_MMA_WARP) {
		if (lane == 0) {
			int g = 0, c = 0;
			for (int it = first; it < items; it += stride, c++) {
				const int a = c % C::ASTAGES;
				tc_mbar_wait(&tempty[a], ((c / C::ASTAGES) & 1) ^ 1);
				tc_fence_after();
				for (int kh = 0; kh < nkb * P; kh++, g++) {
					const int s = g % C::STAGES, kb = kh / P;
					const u32 d = tbase + (a * P + kh % P) * BT;
					tc_mbar_wait(&full[s], (g / C::STAGES) & 1);
					tc_fence_after();
					const u8* Ws = smem + s * C::STAGE;
					const u8* Xs = Ws + C::W;
					const u8* SFA = Xs + C::X;
					if (BF16) {
#pragma unroll
						for (int at = 0; at < 2; at++) { // the two 64-K atoms
							const u64 da = tc_desc_sw128(Ws + at * (C::W / 2)), db = tc_desc_sw128(Xs + at * (C::X / 2));
#pragma unroll
							for (int kk = 0; kk < 4; kk++) // 16 bf16 of K: 32 bytes
								tc_mma_bf16(d, da + 2 * kk, db + 2 * kk, tc_idesc_bf16(128, BT), (kb | at | kk) != 0);
						}
					} else {
						tc_cp_sf(sfa, tc_desc_sf(SFA));
						tc_cp_sf(sfb, tc_desc_sf(SFA + C::SF));
						const u64 da = tc_desc_sw128(Ws), db = tc_desc_sw128(Xs);
#pragma unroll
						for (int kk = 0; kk < 4; kk++) // 32 bytes of K: +2 in the descriptors' address field
							tc_mma_mxf8(d, da + 2 * kk, db + 2 * kk, tc_idesc_mxf8(128, BT, kk), sfa, sfb, (kb | kk) != 0);
					}
					tc_commit(&empty[s]);
				}
				tc_commit(&tfull[a]);
			}
		}
		__syncwarp();
	} else {
		const int q = warp & 3; // TMEM lane quarter of this warp
		const int r = 32 * q + lane;
		int c = 0;
		for (int it = first; it < items; it += stride, c++) {
			const int a = c % C::ASTAGES;
			tc_mbar_wait(&tfull[a], (c / C::ASTAGES) & 1);
			tc_fence_after();
			const TcItem ti = item(it);
			epi(ti, r, tbase + ((u32)(32 * q) << 16) + a * P * BT, red);
			tc_fence_before();
			tc_mbar_arrive(&tempty[a]);
		}
	}
	tc_fence_before();
	__syncthreads();
	if (warp == TC_MMA_WARP) {
		tc_fence_after();
		tmem_dealloc(tbase, C::COLS);
	}
}
#endif
