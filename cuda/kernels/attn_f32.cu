// KV-store ops of the GPU backend (backend/gpu kv.go, attn.go): window ring,
// compressor (spec §5.4), indexer top-k (§5.5) and sparse attention (§5.6–5.7),
// matching backend/cpu/attn.go rounding point by rounding point.
#include "common.cuh"

DEV float rbf(float x, int rnd) { return rnd ? bf16_to_f32(f32_to_bf16(x)) : x; }
DEV float exp32(float x) { return (float)exp((double)x); }

// seqs layout: slot, start, row0, rows, blkOff, nblk.
#define SQ(s, f) seqs[(s) * 6 + (f)]
#define NEG_INF __int_as_float(0xff800000)

// Window ring write: rows of a sequence beyond its last W are skipped.
extern "C" __global__ void write_window_f32(
	float* __restrict__ ring, const float* __restrict__ kv, const int* __restrict__ seqs, const int* __restrict__ seqOf,
	int rows, int W, int D)
{
	const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (i >= (long long)rows * D) return;
	const int r = (int)(i / D), d = (int)(i % D);
	const int s = seqOf[r];
	const int k = r - SQ(s, 2);
	if (k < SQ(s, 3) - W) return;
	const int p = SQ(s, 1) + k;
	ring[((size_t)SQ(s, 0) * W + p % W) * D + d] = kv[(size_t)r * D + d];
}

// Slot p of window j (c == 2: slot < r is the "a" half of the previous
// window) as the CPU state holds it when entry j completes: this step's row or
// the pre-step state row (rolled rows for windows completed before the step).
DEV void comp_slot(const float* A, const float* Z, const float* ape, const float* sA, const float* sZ,
	int start, int row0, int r, int dc, int c, int j, int s, int ch, float* a, float* z)
{
	const int w = c * dc;
	int p, half;
	if (c == 2 && s < r) { p = (j - 1) * r + s; half = 0; }
	else { p = j * r + (c == 2 ? s - r : s); half = c == 2 ? dc : 0; }
	if (p < 0) { // window -1: the pre-step "previous" rows (reset state)
		*a = sA[(size_t)s * w + ch];
		*z = sZ[(size_t)s * w + ch];
		return;
	}
	if (p >= start) {
		const size_t o = (size_t)(row0 + p - start) * w + half + ch;
		*a = A[o];
		*z = Z[o] + ape[(size_t)(p % r) * w + half + ch];
		return;
	}
	int sr = p % r;
	if (c == 2 && !((p / r + 1) * r - 1 < start)) sr += r; // still the current window pre-step
	*a = sA[(size_t)sr * w + half + ch];
	*z = sZ[(size_t)sr * w + half + ch];
}

DEV double block_sum_d(double v, double* red) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads();
	if (lane == 0) red[wi] = v;
	__syncthreads();
	double t = 0;
	for (int i = 0; i < nw; i++) t += red[i];
	return t;
}

