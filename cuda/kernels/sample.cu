// On-GPU token sampling (engine/sampler.go's choose on the device), one block
// of 1024 threads per row of fp32 logits [rows, vocab].
//
// Semantics (cpuref.SampleDraw is the twin, bit for bit):
//   - NaN logits, and tokens the row's mask (if any) disallows, are -inf. best = argmax, ties -> lowest id; an all -inf row -> 0.
//   - T = temp[r]; !(T > 0) or a non-finite max -> best (greedy).
//   - invT = 1/max(T, 1e-5) (fp32); p_i = fp32(exp_double(fp32((x_i - m) * invT))),
//     so p_best = 1 and p is reproducible on the host (double exp, rounded once).
//   - Masses are fixed point: w_i = rn(p_i * 2^40) as u64, summed exactly (order
//     free, so GPU and twin agree); tokens with p < 2^-41 weigh 0 and are never drawn.
//   - Rank order: p descending, ties -> lower id. A prefix of that order is a
//     Bound (key, id): i is in it iff bits(p_i) > key || (bits(p_i) == key && i <= id).
//   - No top-k and no top-p: kept = {p > 0, p >= min_p}; draw in id order.
//   - Otherwise: top-k (0 < k < vocab) keeps the first k of {p > 0}; top-p
//     (0 < top_p < 1) keeps the shortest prefix whose mass >= ceil(top_p * mass(kept));
//     min-p (> 0, clamped to 1) then drops p < min_p; draw in rank order.
//   - Draw: the first kept token whose cumulative mass >= floor(u * kept) + 1,
//     i.e. exceeds u * kept. u outside [0, 1) is clamped.
#include "common.cuh"

#define SB 1024          // threads per block
#define NW (SB / 32)     // warps
#define WSCALE 1099511627776.0 // 2^40
#define IMAX 0x7fffffff

struct Bound {
	u32 key;
	int id;
};

struct Smem {
	u64 hist[2048];
	int hmin[2048];
	u64 wsum[NW];
	float wv[NW];
	int wi[NW];
	int bin, res;
	u64 acc;
};

DEV bool member(u32 key, int i, Bound b) { return key > b.key || (key == b.key && i <= b.id); }

DEV float clean(float v) { return v != v ? __int_as_float(0xff800000) : v; }

// A row of logits and its optional allow mask (bit i of word i/32 set = token
// i allowed): a masked token reads as -inf, like NaN.
struct Row {
	const float* x;
	const u32* mk; // null: every token allowed
};

DEV float at(const Row& r, int i) {
	if (r.mk && !((r.mk[i >> 5] >> (i & 31)) & 1u)) return __int_as_float(0xff800000);
	return clean(r.x[i]);
}

DEV float prob(float x, float m, float invT) {
	if (x == __int_as_float(0xff800000)) return 0.0f;
	const float d = (x - m) * invT;
	return (float)exp((double)d);
}

DEV u64 weight(float p) { return __double2ull_rn((double)p * WSCALE); }

// Block-wide (max, lowest index); every thread gets the result.
DEV void block_argmax(float& v, int& i, Smem& S) {
	for (int o = 16; o > 0; o >>= 1) {
		const float ov = __shfl_xor_sync(0xffffffffu, v, o);
		const int oi = __shfl_xor_sync(0xffffffffu, i, o);
		if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
	}
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	__syncthreads();
	if (lane == 0) { S.wv[w] = v; S.wi[w] = i; }
	__syncthreads();
	v = S.wv[lane];
	i = S.wi[lane];
	for (int o = 16; o > 0; o >>= 1) {
		const float ov = __shfl_xor_sync(0xffffffffu, v, o);
		const int oi = __shfl_xor_sync(0xffffffffu, i, o);
		if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
	}
}

DEV void row_argmax(const Row& x, int V, Smem& S, float& m, int& best) {
	float v = __int_as_float(0xff800000);
	int bi = IMAX;
	for (int i = threadIdx.x; i < V; i += SB) {
		const float y = at(x, i);
		if (y > v) { v = y; bi = i; }
	}
	block_argmax(v, bi, S);
	m = v;
	best = bi == IMAX ? 0 : bi;
}

