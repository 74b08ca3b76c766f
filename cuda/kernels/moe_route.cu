// MoE routing on the GPU backend (backend/gpu), matching backend/cpu/moe.go:
// router scores and top-k, the permutation of (row, slot) pairs into expert
// order, (the gather and SwiGLU between the grouped FP4 GEMMs are in
// moe_fused.cu) and the per-row combine in ascending expert id.
#include "moe_route.cuh"
#include "hc_post.cuh"

// a (index ia) ranks before b (index ib): larger first, ties to the lower
// index, NaN after every number (the CPU's insertion top-k gives this order).
DEV bool ranks_before(float a, int ia, float b, int ib) {
	const bool an = a != a, bn = b != b;
	if (an != bn) return bn;
	if (!an && a != b) return a > b;
	return ia < ib;
}

// s = sqrt(softplus(z)) of one gate logit (double inside, rounded to fp32
// like the CPU).
DEV float router_score(float z) {
	const float sp = z > 20.0f ? z : (float)log1p(exp((double)z));
	return (float)sqrt((double)sp);
}

// Top-k of one row on one warp, from its scores sh [E] (shared memory,
// router_score of every logit). bias != 0: top-k of s + bias in that order,
// K rounds of a warp arg-best over the experts not yet taken. bias == 0: ids
// come from table[tok[r]] (validated by the host). Expert lane + 32 i lives
// in register i of its lane (PER >= ceil(E / 32)); lane k keeps the k-th
// choice and its s, so the weights need no reread of s. K <= 32 (the
// launcher checks).
template <int PER>
DEV void router_row(const float* __restrict__ sh, int E, int K, const float* __restrict__ bias,
	const int* __restrict__ table, const int* __restrict__ tok, float scale, float* __restrict__ w,
	int* __restrict__ idx, int r, int lane)
{
	float sv[PER];
#pragma unroll
	for (int i = 0; i < PER; i++) {
		const int e = lane + 32 * i;
		sv[i] = e < E ? sh[e] : 0.f;
	}
	float mys = 0.f; // lane k < K: s of the k-th choice
	int myid = -1;
	if (bias) {
		float v[PER];
#pragma unroll
		for (int i = 0; i < PER; i++) {
			const int e = lane + 32 * i;
			v[i] = e < E ? sv[i] + bias[e] : 0.f;
		}
		u32 taken = 0; // bit i: expert lane + 32 i is chosen
		for (int k = 0; k < K; k++) {
			float bv = 0.f;
			int bi = -1;
#pragma unroll
			for (int i = 0; i < PER; i++) {
				const int e = lane + 32 * i;
				if (e < E && !(taken >> i & 1u) && (bi < 0 || ranks_before(v[i], e, bv, bi))) { bv = v[i]; bi = e; }
			}
#pragma unroll
			for (int o = 16; o > 0; o >>= 1) {
				const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
				const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
				if (oi >= 0 && (bi < 0 || ranks_before(ov, oi, bv, bi))) { bv = ov; bi = oi; }
			}
			float ws = 0.f; // the winner's s, from the lane that holds it
#pragma unroll
			for (int i = 0; i < PER; i++)
				if ((bi >> 5) == i) ws = sv[i];
			ws = __shfl_sync(0xffffffffu, ws, bi & 31);
			if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
			if (lane == k) { myid = bi; mys = ws; }
		}
	} else if (lane < K) {
		myid = table[(size_t)tok[r] * K + lane];
		mys = sh[myid];
	}
	// The CPU's sequential sum over the K choices, on every lane.
	float sum = 0.0f;
	for (int k = 0; k < K; k++) sum += __shfl_sync(0xffffffffu, mys, k);
	if (sum == sum) sum = fmaxf(sum, 1e-20f); // Go's max keeps NaN
	if (lane < K) {
		idx[lane] = myid;
		w[lane] = mys / sum * scale;
	}
}

// Entry points by experts per lane: router_topk8 (E <= 256), router_topk12
// (E <= 384), router_topk32 (E <= 1024; the wide one needs a stack, so the
// real configs keep their own). One block of ROUTER_THREADS per row: every
// thread scores E / ROUTER_THREADS logits (the double softplus is a long
// dependent chain: on one warp, 8 per lane in a row took 11 us for a decode
// row on the H200), then warp 0 takes the top k.
#define ROUTER_THREADS 256
#define ROUTER_TOPK(PER)                                                                                        \
	extern "C" __global__ void __launch_bounds__(ROUTER_THREADS) router_topk##PER(float* __restrict__ logits,  \
		int rows, int E, int K, const float* __restrict__ bias, const int* __restrict__ table,                 \
		const int* __restrict__ tok, float scale, float* __restrict__ weights, int* __restrict__ ids)          \
	{ PDL_ENTRY();                                                                                             \
		__shared__ float sh[32 * PER];                                                                         \
		const int r = blockIdx.x;                                                                              \
		float* s = logits + (size_t)r * E;                                                                     \
		for (int e = threadIdx.x; e < E; e += ROUTER_THREADS) sh[e] = s[e] = router_score(s[e]);              \
		__syncthreads();                                                                                       \
		if (threadIdx.x < 32)                                                                                  \
			router_row<PER>(sh, E, K, bias, table, tok, scale, weights + (size_t)r * K, ids + (size_t)r * K,   \
				r, threadIdx.x);                                                                               \
	}