// One CTA per completed entry (ents: seq index, entry j): pool → bf16 → RMSNorm
// → RoPE at j·r → FP8 (kind 0) or Hadamard+FP4 (kind 1) → store. smem: dc floats.
extern "C" __global__ void __launch_bounds__(256) compress_f32(
	float* __restrict__ dst, const float* __restrict__ A, const float* __restrict__ Z, const float* __restrict__ ape,
	const float* __restrict__ stA, const float* __restrict__ stZ, const float* __restrict__ norm,
	const float* __restrict__ rf32, const double* __restrict__ rf64,
	const int* __restrict__ seqs, const int* __restrict__ blocks, const int* __restrict__ ents,
	int r, int dc, int c, int per, int rd, float eps, int kind, int faithful)
{
	extern __shared__ float u[];
	__shared__ double redd[32];
	const int si = ents[2 * blockIdx.x], j = ents[2 * blockIdx.x + 1];
	const int slot = SQ(si, 0), start = SQ(si, 1), row0 = SQ(si, 2);
	const int w = c * dc;
	const size_t stN = (size_t)c * r * w;
	const float* sA = stA + (size_t)slot * stN;
	const float* sZ = stZ + (size_t)slot * stN;
	const int ns = c * r;
	for (int ch = threadIdx.x; ch < dc; ch += blockDim.x) {
		float a, z, mx = NEG_INF, den = 0.0f, acc = 0.0f;
		for (int s = 0; s < ns; s++) {
			comp_slot(A, Z, ape, sA, sZ, start, row0, r, dc, c, j, s, ch, &a, &z);
			mx = fmaxf(mx, z);
		}
		for (int s = 0; s < ns; s++) {
			comp_slot(A, Z, ape, sA, sZ, start, row0, r, dc, c, j, s, ch, &a, &z);
			den += exp32(z - mx);
		}
		for (int s = 0; s < ns; s++) {
			comp_slot(A, Z, ape, sA, sZ, start, row0, r, dc, c, j, s, ch, &a, &z);
			float p = exp32(z - mx) / den;
			acc += a * p;
		}
		u[ch] = rbf(acc, faithful);
	}
	// RMSNorm (float64 sum of squares, as the CPU).
	double ss = 0;
	for (int ch = threadIdx.x; ch < dc; ch += blockDim.x) ss += (double)u[ch] * (double)u[ch];
	ss = block_sum_d(ss, redd);
	const float mean = (float)(ss / (double)dc);
	const float rr = (float)(1.0 / sqrt((double)(mean + eps)));
	__syncthreads();
	for (int ch = threadIdx.x; ch < dc; ch += blockDim.x) u[ch] = rbf(norm[ch] * (u[ch] * rr), faithful);
	__syncthreads();
	// RoPE at position j·r on the last rd dims.
	const int pos = j * r;
	for (int p = threadIdx.x; p < rd / 2; p += blockDim.x) {
		float* v = u + dc - rd + 2 * p;
		if (faithful) {
			float ang = (float)pos * rf32[p];
			float cs = (float)cos((double)ang), sn = (float)sin((double)ang);
			float x0 = v[0], x1 = v[1];
			float p00 = x0 * cs, p11 = x1 * sn, p01 = x0 * sn, p10 = x1 * cs;
			v[0] = bf16_to_f32(f32_to_bf16(p00 - p11));
			v[1] = bf16_to_f32(f32_to_bf16(p01 + p10));
		} else {
			double ang = (double)pos * rf64[p];
			double cs = cos(ang), sn = sin(ang);
			double x0 = v[0], x1 = v[1];
			v[0] = (float)(x0 * cs - x1 * sn);
			v[1] = (float)(x0 * sn + x1 * cs);
		}
	}
	__syncthreads();
	if (kind == 1) {
		// Sylvester Walsh–Hadamard, same butterfly order as the CPU, then n^-1/2.
		for (int h = 1; h < dc; h *= 2) {
			for (int q = threadIdx.x; q < dc / 2; q += blockDim.x) {
				const int i = (q / h) * 2 * h + q % h;
				float a = u[i], b = u[i + h];
				u[i] = a + b;
				u[i + h] = a - b;
			}
			__syncthreads();
		}
		const float sc = (float)(1.0 / sqrt((double)dc));
		for (int ch = threadIdx.x; ch < dc; ch += blockDim.x) u[ch] = rbf(u[ch] * sc, faithful);
		__syncthreads();
		if (faithful) { // FP4 per 32 (one warp per block of 32)
			const int lane = threadIdx.x & 31;
			for (int b0 = (threadIdx.x >> 5) * 32; b0 < dc; b0 += blockDim.x) {
				const int i = b0 + lane;
				float v = i < dc ? u[i] : 0.0f;
				float am = fabsf(v);
				for (int o = 16; o > 0; o >>= 1) {
					float t = __shfl_xor_sync(0xffffffffu, am, o);
					if (t > am || t != t) am = t;
				}
				am = fmaxf(am, 6.0f * 1.1754943508222875e-38f);
				float ratio = am * (1.0f / 6.0f);
				u32 bits = __float_as_uint(ratio);
				int e = (int)((bits >> 23) & 0xff) - 127;
				if ((bits & 0x7fffff) != 0) e++;
				const float s = __uint_as_float((u32)(max(-126, min(127, e)) + 127) << 23);
				if (i < dc) {
					float q = fminf(fmaxf(v / s, -6.0f), 6.0f);
					float aq = fabsf(q);
					float m;
					if (!(q == q)) m = 0.0f;
					else if (aq <= 0.25f) m = 0.0f;
					else if (aq < 0.75f) m = 0.5f;
					else if (aq <= 1.25f) m = 1.0f;
					else if (aq < 1.75f) m = 1.5f;
					else if (aq <= 2.5f) m = 2.0f;
					else if (aq < 3.5f) m = 3.0f;
					else if (aq <= 5.0f) m = 4.0f;
					else m = 6.0f;
					if (q == q && (__float_as_uint(q) >> 31)) m = -m;
					u[i] = m * s;
				}
			}
		}
	} else if (faithful) { // FP8 per 64 over the nope dims
		const int nope = dc - rd;
		const int lane = threadIdx.x & 31;
		for (int b0 = (threadIdx.x >> 5) * 64; b0 < nope; b0 += (blockDim.x >> 5) * 64) {
			const int n = min(64, nope - b0);
			float am = 0.0f;
			for (int i = lane; i < n; i += 32) {
				float a = fabsf(u[b0 + i]);
				if (a > am || a != a) am = a;
			}
			for (int o = 16; o > 0; o >>= 1) {
				float t = __shfl_xor_sync(0xffffffffu, am, o);
				if (t > am || t != t) am = t;
			}
			am = fmaxf(am, 1e-4f);
			float ratio = am * (1.0f / 448.0f);
			u32 bits = __float_as_uint(ratio);
			int e = (int)((bits >> 23) & 0xff) - 127;
			if ((bits & 0x7fffff) != 0) e++;
			const float s = __uint_as_float((u32)(max(-126, min(127, e)) + 127) << 23);
			for (int i = lane; i < n; i += 32) {
				float q = fminf(fmaxf(u[b0 + i] / s, -448.0f), 448.0f);
				u[b0 + i] = e4m3_to_f32(f32_to_e4m3(q)) * s;
			}
		}
	}
	__syncthreads();
	const int blk = blocks[SQ(si, 4) + j / per];
	float* o = dst + ((size_t)blk * per + j % per) * dc;
	for (int ch = threadIdx.x; ch < dc; ch += blockDim.x) o[ch] = u[ch];
}