// Exclusive prefix over threads of v; *total gets the block sum.
DEV u64 block_excl_scan(u64 v, Smem& S, u64* total) {
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	u64 inc = v;
	for (int o = 1; o < 32; o <<= 1) {
		const u64 t = __shfl_up_sync(0xffffffffu, inc, o);
		if (lane >= o) inc += t;
	}
	__syncthreads();
	if (lane == 31) S.wsum[w] = inc;
	__syncthreads();
	u64 ws = S.wsum[lane];
	u64 winc = ws;
	for (int o = 1; o < 32; o <<= 1) {
		const u64 t = __shfl_up_sync(0xffffffffu, winc, o);
		if (lane >= o) winc += t;
	}
	const u64 wex = __shfl_sync(0xffffffffu, winc - ws, w);
	*total = __shfl_sync(0xffffffffu, winc, 31);
	return wex + inc - v;
}

// Mass (or count) of the members of b.
DEV u64 bound_sum(const Row& x, int V, float m, float invT, Bound b, int mass, Smem& S) {
	u64 s = 0;
	for (int i = threadIdx.x; i < V; i += SB) {
		const float p = prob(at(x, i), m, invT);
		if (p > 0.0f && member(__float_as_uint(p), i, b)) s += mass ? weight(p) : 1;
	}
	u64 tot;
	block_excl_scan(s, S, &tot);
	return tot;
}

// First member of b in id order (restricted to bits(p) == eqkey when eq) whose
// cumulative weight (mass or count) reaches tau; -1 if none.
DEV int ordered_select(const Row& x, int V, float m, float invT, Bound b, int eq, u32 eqkey, int mass, u64 tau, Smem& S) {
	u64 base = 0;
	for (int start = 0; start < V; start += SB) {
		const int i = start + threadIdx.x;
		u64 w = 0;
		if (i < V) {
			const float p = prob(at(x, i), m, invT);
			const u32 key = __float_as_uint(p);
			if (p > 0.0f && member(key, i, b) && (!eq || key == eqkey)) w = mass ? weight(p) : 1;
		}
		if (threadIdx.x == 0) S.res = -1;
		u64 tot;
		const u64 ex = block_excl_scan(w, S, &tot); // syncs after S.res is set
		if (w > 0 && base + ex < tau && base + ex + w >= tau) S.res = i;
		__syncthreads();
		const int r = S.res;
		if (r >= 0) return r;
		base += tot;
	}
	return -1;
}

// First member of b in rank order whose cumulative weight reaches tau: a
// three-pass radix select (11/11/10 bits) on the bits of p with histograms of
// weight, then the tie rank among equal p in id order. ok = 0 if none.
DEV Bound rank_select(const Row& x, int V, float m, float invT, Bound b, int mass, u64 tau, Smem& S, int* ok) {
	__syncthreads(); // the previous select's readers of hist/hmin are done
	u32 prefix = 0;
	u64 acc = 0; // weight of members ranked above the current prefix range
	int bin = 0;
	for (int pass = 0; pass < 3; pass++) {
		const int wd = pass == 2 ? 10 : 11, sh = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
		const int nb = 1 << wd, hs = sh + wd;
		for (int j = threadIdx.x; j < nb; j += SB) { S.hist[j] = 0; S.hmin[j] = IMAX; }
		if (threadIdx.x == 0) S.bin = -1;
		__syncthreads();
		for (int i = threadIdx.x; i < V; i += SB) {
			const float p = prob(at(x, i), m, invT);
			const u32 key = __float_as_uint(p);
			if (!(p > 0.0f) || !member(key, i, b)) continue;
			if (hs < 32 && (key >> hs) != (prefix >> hs)) continue;
			const int bn = (key >> sh) & (nb - 1);
			atomicAdd(&S.hist[bn], mass ? weight(p) : (u64)1);
			if (pass == 2) atomicMin(&S.hmin[bn], i);
		}
		__syncthreads();
		// Thread t owns bins nb-1-(t*per+q), highest first.
		const int per = nb / SB;
		u64 own = 0;
		for (int q = 0; q < per; q++) own += S.hist[nb - 1 - (threadIdx.x * per + q)];
		u64 tot;
		u64 run = acc + block_excl_scan(own, S, &tot);
		for (int q = 0; q < per; q++) {
			const int bn = nb - 1 - (threadIdx.x * per + q);
			const u64 h = S.hist[bn];
			if (run < tau && run + h >= tau) { S.bin = bn; S.acc = run; }
			run += h;
		}
		__syncthreads();
		bin = S.bin;
		if (bin < 0) { *ok = 0; return b; }
		prefix |= (u32)bin << sh;
		acc = S.acc;
		__syncthreads(); // S.bin / S.acc read before the next pass resets them
	}
	const u64 wt = mass ? weight(__uint_as_float(prefix)) : 1;
	const u64 j = (tau - acc + wt - 1) / wt - 1; // 0-based rank among the ties
	int id = S.hmin[bin];
	if (j > 0) id = ordered_select(x, V, m, invT, b, 1, prefix, 0, j + 1, S);
	*ok = id >= 0;
	Bound r = {prefix, id};
	return r;
}