ROUTER_TOPK(8)
ROUTER_TOPK(12)
ROUTER_TOPK(32)

// One warp per expert: counts[e] = #{i : ids[i] == e}; and inv[i] = -1 for
// every pair (moe_scatter, which runs after, sets those of valid ids).
extern "C" __global__ void moe_count(const int* __restrict__ ids, int nk, int E, int* __restrict__ counts,
	int* __restrict__ inv)
{
	PDL_ENTRY();
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nk; i += gridDim.x * blockDim.x) inv[i] = -1;
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
	PDL_ENTRY();
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
	scatter_expert(ids, nk, e, off, lane, perm, inv);
}

// acc[r, :] = Σ_k y[inv[r*K+k], :] over k in ascending expert id (stable),
// fp32 adds in that order; skipped pairs (inv < 0) add nothing; y bf16 (exact:
// fp32). Grid (rows, ceil(d / COMBINE_CHUNK)), COMBINE_THREADS threads: every
// block ranks its row's slots itself (one warp, each lane its slot's stable
// rank among the valid ones: no serial sort, no dependent loads), then each
// thread sums 4 values of the chunk (vector loads when d % 4 == 0 and the
// pointers are aligned), loading up to 8 slots before adding them so the
// loads overlap. Every element still gets 0 + y_first + y_second + ... in
// ascending id, so the result is bit-identical to a serial loop.
// With shared (fp32 [rows, d]) the row is stored as Combine (add_f32) would
// store it: rbf(sum + shared, rnd), the shared expert added in this launch.
#define COMBINE_THREADS 128
#define COMBINE_CHUNK (4 * COMBINE_THREADS)

DEV void combine_add4(float4& a, float4 v) { a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w; }

// Raw bf16x4 kept as loaded (converted at the add, so the loads stay in flight).
DEV void combine_add4(float4& a, uint2 b) {
	a.x += bf16_to_f32(b.x); a.y += bf16_to_f32(b.x >> 16);
	a.z += bf16_to_f32(b.y); a.w += bf16_to_f32(b.y >> 16);
}

// a += the n rows order[0..n) of y (T: float4 or uint2 = bf16x4) at element i,
// 8 loads issued before their adds.
template <typename T>
DEV void combine_rows4(float4& a, const T* __restrict__ y, const int* order, int n, int d, int i) {
	for (int k0 = 0; k0 < n; k0 += 8) {
		T v[8];
#pragma unroll
		for (int k = 0; k < 8; k++)
			if (k0 + k < n) v[k] = y[((size_t)order[k0 + k] * d + i) >> 2];
#pragma unroll
		for (int k = 0; k < 8; k++)
			if (k0 + k < n) combine_add4(a, v[k]);
	}
}

// The value stored at element i of a row: the routed sum a, or add_f32's
// rbf(a + shared[i], rnd).
DEV float combine_out(float a, const float* __restrict__ sh, int i, int rnd) { return sh ? rbf(a + sh[i], rnd) : a; }

// With HC streams (HC > 0), hc post (hc_post_at) of the stored value ov of
// element i of row r into the row's streams hx with its mix row.
template <int HC>
DEV void combine_post(float ov, float* hx, const float* __restrict__ mix, int r, int d, int i, int rnd)
{
	if constexpr (HC > 0) {
		const size_t row = (size_t)r * HC * d;
		hc_post_at<HC>(hx + row, hx + row, ov, mix + (size_t)r * (HC + HC * HC), d, i, rnd);
	}
}

