// MoE routing on the GPU backend (backend/gpu), matching backend/cpu/moe.go:
// router scores and top-k, the permutation of (row, slot) pairs into expert
// order, the gather / SwiGLU between the grouped FP4 GEMMs (moe_fp4.cu) and
// the per-row combine in ascending expert id.
#include "common.cuh"

// a (index ia) ranks before b (index ib): larger first, ties to the lower
// index, NaN after every number (the CPU's insertion top-k gives this order).
DEV bool ranks_before(float a, int ia, float b, int ib) {
	const bool an = a != a, bn = b != b;
	if (an != bn) return bn;
	if (!an && a != b) return a > b;
	return ia < ib;
}

// One warp per row. logits [rows, E] are replaced by s = sqrt(softplus(z))
// (double inside, rounded to fp32 like the CPU). bias != 0: top-k of s + bias
// in that order, K rounds of a warp arg-best over the experts not yet taken
// (E <= 32*32). bias == 0: ids come from table[tok[r]] (validated by the host).
extern "C" __global__ void router_topk(
	float* __restrict__ logits, int rows, int E, int K, const float* __restrict__ bias,
	const int* __restrict__ table, const int* __restrict__ tok, float scale,
	float* __restrict__ weights, int* __restrict__ ids)
{
	const int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
	if (r >= rows) return;
	float* s = logits + (size_t)r * E;
	for (int e = lane; e < E; e += 32) {
		float z = s[e];
		float sp = z > 20.0f ? z : (float)log1p(exp((double)z));
		s[e] = (float)sqrt((double)sp);
	}
	__syncwarp();
	int* idx = ids + (size_t)r * K;
	if (bias) {
		u32 taken = 0; // bit i: expert lane + 32 i is chosen
		for (int k = 0; k < K; k++) {
			float bv = 0.f;
			int bi = -1;
			for (int i = 0, e = lane; e < E; i++, e += 32) {
				if (taken >> i & 1u) continue;
				const float x = s[e] + bias[e];
				if (bi < 0 || ranks_before(x, e, bv, bi)) { bv = x; bi = e; }
			}
#pragma unroll
			for (int o = 16; o > 0; o >>= 1) {
				const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
				const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
				if (oi >= 0 && (bi < 0 || ranks_before(ov, oi, bv, bi))) { bv = ov; bi = oi; }
			}
			if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
			if (lane == 0) idx[k] = bi;
		}
	} else if (lane == 0) {
		const int* row = table + (size_t)tok[r] * K;
		for (int k = 0; k < K; k++) idx[k] = row[k];
	}
	__syncwarp();
	if (lane != 0) return;
	float sum = 0.0f;
	for (int k = 0; k < K; k++) sum += s[idx[k]];
	if (sum == sum) sum = fmaxf(sum, 1e-20f); // Go's max keeps NaN
	float* w = weights + (size_t)r * K;
	for (int k = 0; k < K; k++) w[k] = s[idx[k]] / sum * scale;
}

// One warp per expert: counts[e] = #{i : ids[i] == e}.
extern "C" __global__ void moe_count(const int* __restrict__ ids, int nk, int E, int* __restrict__ counts)
{
	const int e = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
	if (e >= E) return;
	int c = 0;
	for (int i0 = 0; i0 < nk; i0 += 32) {
		const int i = i0 + lane;
		c += __popc(__ballot_sync(0xffffffffu, i < nk && ids[i] == e));
	}
	if (lane == 0) counts[e] = c;
}

// One warp per expert: offsets[e] = Σ counts[<e]; the pairs of expert e go to
// perm[offsets[e]...] in ascending i (the CPU's order); inv[i] = position.
// Pairs with an id outside [0, E) are skipped (offsets[E] < nk flags them).
extern "C" __global__ void moe_scatter(
	const int* __restrict__ ids, int nk, int E, const int* __restrict__ counts,
	int* __restrict__ offsets, int* __restrict__ perm, int* __restrict__ inv)
{
	const int e = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
	if (e >= E) return;
	int off = 0;
	for (int j = lane; j < e; j += 32) off += counts[j];
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) off += __shfl_xor_sync(0xffffffffu, off, o);
	if (lane == 0) {
		offsets[e] = off;
		if (e == E - 1) offsets[E] = off + counts[e];
	}
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

// xg[m, :] = x[perm[m] / K, :] for m < offsets[E]; one block per m.
extern "C" __global__ void moe_gather(
	float* __restrict__ xg, const float* __restrict__ x, const int* __restrict__ perm,
	const int* __restrict__ offsets, int E, int K, int d)
{
	const int m = blockIdx.x;
	if (m >= offsets[E]) return;
	const float* src = x + (size_t)(perm[m] / K) * d;
	float* dst = xg + (size_t)m * d;
	for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
}

// h[m, j] = bf16(w * (g * sigmoid(g) * u)) with the CPU's clamp (limit <= 0:
// none) and w = weights[perm[m]]; g, u bf16 [Mtot, I] (exact: fp32 in, h not
// rounded). Also widens g and u into gf, uf (fp32, may be 0) for the NaN tracer.
extern "C" __global__ void moe_swiglu(
	float* __restrict__ h, const void* __restrict__ g, const void* __restrict__ u,
	const int* __restrict__ perm, const int* __restrict__ offsets, int E,
	const float* __restrict__ weights, int I, float limit, float* __restrict__ gf, float* __restrict__ uf, int exact)
{
	const int m = blockIdx.x;
	if (m >= offsets[E]) return;
	const float w = weights[perm[m]];
	for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < I; j += gridDim.y * blockDim.x) {
		const size_t o = (size_t)m * I + j;
		float gv = exact ? ((const float*)g)[o] : bf16_to_f32(((const u16*)g)[o]);
		float uv = exact ? ((const float*)u)[o] : bf16_to_f32(((const u16*)u)[o]);
		if (gf) { gf[o] = gv; uf[o] = uv; }
		if (limit > 0.0f) {
			uv = fminf(fmaxf(uv, -limit), limit);
			gv = fminf(gv, limit);
		}
		const float sig = (float)(1.0 / (1.0 + exp(-(double)gv)));
		const float v = w * (gv * sig * uv);
		h[o] = exact ? v : bf16_to_f32(f32_to_bf16(v));
	}
}

// acc[r, :] = Σ_k y[inv[r*K+k], :] over k in ascending expert id (stable),
// fp32 adds in that order; skipped pairs (inv < 0) add nothing; y bf16 (exact:
// fp32). One block per row.
extern "C" __global__ void moe_combine(
	float* __restrict__ acc, const void* __restrict__ y, const int* __restrict__ ids,
	const int* __restrict__ inv, int K, int d, int exact)
{
	__shared__ int order[32];
	const int r = blockIdx.x;
	const int* ir = ids + (size_t)r * K;
	if (threadIdx.x == 0) {
		for (int k = 0; k < K; k++) order[k] = k;
		for (int i = 1; i < K; i++)
			for (int j = i; j > 0 && ir[order[j]] < ir[order[j - 1]]; j--) {
				const int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
			}
		for (int k = 0; k < K; k++) order[k] = inv[(size_t)r * K + order[k]];
	}
	__syncthreads();
	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		float a = 0.0f;
		for (int k = 0; k < K; k++) {
			const int p = order[k];
			if (p < 0) continue;
			const size_t o = (size_t)p * d + i;
			a += exact ? ((const float*)y)[o] : bf16_to_f32(((const u16*)y)[o]);
		}
		acc[(size_t)r * d + i] = a;
	}
}