// ids[r] = one draw from row r under temp/top_k/top_p/min_p with uniform u[r]
// over the tokens mask row r allows (mask null: all; see the header).
extern "C" __global__ void __launch_bounds__(SB) sample_draw(
	int* __restrict__ ids, const float* __restrict__ logits, int V,
	const float* __restrict__ temp, const int* __restrict__ topk, const float* __restrict__ topp,
	const float* __restrict__ minp, const float* __restrict__ uni, const u32* __restrict__ mask)
{
	PDL_ENTRY();
	__shared__ Smem S;
	const int r = blockIdx.x;
	const Row x = {logits + (size_t)r * V, mask ? mask + (size_t)r * ((V + 31) >> 5) : nullptr};
	float m;
	int best;
	row_argmax(x, V, S, m, best);
	const float T = temp[r];
	if (!(T > 0.0f) || !(m - m == 0.0f)) {
		if (threadIdx.x == 0) ids[r] = best;
		return;
	}
	const float invT = 1.0f / fmaxf(T, 1e-5f);
	const int k = topk[r];
	const bool kOn = k > 0 && k < V;
	const float tp = topp[r];
	const bool pOn = tp > 0.0f && tp < 1.0f;
	const bool mOn = minp[r] > 0.0f; // NaN: off
	const float mp = fminf(minp[r], 1.0f); // p_best = 1 always survives
	float u = uni[r];
	if (!(u >= 0.0f)) u = 0.0f;
	if (u >= 1.0f) u = __uint_as_float(0x3f7fffffu);
	const Bound all = {0u, -1};
	int id = -1;
	if (!kOn && !pOn) {
		const Bound b = mOn ? Bound{__float_as_uint(mp), IMAX} : all;
		const u64 kept = bound_sum(x, V, m, invT, b, 1, S);
		const u64 tau = (u64)floor((double)u * (double)kept) + 1;
		id = ordered_select(x, V, m, invT, b, 0, 0u, 1, tau, S);
	} else {
		Bound b = all;
		int ok;
		if (kOn) {
			const Bound s = rank_select(x, V, m, invT, b, 0, (u64)k, S, &ok);
			if (ok) b = s;
		}
		if (pOn) {
			const u64 sum = bound_sum(x, V, m, invT, b, 1, S);
			const u64 tau = (u64)ceil((double)tp * (double)sum);
			const Bound s = rank_select(x, V, m, invT, b, 1, tau > 0 ? tau : 1, S, &ok);
			if (ok) b = s;
		}
		if (mOn) {
			const Bound q = {__float_as_uint(mp), IMAX};
			if (q.key > b.key || (q.key == b.key && q.id < b.id)) b = q; // the shorter prefix
		}
		const u64 kept = bound_sum(x, V, m, invT, b, 1, S);
		const u64 tau = (u64)floor((double)u * (double)kept) + 1;
		const Bound s = rank_select(x, V, m, invT, b, 1, tau, S, &ok);
		if (ok) id = s.id;
	}
	if (threadIdx.x == 0) ids[r] = id >= 0 ? id : best;
}

// DSpark's Markov chain (backend.MarkovDrawer): ids[r] = the greedy token
// (NaN -> -inf, ties -> lowest id, all -inf -> 0) of row r of a (stride lda
// floats) plus row r of b [rows, V], summed in fp32.
extern "C" __global__ void __launch_bounds__(SB) add_argmax(
	int* __restrict__ ids, const float* __restrict__ a, long long lda, const float* __restrict__ b, int V)
{
	PDL_ENTRY();
	__shared__ Smem S;
	const int r = blockIdx.x;
	const float* x = a + (size_t)r * lda;
	const float* y = b + (size_t)r * V;
	float v = __int_as_float(0xff800000);
	int bi = IMAX;
	for (int i = threadIdx.x; i < V; i += SB) {
		const float s = clean(__fadd_rn(x[i], y[i]));
		if (s > v) { v = s; bi = i; }
	}
	block_argmax(v, bi, S);
	if (threadIdx.x == 0) ids[r] = bi == IMAX ? 0 : bi;
}

// dst[r] = src[r * stride] for r < n (a block's anchor among a step's ids).
extern "C" __global__ void stride_i32(int* __restrict__ dst, const int* __restrict__ src, int stride, int n)
{
	PDL_ENTRY();
	const int r = blockIdx.x * blockDim.x + threadIdx.x;
	if (r < n) dst[r] = src[(size_t)r * stride];
}