template <int HC>
DEV void moe_combine_rows(float* __restrict__ acc, const void* __restrict__ y, const int* __restrict__ ids,
	const int* __restrict__ inv, int K, int d, int exact, const float* __restrict__ shared, int rnd, float* hx,
	const float* __restrict__ mix)
{
	__shared__ int order[32]; // y rows of the valid slots, ascending id
	__shared__ int nvalid;
	const int r = blockIdx.x;
	if (threadIdx.x < 32) {
		const int lane = threadIdx.x;
		const int id = lane < K ? ids[(size_t)r * K + lane] : 0;
		const int p = lane < K ? inv[(size_t)r * K + lane] : -1;
		const u32 vm = __ballot_sync(0xffffffffu, p >= 0);
		// Stable (insertion-sort) rank: valid slots with a smaller id, or the same id and a lower slot.
		int rank = 0;
		for (int k = 0; k < K; k++) {
			const int idk = __shfl_sync(0xffffffffu, id, k);
			rank += ((vm >> k) & 1u) && (idk < id || (idk == id && k < lane));
		}
		if (p >= 0) order[rank] = p;
		if (lane == 0) nvalid = __popc(vm);
	}
	__syncthreads();
	const int n = nvalid;
	float* ar = acc + (size_t)r * d;
	const float* sr = shared ? shared + (size_t)r * d : nullptr;
	const bool vec = (d & 3) == 0 && ((size_t)acc & 15) == 0 && ((size_t)shared & 15) == 0 && ((size_t)y & (exact ? 15 : 7)) == 0;
	if (vec) {
		const int i = blockIdx.y * COMBINE_CHUNK + 4 * threadIdx.x;
		if (i >= d) return;
		float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		if (exact) combine_rows4(a, (const float4*)y, order, n, d, i);
		else combine_rows4(a, (const uint2*)y, order, n, d, i);
		if (sr) {
			const float4 s = *reinterpret_cast<const float4*>(sr + i);
			a = make_float4(rbf(a.x + s.x, rnd), rbf(a.y + s.y, rnd), rbf(a.z + s.z, rnd), rbf(a.w + s.w, rnd));
		}
		*reinterpret_cast<float4*>(ar + i) = a;
		combine_post<HC>(a.x, hx, mix, r, d, i, rnd);
		combine_post<HC>(a.y, hx, mix, r, d, i + 1, rnd);
		combine_post<HC>(a.z, hx, mix, r, d, i + 2, rnd);
		combine_post<HC>(a.w, hx, mix, r, d, i + 3, rnd);
		return;
	}
	// Scalar: elements i0 + t*COMBINE_THREADS, t < 4, of the chunk; raw bits
	// loaded (fp32, or bf16 in the low half), converted at the add.
	const int i0 = blockIdx.y * COMBINE_CHUNK + threadIdx.x;
	float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	for (int k0 = 0; k0 < n; k0 += 8) {
		u32 v[8][4];
#pragma unroll
		for (int k = 0; k < 8; k++) {
			const size_t o = k0 + k < n ? (size_t)order[k0 + k] * d : 0;
#pragma unroll
			for (int t = 0; t < 4; t++) {
				const int i = i0 + t * COMBINE_THREADS;
				if (k0 + k < n && i < d) v[k][t] = exact ? ((const u32*)y)[o + i] : ((const u16*)y)[o + i];
			}
		}
#pragma unroll
		for (int k = 0; k < 8; k++) {
#pragma unroll
			for (int t = 0; t < 4; t++)
				if (k0 + k < n && i0 + t * COMBINE_THREADS < d) a[t] += exact ? __uint_as_float(v[k][t]) : bf16_to_f32(v[k][t]);
		}
	}
#pragma unroll
	for (int t = 0; t < 4; t++) {
		const int i = i0 + t * COMBINE_THREADS;
		if (i < d) {
			const float ov = combine_out(a[t], sr, i, rnd);
			ar[i] = ov;
			combine_post<HC>(ov, hx, mix, r, d, i, rnd);
		}
	}
}

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) moe_combine(
	float* __restrict__ acc, const void* __restrict__ y, const int* __restrict__ ids,
	const int* __restrict__ inv, int K, int d, int exact, const float* __restrict__ shared, int rnd)
{
	PDL_ENTRY();
	moe_combine_rows<0>(acc, y, ids, inv, K, d, exact, shared, rnd, nullptr, nullptr);
}

// moe_combine, then hc post (spec §4.2) of its output row into the row's N
// streams hx [rows, N*d] in place, with mix [rows, N+N*N]: bit for bit
// moe_combine and hc_post_f32_nN, one launch.
#define MOE_COMBINE_POST(N)                                                                                  \
	extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) moe_combine_post_n##N(                    \
		float* __restrict__ acc, const void* __restrict__ y, const int* __restrict__ ids,                     \
		const int* __restrict__ inv, int K, int d, int exact, const float* __restrict__ shared, int rnd,      \
		float* hx, const float* __restrict__ mix)                                                             \
	{                                                                                                        \
		PDL_ENTRY();                                                                                         \
		moe_combine_rows<N>(acc, y, ids, inv, K, d, exact, shared, rnd, hx, mix);                            \
	}
MOE_COMBINE_POST(1)
MOE_COMBINE_POST(2)
MOE_COMBINE_POST(4)
MOE_COMBINE_POST(8)