// Post-step compressor state, one thread per (sequence, s < r, channel of c·Dc):
// row s (c == 1) or rows s and r+s (c == 2) exactly as the CPU leaves them.
extern "C" __global__ void compress_state_f32(
	float* __restrict__ stA, float* __restrict__ stZ, const float* __restrict__ A, const float* __restrict__ Z,
	const float* __restrict__ ape, const int* __restrict__ seqs, int r, int dc, int c)
{
	const int w = c * dc;
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= r * w) return;
	const int s = i / w, ch = i % w;
	const int si = blockIdx.y;
	const int slot = SQ(si, 0), start = SQ(si, 1), row0 = SQ(si, 2), rows = SQ(si, 3);
	if (rows <= 0) return;
	const int E = start + rows;
	float* sA = stA + (size_t)slot * c * r * w;
	float* sZ = stZ + (size_t)slot * c * r * w;
	const int cur = c == 2 ? r + s : s; // row that takes positions ≡ s (mod r)
	const float oa = sA[(size_t)cur * w + ch], oz = sZ[(size_t)cur * w + ch];
	// Latest position ≡ s below E.
	float na = oa, nz = oz;
	if (E - 1 >= s) {
		const int p = E - 1 - ((E - 1 - s) % r);
		if (p >= start) {
			na = A[(size_t)(row0 + p - start) * w + ch];
			nz = Z[(size_t)(row0 + p - start) * w + ch] + ape[(size_t)s * w + ch];
		}
	}
	if (c == 2) {
		const int jc = E / r; // completed windows; the last roll copied window jc-1
		if (jc >= 1 && jc * r - 1 >= start) {
			const int p = (jc - 1) * r + s;
			float pa = oa, pz = oz; // pre-step current row
			if (p >= start) {
				pa = A[(size_t)(row0 + p - start) * w + ch];
				pz = Z[(size_t)(row0 + p - start) * w + ch] + ape[(size_t)s * w + ch];
			}
			sA[(size_t)s * w + ch] = pa;
			sZ[(size_t)s * w + ch] = pz;
		}
	}
	sA[(size_t)cur * w + ch] = na;
	sZ[(size_t)cur * w + ch] = nz;
}

// Indexer scores, one warp per (row, entry j < (t+1)/ratio): Σ_h rb(max(rb(q_h·k), 0)·w_h), rb'd.
extern "C" __global__ void indexer_scores_f32(
	float* __restrict__ scores, const float* __restrict__ q, const float* __restrict__ wt, const float* __restrict__ ik,
	const int* __restrict__ seqs, const int* __restrict__ pos, const int* __restrict__ seqOf, const int* __restrict__ blocks,
	int ld, int heads, int hd, int ratio, int per, int faithful)
{
	const int row = blockIdx.y;
	const int lane = threadIdx.x & 31;
	const int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	const int avail = (pos[row] + 1) / ratio;
	if (j >= avail) return;
	const int si = seqOf[row];
	const float* key = ik + ((size_t)blocks[SQ(si, 4) + j / per] * per + j % per) * hd;
	const float* qr = q + (size_t)row * heads * hd;
	float acc = 0.0f;
	for (int h = 0; h < heads; h++) {
		float d = 0.0f;
		for (int i = lane; i < hd; i += 32) d += qr[h * hd + i] * key[i];
		d = warp_sum(d);
		d = rbf(d, faithful);
		d = fmaxf(d, 0.0f);
		acc += rbf(d * wt[(size_t)row * heads + h], faithful);
	}
	if (lane == 0) scores[(size_t)row * ld + j] = rbf(acc, faithful);
}

