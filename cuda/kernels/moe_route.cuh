// The MoE routing bookkeeping as device functions, used by the separate
// kernels (moe_scatter in moe_route.cu, moe_tile_map in moe_fp4.cu,
// moe_gather_q in moe_fused.cu).
#pragma once
#include "common.cuh"

// One warp: the pairs of expert e (ids[i] == e) in ascending i, from
// position off, 32 at a time by ballot: perm[p] = i and inv[i] = p.
DEV void scatter_expert(const int* __restrict__ ids, int nk, int e, int off, int lane,
	int* __restrict__ perm, int* __restrict__ inv)
{
	for (int i0 = 0; i0 < nk; i0 += 32) {
		const int i = i0 + lane;
		const bool hit = i < nk && ids[i] == e;
		const u32 m = __ballot_sync(0xffffffffu, hit);
		if (hit) {
			const int p = off + __popc(m & ((1u << lane) - 1u));
			perm[p] = i;
			inv[i] = p;
		}
		off += __popc(m);
	}
}

// Block-wide exclusive scan of v (blockDim.x a multiple of 32; lane and wid
// of threadIdx.x; warpSums 32 ints of shared memory): returns the sum over
// the lower threads, and warpSums[31] then holds the total. The caller
// syncs before warpSums is written again.
DEV int block_excl_scan(int v, int lane, int wid, int* warpSums)
{
	int inc = v;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		int t = __shfl_up_sync(0xffffffffu, inc, o);
		if (lane >= o) inc += t;
	}
	if (lane == 31) warpSums[wid] = inc;
	__syncthreads();
	if (wid == 0) {
		int s = lane < (int)(blockDim.x >> 5) ? warpSums[lane] : 0;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			int t = __shfl_up_sync(0xffffffffu, s, o);
			if (lane >= o) s += t;
		}
		warpSums[lane] = s; // inclusive over warps
	}
	__syncthreads();
	return inc - v + (wid > 0 ? warpSums[wid - 1] : 0);
}

// The tile list of the rows behind offsets [E+1] (any block size): int count
// at [0]; int4 tiles {expert, row_begin, row_end, 0} of at most bm rows from
// byte 16, in expert order, at most maxTiles of them. Experts with no rows
// produce none; offsets are clamped to [0, Mtot].
DEV void tile_map_block(const int* __restrict__ offsets, int E, int Mtot, int* __restrict__ scratch, int maxTiles,
	int bm, int* warpSums)
{
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const int per = (E + blockDim.x - 1) / blockDim.x;
	const int e0 = tid * per;
	int local = 0;
	for (int e = e0; e < min(e0 + per, E); e++) {
		int b = min(max(offsets[e], 0), Mtot), en = min(max(offsets[e + 1], b), Mtot);
		local += (en - b + bm - 1) / bm;
	}
	int base = block_excl_scan(local, lane, wid, warpSums);
	int4* tiles = reinterpret_cast<int4*>(scratch + 4);
	for (int e = e0; e < min(e0 + per, E); e++) {
		int b = min(max(offsets[e], 0), Mtot), en = min(max(offsets[e + 1], b), Mtot);
		for (int r = b; r < en; r += bm) {
			if (base < maxTiles) tiles[base] = make_int4(e, r, min(r + bm, en), 0);
			base++;
		}
	}
	if (tid == 0) scratch[0] = min(warpSums[(blockDim.x >> 5) - 1], maxTiles);
}

// moe_gather_q's work for one warp and one (permuted row m, 128-column block
// b) of x's row pair / K (fp32 [*, d]): the lane's four values, loaded
// apart from their store so that a warp can have several loads in flight.
DEV float4 gather_load(const float* __restrict__ x, int pair, int K, int d, int b, int lane)
{
	return *reinterpret_cast<const float4*>(x + (size_t)(pair / K) * d + b * 128 + 4 * lane);
}

// ... then the fp32 copy (xg [*, d]) and/or the FP8 codes and scale (xq
// [*, d], xs [*, d/128]) of row m.
DEV void gather_store(u8* __restrict__ xq, u8* __restrict__ xs, float* __restrict__ xg, float4 v4, int d, int m,
	int b, int lane)
{
	const float v[4] = {v4.x, v4.y, v4.z, v4.w};
	if (xg) *reinterpret_cast<float4*>(xg + (size_t)m * d + b * 128 + 4 * lane) = v4;
	if (xq) quant128(v, lane, xq + (size_t)m * d + b * 128, xs + (size_t)m * (d >> 7) + b);
}