DEV u32 ord_key(float f) {
	u32 u = __float_as_uint(f);
	if ((u & 0x7fffffffu) == 0u) u = 0u; // -0 ties with +0, as the CPU's comparison
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Per-row top-k (descending, ties → lower index, -1 padded), one CTA of 1024
// threads per row: radix select of the k-th key, gather, bitonic sort of
// 64-bit (key << 32 | ~index). smem: P (pow2 ≥ k) u64.
extern "C" __global__ void __launch_bounds__(1024) indexer_topk_f32(
	int* __restrict__ out, const float* __restrict__ scores, const int* __restrict__ pos, int ld, int topk, int ratio, int P)
{
	extern __shared__ u64 cand[];
	__shared__ int hist[256];
	__shared__ u32 sPrefix, sMask;
	__shared__ int sNeed, sCnt;
	const int row = blockIdx.x;
	const int avail = (pos[row] + 1) / ratio;
	const int k = min(topk, avail);
	const float* sc = scores + (size_t)row * ld;
	const int tid = threadIdx.x, nt = blockDim.x;
	if (tid == 0) { sPrefix = 0; sMask = 0; sNeed = k; sCnt = 0; }
	__syncthreads();
	if (k < avail) {
		for (int shift = 24; shift >= 0; shift -= 8) {
			for (int i = tid; i < 256; i += nt) hist[i] = 0;
			__syncthreads();
			const u32 pre = sPrefix, msk = sMask;
			for (int j = tid; j < avail; j += nt) {
				u32 key = ord_key(sc[j]);
				if ((key & msk) == pre) atomicAdd(&hist[(key >> shift) & 255], 1);
			}
			__syncthreads();
			if (tid == 0) {
				int need = sNeed, above = 0, d = 255;
				for (; d > 0; d--) {
					if (above + hist[d] >= need) break;
					above += hist[d];
				}
				sNeed = need - above;
				sPrefix = pre | ((u32)d << shift);
				sMask = msk | (255u << shift);
			}
			__syncthreads();
		}
	}
	const u32 T = sPrefix;
	const bool all = k >= avail;
	// Keys above T (all keys when everything is selected).
	for (int j = tid; j < avail; j += nt) {
		u32 key = ord_key(sc[j]);
		if (all || key > T) {
			int c = atomicAdd(&sCnt, 1);
			cand[c] = ((u64)key << 32) | (u64)(~(u32)j);
		}
	}
	__syncthreads();
	if (!all) { // ties at T: the lowest indices
		__shared__ int wcnt[32];
		int taken = 0;
		const int need = sNeed;
		for (int b0 = 0; b0 < avail && taken < need; b0 += nt) {
			const int j = b0 + tid;
			const bool f = j < avail && ord_key(sc[j]) == T;
			const u32 bal = __ballot_sync(0xffffffffu, f);
			const int lane = tid & 31, wi = tid >> 5;
			if (lane == 0) wcnt[wi] = __popc(bal);
			__syncthreads();
			int before = 0, tot = 0;
			for (int i = 0; i < (nt >> 5); i++) {
				if (i < wi) before += wcnt[i];
				tot += wcnt[i];
			}
			const int rank = taken + before + __popc(bal & ((1u << lane) - 1u));
			const int base = sCnt;
			if (f && rank < need) cand[base + rank] = ((u64)T << 32) | (u64)(~(u32)j);
			__syncthreads();
			taken += tot;
		}
		__syncthreads();
	}
	for (int i = k + tid; i < P; i += nt) cand[i] = 0;
	__syncthreads();
	// Bitonic sort, descending.
	for (int size = 2; size <= P; size <<= 1) {
		for (int stride = size >> 1; stride > 0; stride >>= 1) {
			for (int i = tid; i < P; i += nt) {
				const int l = i ^ stride;
				if (l > i) {
					const bool desc = (i & size) == 0;
					u64 a = cand[i], b = cand[l];
					if (desc ? a < b : a > b) { cand[i] = b; cand[l] = a; }
				}
			}
			__syncthreads();
		}
	}
	for (int i = tid; i < topk; i += nt) out[(size_t)row * topk + i] = i < k ? (int)(~(u32)(cand[i] & 0xffffffffu)) : -1;
}

// Sparse MQA with sink, one warp per (row, head): window keys (this step's kv
// or the ring), padding, compressed entries; online softmax per 64 slots.
#define ATT_MAXV 32
extern "C" __global__ void __launch_bounds__(128) sparse_attn_f32(
	float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ kv, const float* __restrict__ ring,
	const float* __restrict__ ent, const int* __restrict__ sel, int selCols, const float* __restrict__ sink,
	const int* __restrict__ seqs, const int* __restrict__ pos, const int* __restrict__ seqOf, const int* __restrict__ blocks,
	int rows, int H, int D, int W, int ratio, int per, float scale, int faithful)
{
	__shared__ float scs[4][64];
	const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
	const long long g = (long long)blockIdx.x * 4 + wi;
	if (g >= (long long)rows * H) return;
	const int row = (int)(g / H), h = (int)(g % H);
	const int si = seqOf[row];
	const int slot = SQ(si, 0), start = SQ(si, 1), row0 = SQ(si, 2), nrows = SQ(si, 3);
	const int blkOff = SQ(si, 4), nblk = SQ(si, 5);
	const int t = pos[row];
	const int p0 = max(0, t - W + 1);
	const int nwin = t - p0 + 1;
	const int wslots = start == 0 ? min(nrows, W) : W;
	const int winLen = max(nwin, wslots);
	int ncomp = 0;
	if (ratio == 128) ncomp = (t + 1) / 128;
	else if (ratio == 4) ncomp = selCols;
	const int nkeys = winLen + ncomp;
	const float* qh = q + (size_t)row * H * D + (size_t)h * D;
	const int nv = D / 32;
	float qv[ATT_MAXV], acc[ATT_MAXV];
	for (int v = 0; v < nv; v++) { qv[v] = qh[lane + 32 * v]; acc[v] = 0.0f; }
	float m = NEG_INF, l = 0.0f;
	for (int b0 = 0; b0 < nkeys; b0 += 64) {
		const int n = min(64, nkeys - b0);
		float bm = NEG_INF;
		for (int i = 0; i < n; i++) {
			const int ki = b0 + i;
			const float* kk = nullptr;
			if (ki < nwin) {
				const int p = p0 + ki;
				kk = p >= start ? kv + (size_t)(row0 + p - start) * D : ring + ((size_t)slot * W + p % W) * D;
			} else if (ki >= winLen) {
				int j = ki - winLen;
				if (ratio == 4) {
					j = sel[(size_t)row * selCols + j];
					if (j < 0 || j >= (t + 1) / 4) j = -1;
				}
				if (j >= 0 && j / per < nblk) kk = ent + ((size_t)blocks[blkOff + j / per] * per + j % per) * D;
			}
			float s = NEG_INF;
			if (kk) {
				float d = 0.0f;
				for (int v = 0; v < nv; v++) d += qv[v] * kk[lane + 32 * v];
				s = warp_sum(d) * scale;
				bm = fmaxf(bm, s);
			}
			if (lane == 0) scs[wi][i] = kk ? s : __int_as_float(0x7fc00000); // NaN marks an empty slot
		}
		__syncwarp();
		const float mn = fmaxf(m, bm);
		if (mn == NEG_INF) { __syncwarp(); continue; }
		const float alpha = exp32(m - mn);
		l *= alpha;
		for (int v = 0; v < nv; v++) acc[v] *= alpha;
		for (int i = 0; i < n; i++) {
			const float s = scs[wi][i];
			if (s != s) continue;
			const int ki = b0 + i;
			const float* kk;
			if (ki < nwin) {
				const int p = p0 + ki;
				kk = p >= start ? kv + (size_t)(row0 + p - start) * D : ring + ((size_t)slot * W + p % W) * D;
			} else {
				int j = ki - winLen;
				if (ratio == 4) j = sel[(size_t)row * selCols + j];
				kk = ent + ((size_t)blocks[blkOff + j / per] * per + j % per) * D;
			}
			float p = exp32(s - mn);
			l += p;
			p = rbf(p, faithful);
			for (int v = 0; v < nv; v++) acc[v] += p * kk[lane + 32 * v];
		}
		m = mn;
		__syncwarp();
	}
	l += exp32(sink[h] - m);
	float* o = out + (size_t)row * H * D + (size_t)h * D;
	for (int v = 0; v < nv; v++) o[lane + 32 * v] = rbf(acc[v] / l, faithful);
}
