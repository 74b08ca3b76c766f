// KV-store ops of the GPU backend (backend/gpu kv.go, attn.go): window ring,
// compressor (spec §5.4), indexer top-k (§5.5) and sparse attention (§5.6–5.7),
// matching backend/cpu/attn.go rounding point by rounding point. The *_kv8
// variants keep the cache in the compact formats of kvcache/format.go
// (kvfmt.cuh): writers encode on the device, readers decode in the kernel.
#include "common.cuh"
#include "kvfmt.cuh"

DEV float exp32(float x) { return (float)exp((double)x); }
DEV float4 f4zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// seqs layout: slot, start, row0, rows, blkOff, nblk.
#define SQ(s, f) seqs[(s) * 6 + (f)]
#define NEG_INF __int_as_float(0xff800000)

// Window ring write (W: the ring's entries, window + slack): rows of a
// sequence beyond its last W are skipped.
extern "C" __global__ void write_window_f32(
	float* __restrict__ ring, const float* __restrict__ kv, const int* __restrict__ seqs, const int* __restrict__ seqOf,
	int rows, int W, int D)
{
	PDL_ENTRY();
	const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (i >= (long long)rows * D) return;
	const int r = (int)(i / D), d = (int)(i % D);
	const int s = seqOf[r];
	const int k = r - SQ(s, 2);
	if (k < SQ(s, 3) - W) return;
	const int p = SQ(s, 1) + k;
	ring[((size_t)SQ(s, 0) * W + p % W) * D + d] = kv[(size_t)r * D + d];
}

// Compact ring (entries of eb bytes, D = nope + rope): one warp per row
// encodes it into its slot.
extern "C" __global__ void write_window_kv8(
	u8* __restrict__ ring, const float* __restrict__ kv, const int* __restrict__ seqs, const int* __restrict__ seqOf,
	int rows, int W, int D, int nope, int eb)
{
	PDL_ENTRY();
	const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (r >= rows) return; // uniform over the warp
	const int s = seqOf[r];
	const int k = r - SQ(s, 2);
	if (k < SQ(s, 3) - W) return;
	const int p = SQ(s, 1) + k;
	enc_entry_warp(ring + ((size_t)SQ(s, 0) * W + p % W) * eb, kv + (size_t)r * D, nope, D - nope, eb, threadIdx.x & 31);
}

// Slot s of the window that completes entry j: position p = (j+1)·r - c·r + s
// (c == 2: s < r is the "a" half of the previous window), oldest first as the
// CPU pools them. This step's row when p >= start, else the state's ring row
// p mod L (L = c·r + slack rows; positions below 0 read rows never written
// since the reset).
DEV void comp_slot(const float* A, const float* Z, const float* ape, const float* sA, const float* sZ,
	int start, int row0, int r, int dc, int c, int L, int j, int s, int ch, float* a, float* z)
{
	const int w = c * dc;
	const int p = (j + 1 - c) * r + s;
	const int half = c == 2 && s >= r ? dc : 0;
	if (p >= start) {
		const size_t o = (size_t)(row0 + p - start) * w + half + ch;
		*a = A[o];
		*z = Z[o] + ape[(size_t)(p % r) * w + half + ch];
		return;
	}
	const int sr = (p % L + L) % L;
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

// One CTA per row; the row at position p completes entry j = (p+1)/r - 1 of
// its sequence when (p+1) % r == 0 (every entry completes at exactly one row),
// the others exit: pool → bf16 → RMSNorm → RoPE at j·r → FP8 (kind 0) or
// Hadamard+FP4 (kind 1) → store: fp32 [dc], or with eb > 0 (faithful) the
// compact entry (kind 0) or index key (kind 1) of eb bytes. smem: dc floats.
// Everything is read from the device, so a recorded step replays for any
// positions.
extern "C" __global__ void __launch_bounds__(256) compress_f32(
	void* __restrict__ dst, const float* __restrict__ A, const float* __restrict__ Z, const float* __restrict__ ape,
	const float* __restrict__ stA, const float* __restrict__ stZ, const float* __restrict__ norm,
	const float* __restrict__ rf32, const double* __restrict__ rf64,
	const int* __restrict__ seqs, const int* __restrict__ blocks, const int* __restrict__ rowPos, const int* __restrict__ seqOf,
	int r, int dc, int c, int per, int rd, float eps, int kind, int faithful, int eb, int L)
{
	PDL_ENTRY();
	extern __shared__ float u[];
	__shared__ double redd[32];
	const int p = rowPos[blockIdx.x];
	if ((p + 1) % r != 0) return;
	const int si = seqOf[blockIdx.x], j = (p + 1) / r - 1;
	const int slot = SQ(si, 0), start = SQ(si, 1), row0 = SQ(si, 2);
	const int w = c * dc;
	const size_t stN = (size_t)L * w;
	const float* sA = stA + (size_t)slot * stN;
	const float* sZ = stZ + (size_t)slot * stN;
	const int ns = c * r;
	for (int ch = threadIdx.x; ch < dc; ch += blockDim.x) {
		float a, z, mx = NEG_INF, den = 0.0f, acc = 0.0f;
		for (int s = 0; s < ns; s++) {
			comp_slot(A, Z, ape, sA, sZ, start, row0, r, dc, c, L, j, s, ch, &a, &z);
			mx = fmaxf(mx, z);
		}
		for (int s = 0; s < ns; s++) {
			comp_slot(A, Z, ape, sA, sZ, start, row0, r, dc, c, L, j, s, ch, &a, &z);
			den += exp32(z - mx);
		}
		for (int s = 0; s < ns; s++) {
			comp_slot(A, Z, ape, sA, sZ, start, row0, r, dc, c, L, j, s, ch, &a, &z);
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
	const size_t e = (size_t)blk * per + j % per;
	if (eb > 0) {
		if (threadIdx.x < 32) {
			u8* o = static_cast<u8*>(dst) + e * eb;
			if (kind == 1) enc_index_warp(o, u, dc, eb, threadIdx.x);
			else enc_entry_warp(o, u, dc - rd, rd, eb, threadIdx.x);
		}
		return;
	}
	float* o = static_cast<float*>(dst) + e * dc;
	for (int ch = threadIdx.x; ch < dc; ch += blockDim.x) o[ch] = u[ch];
}

// Post-step compressor state, one thread per (sequence, ring row l < L,
// channel of c·Dc): row l takes this step's latest position p ≡ l (mod L),
// as the CPU leaves it; rows no position of the step maps to stay.
extern "C" __global__ void compress_state_f32(
	float* __restrict__ stA, float* __restrict__ stZ, const float* __restrict__ A, const float* __restrict__ Z,
	const float* __restrict__ ape, const int* __restrict__ seqs, int r, int dc, int c, int L)
{
	PDL_ENTRY();
	const int w = c * dc;
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= L * w) return;
	const int l = i / w, ch = i % w;
	const int si = blockIdx.y;
	const int slot = SQ(si, 0), start = SQ(si, 1), row0 = SQ(si, 2), rows = SQ(si, 3);
	const int E = start + rows;
	if (rows <= 0 || E - 1 < l) return;
	const int p = E - 1 - (E - 1 - l) % L;
	if (p < start) return;
	const size_t o = (size_t)slot * L * w + (size_t)l * w + ch;
	stA[o] = A[(size_t)(row0 + p - start) * w + ch];
	stZ[o] = Z[(size_t)(row0 + p - start) * w + ch] + ape[(size_t)(p % r) * w + ch];
}

// Indexer scores: scores[row, j] = rb(Σ_h rb(max(rb(q_h·k_j), 0)·w_h)) for the
// entries j < (t+1)/ratio of every row (later entries are not written).
// Grid (rows, tile groups), IX_THREADS threads, dynamic smem (floats):
// q of the row [heads][hdp], keys of a tile of IX_TE entries [IX_TE][hdp]
// (hdp = hd rounded up to 4, padded to an odd number of 16-byte units so
// float4 reads of consecutive rows hit distinct banks), w of the row [heads]
// and the per-(entry, head) terms [IX_TE][heads+1]. q is staged once per
// block, which then walks its row's tiles j0 = blockIdx.y*IX_TE, +gridDim.y*IX_TE...
// Each thread computes 2 heads x 4 entries dots at once (q and key reuse in
// registers), each dot as 4 strided partial sums (i % 4) combined as
// (s0 + s1) + (s2 + s3) like the CPU's dot, in fp32 with FMA; then one thread
// per entry adds the terms in ascending h, sequential fp32 adds as the CPU.
// Keys are kb bytes apart: fp32 (kb = 4·hd), or compact (CPT: kvfmt.cuh,
// hd % 8 == 0), decoded to the same fp32 values while staged.
#define IX_TE 16
#define IX_THREADS 128

template <bool CPT>
DEV void indexer_scores_body(
	float* __restrict__ scores, const float* __restrict__ q, const float* __restrict__ wt, const u8* __restrict__ ik,
	const int* __restrict__ seqs, const int* __restrict__ pos, const int* __restrict__ seqOf, const int* __restrict__ blocks,
	int ld, int heads, int hd, int ratio, int per, int kstride, int faithful)
{
	extern __shared__ __align__(16) float ix_smem[];
	__shared__ long long koff[IX_TE]; // byte offsets in ik of the tile's keys (-1: none)
	const int row = blockIdx.x;
	const int tid = threadIdx.x, nt = blockDim.x;
	const int lim = min((pos[row] + 1) / ratio, ld);
	if ((int)blockIdx.y * IX_TE >= lim) return; // uniform over the block, before any barrier
	const int* bt = blocks + SQ(seqOf[row], 4);  // in flight while q is staged
	const int hd4 = (hd + 3) & ~3;
	const int hdp = ((hd4 >> 2) | 1) << 2;
	float* qs = ix_smem;
	float* ks = qs + (size_t)heads * hdp;
	float* ws = ks + IX_TE * hdp;
	float* vs = ws + heads;
	const bool vec = (hd & 3) == 0 && (((size_t)q | (CPT ? 0 : (size_t)ik)) & 15) == 0;
	const float* qr = q + (size_t)row * heads * hd;
	if (vec) { // cp.async: every copy of the block is in flight at once
		const int c4 = hd >> 2;
		for (int idx = tid; idx < heads * c4; idx += nt) {
			const int h = idx / c4, c = idx - h * c4;
			cp_async16(qs + h * hdp + 4 * c, qr + 4 * (size_t)idx, 16);
		}
	} else {
		for (int idx = tid; idx < heads * hd4; idx += nt) {
			const int h = idx / hd4, i = idx - h * hd4;
			qs[h * hdp + i] = i < hd ? qr[(size_t)h * hd + i] : 0.0f;
		}
	}
	for (int h = tid; h < heads; h += nt) ws[h] = wt[(size_t)row * heads + h];
	const int HG = (heads + 1) >> 1; // head groups: heads hg and hg + HG
	for (int j0 = blockIdx.y * IX_TE; j0 < lim; j0 += gridDim.y * IX_TE) {
		// Keys of entries j0..j0+IX_TE-1 (zeros past lim: computed, never
		// written). Their offsets first, so no copy waits on a block lookup.
		if (tid < IX_TE) {
			const int j = j0 + tid;
			koff[tid] = j < lim ? ((long long)bt[j / per] * per + j % per) * kstride : -1;
		}
		__syncthreads();
		if (CPT) {
			const int c8 = hd >> 3;
			for (int idx = tid; idx < IX_TE * c8; idx += nt) {
				const int e = idx / c8, c = idx - e * c8;
				const long long o = koff[e];
				float4 lo = f4zero(), hi = f4zero();
				if (o >= 0) ld_index8(ik + o, c, hd, lo, hi);
				float4* d = reinterpret_cast<float4*>(ks + e * hdp + 8 * c);
				d[0] = lo;
				d[1] = hi;
			}
			if (vec) { // q's copies, on the first tile
				cp_async_commit();
				cp_async_wait<0>();
			}
		} else if (vec) {
			const int c4 = hd >> 2;
			for (int idx = tid; idx < IX_TE * c4; idx += nt) {
				const int e = idx / c4, c = idx - e * c4;
				const long long o = koff[e];
				cp_async16(ks + e * hdp + 4 * c, o >= 0 ? ik + o + 16 * c : ik, o >= 0 ? 16 : 0); // 0: zero fill
			}
			cp_async_commit(); // with the q copies on the first tile
			cp_async_wait<0>();
		} else {
			for (int idx = tid; idx < IX_TE * hd4; idx += nt) {
				const int e = idx / hd4, i = idx - e * hd4;
				const long long o = koff[e];
				ks[e * hdp + i] = o >= 0 && i < hd ? reinterpret_cast<const float*>(ik + o)[i] : 0.0f;
			}
		}
		__syncthreads();
		for (int t = tid; t < HG * (IX_TE / 4); t += nt) {
			const int hg = t % HG, eg = t / HG;
			const float* q0 = qs + hg * hdp;
			const float* q1 = qs + min(hg + HG, heads - 1) * hdp;
			const float* kb = ks + eg * 4 * hdp;
			float4 s[2][4];
#pragma unroll
			for (int m = 0; m < 2; m++)
#pragma unroll
				for (int n = 0; n < 4; n++) s[m][n] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 2
			for (int c = 0; c < hd4; c += 4) {
				const float4 a[2] = {*reinterpret_cast<const float4*>(q0 + c), *reinterpret_cast<const float4*>(q1 + c)};
#pragma unroll
				for (int n = 0; n < 4; n++) {
					const float4 b = *reinterpret_cast<const float4*>(kb + n * hdp + c);
#pragma unroll
					for (int m = 0; m < 2; m++) {
						s[m][n].x = fmaf(a[m].x, b.x, s[m][n].x);
						s[m][n].y = fmaf(a[m].y, b.y, s[m][n].y);
						s[m][n].z = fmaf(a[m].z, b.z, s[m][n].z);
						s[m][n].w = fmaf(a[m].w, b.w, s[m][n].w);
					}
				}
			}
#pragma unroll
			for (int m = 0; m < 2; m++) {
				const int h = hg + m * HG;
				if (h >= heads) continue; // odd heads: the last group has one
				const float wh = ws[h];
#pragma unroll
				for (int n = 0; n < 4; n++) {
					float d = (s[m][n].x + s[m][n].y) + (s[m][n].z + s[m][n].w);
					d = fmaxf(rbf(d, faithful), 0.0f);
					vs[(eg * 4 + n) * (heads + 1) + h] = rbf(d * wh, faithful);
				}
			}
		}
		__syncthreads();
		if (tid < IX_TE && j0 + tid < lim) {
			const float* vr = vs + tid * (heads + 1);
			float acc = 0.0f;
#pragma unroll 8
			for (int h = 0; h < heads; h++) acc += vr[h];
			scores[(size_t)row * ld + j0 + tid] = rbf(acc, faithful);
		}
		__syncthreads(); // ks and vs are rewritten by the next tile
	}
}

#define IX_ARGS                                                                                                     \
	float* __restrict__ scores, const float* __restrict__ q, const float* __restrict__ wt, const u8* __restrict__ ik, \
		const int* __restrict__ seqs, const int* __restrict__ pos, const int* __restrict__ seqOf,                     \
		const int* __restrict__ blocks, int ld, int heads, int hd, int ratio, int per, int kstride, int faithful

extern "C" __global__ void __launch_bounds__(IX_THREADS) indexer_scores_f32(IX_ARGS)
{
	PDL_ENTRY();
	indexer_scores_body<false>(scores, q, wt, ik, seqs, pos, seqOf, blocks, ld, heads, hd, ratio, per, kstride, faithful);
}

extern "C" __global__ void __launch_bounds__(IX_THREADS) indexer_scores_kv8(IX_ARGS)
{
	PDL_ENTRY();
	indexer_scores_body<true>(scores, q, wt, ik, seqs, pos, seqOf, blocks, ld, heads, hd, ratio, per, kstride, faithful);
}

// Indexer scores on tensor cores (compact keys, faithful, hd = 128, heads a
// multiple of 16 up to 64): the same scores as indexer_scores_kv8, bit for
// bit. An FP4-simulated q block and a key block are small integers times
// powers of two (q: |v/2^eq| <= 12 with eq = ceil(log2(amax/12)); key: twice
// its e2m1 value, times 2^(scale-128)), so their products, each block's sum
// (an exact k32 e4m3 MMA of the integers, fp32 accumulate) and the CPU's fp32
// partial sums are all exact while the four blocks' exponents eq+ek lie
// within IXM_SPREAD of each other (the whole dot then needs at most 15 + 9
// bits): the dot is the exact value, whatever the order. Any other (head,
// entry) (a head that is no such q, a key with a NaN block, a wider spread)
// takes the CPU's order in fp32 from the stored values, as indexer_scores_kv8.
// Grid (rows, tile groups), 4 warps; a tile is IXM_TE entries, warp w's
// 16 of them against all heads. dynamic smem: q codes [heads][IXM_RS],
// key codes [IXM_TE][IXM_RS] (e4m3 bytes, rows padded so the fragment loads
// of 8 rows hit distinct banks), exponents, w and the per-(entry, head) terms.
#define IXM_TE 64
#define IXM_RS 144
#define IXM_ZERO 0x4000 // an all-zero block: adds nothing
#define IXM_BAD 0x2000  // no exact path for the block
#define IXM_SPREAD 9

// e4m3 byte of an integer n, |n| <= 12 (exact).
DEV u32 ixm_e4m3_int(int n) {
	const u32 a = (u32)abs(n);
	if (a == 0) return 0u;
	const int e = 31 - __clz(a);
	return (n < 0 ? 0x80u : 0u) | ((u32)(e + 7) << 3) | ((a << (3 - e)) & 7u);
}

// The fp32 dot of a q head and a stored key in the CPU's order (4 strided
// partial sums), as indexer_scores_kv8.
DEV float ixm_dot_ref(const float* __restrict__ q, const u8* __restrict__ key, int hd) {
	float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
	for (int w = 0; w < hd / 8; w++) {
		float4 lo, hi;
		ld_index8(key, w, hd, lo, hi);
		s0 = fmaf(q[8 * w], lo.x, s0);
		s1 = fmaf(q[8 * w + 1], lo.y, s1);
		s2 = fmaf(q[8 * w + 2], lo.z, s2);
		s3 = fmaf(q[8 * w + 3], lo.w, s3);
		s0 = fmaf(q[8 * w + 4], hi.x, s0);
		s1 = fmaf(q[8 * w + 5], hi.y, s1);
		s2 = fmaf(q[8 * w + 6], hi.z, s2);
		s3 = fmaf(q[8 * w + 7], hi.w, s3);
	}
	return (s0 + s1) + (s2 + s3);
}

// The 8 e4m3 bytes (2 words) of the codes of one e2m1 word, each value doubled.
DEV uint2 ixm_key_word(u32 c) {
	// 2·e2m1 of magnitude codes 0..7 (0, 1, 2, 3, 4, 6, 8, 12) as e4m3 bytes.
	const u32 t0 = 0x44403800u, t1 = 0x54504c48u;
	u32 o[2] = {0u, 0u};
#pragma unroll
	for (int i = 0; i < 8; i++) {
		const u32 q = (c >> (4 * i)) & 15u, m = q & 7u;
		u32 b = ((m < 4 ? t0 : t1) >> (8 * (m & 3))) & 0xffu;
		if (m != 0 && (q & 8u)) b |= 0x80u;
		o[i >> 2] |= b << (8 * (i & 3));
	}
	return make_uint2(o[0], o[1]);
}

extern "C" __global__ void __launch_bounds__(128) indexer_scores_mma(IX_ARGS)
{
	PDL_ENTRY();
	extern __shared__ __align__(16) u8 ixm_smem[];
	__shared__ long long koff[IXM_TE];
	const int row = blockIdx.x;
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const int lim = min((pos[row] + 1) / ratio, ld);
	if ((int)blockIdx.y * IXM_TE >= lim) return; // uniform over the block, before any barrier
	const int* bt = blocks + SQ(seqOf[row], 4);
	u8* qb = ixm_smem;                                         // [heads][IXM_RS]
	u8* kb = qb + heads * IXM_RS;                              // [IXM_TE][IXM_RS]
	int* eq = reinterpret_cast<int*>(kb + IXM_TE * IXM_RS);    // [heads][4]
	int* ek = eq + 4 * heads;                                  // [IXM_TE][4]
	float* ws = reinterpret_cast<float*>(ek + 4 * IXM_TE);     // [heads]
	float* vs = ws + heads;                                    // [IXM_TE][heads+1]
	const float* qr = q + (size_t)row * heads * hd;
	// q: lane l holds values 4l..4l+3 of a head, block l/8.
	for (int h = wid; h < heads; h += 4) {
		const float4 v = *reinterpret_cast<const float4*>(qr + (size_t)h * hd + 4 * lane);
		float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
		for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
		int e = IXM_ZERO;
		bool ok = amax == amax && amax <= KV_FLT_MAX;
		if (ok && amax > 0.0f) {
			e = ceil_log2_bits(amax * (1.0f / 12.0f));
			ok = e >= -100 && e <= 100;
		}
		u32 word = 0u;
		if (ok && e != IXM_ZERO) {
			const float inv = __int_as_float((127 - e) << 23);
			const float x[4] = {v.x * inv, v.y * inv, v.z * inv, v.w * inv};
#pragma unroll
			for (int i = 0; i < 4; i++) {
				ok = ok && x[i] == rintf(x[i]) && fabsf(x[i]) <= 12.0f;
				if (fabsf(x[i]) <= 12.0f) word |= ixm_e4m3_int((int)x[i]) << (8 * i);
			}
		}
		const bool hok = __all_sync(0xffffffffu, ok);
		*reinterpret_cast<u32*>(qb + h * IXM_RS + 4 * lane) = word;
		if ((lane & 7) == 0) eq[4 * h + (lane >> 3)] = hok ? e : IXM_BAD;
	}
	for (int h = tid; h < heads; h += 128) ws[h] = wt[(size_t)row * heads + h];
	const int g = lane >> 2, t = lane & 3;
	for (int j0 = blockIdx.y * IXM_TE; j0 < lim; j0 += gridDim.y * IXM_TE) {
		if (tid < IXM_TE) {
			const int j = j0 + tid;
			koff[tid] = j < lim ? ((long long)bt[j / per] * per + j % per) * kstride : -1;
		}
		__syncthreads();
		{ // thread (entry e, half) converts 2 blocks of the key (zeros past lim)
			const int e = tid >> 1, half = tid & 1;
			const long long o = koff[e];
			u32 c[8];
#pragma unroll
			for (int i = 0; i < 8; i++) c[i] = o >= 0 ? *reinterpret_cast<const u32*>(ik + o + 32 * half + 4 * i) : 0u;
			u32 sc2 = o >= 0 ? (u32)ik[o + 64 + 2 * half] | ((u32)ik[o + 65 + 2 * half] << 8) : 0u;
#pragma unroll
			for (int i = 0; i < 8; i++) {
				const uint2 w = ixm_key_word(c[i]);
				*reinterpret_cast<uint2*>(kb + e * IXM_RS + 64 * half + 8 * i) = w;
			}
#pragma unroll
			for (int b = 0; b < 2; b++) {
				const u32 sb = (sc2 >> (8 * b)) & 0xffu;
				const u32 nz = (c[4 * b] | c[4 * b + 1] | c[4 * b + 2] | c[4 * b + 3]) & 0x77777777u;
				ek[4 * e + 2 * half + b] = sb == 0xffu ? IXM_BAD : nz == 0u ? IXM_ZERO : (int)sb - 128;
			}
		}
		__syncthreads();
#pragma unroll 1
		for (int nt = 0; nt < 2; nt++) {
			const int e0 = 16 * wid + 8 * nt;
			u32 bf[4][2];
#pragma unroll
			for (int b = 0; b < 4; b++) {
				const u8* kr = kb + (e0 + g) * IXM_RS + 32 * b + 4 * t;
				bf[b][0] = *reinterpret_cast<const u32*>(kr);
				bf[b][1] = *reinterpret_cast<const u32*>(kr + 16);
			}
#pragma unroll 1
			for (int h0 = 0; h0 < heads; h0 += 16) {
				float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
				int lo[4] = {1 << 20, 1 << 20, 1 << 20, 1 << 20}, hi[4] = {-(1 << 20), -(1 << 20), -(1 << 20), -(1 << 20)};
				u32 bad = 0u; // bit i: pair i takes the fp32 path
#pragma unroll
				for (int b = 0; b < 4; b++) {
					const u8* qa = qb + (h0 + g) * IXM_RS + 32 * b + 4 * t;
					const u32 af[4] = {*reinterpret_cast<const u32*>(qa), *reinterpret_cast<const u32*>(qa + 8 * IXM_RS),
						*reinterpret_cast<const u32*>(qa + 16), *reinterpret_cast<const u32*>(qa + 8 * IXM_RS + 16)};
					float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
					mma_k32(c4, af, bf[b]);
#pragma unroll
					for (int i = 0; i < 4; i++) {
						const int h = h0 + g + 8 * (i >> 1), e = e0 + 2 * t + (i & 1);
						const int a = eq[4 * h + b], k = ek[4 * e + b];
						if (a == IXM_BAD || k == IXM_BAD) {
							bad |= 1u << i;
						} else if (a != IXM_ZERO && k != IXM_ZERO) {
							const int x = a + k;
							lo[i] = min(lo[i], x);
							hi[i] = max(hi[i], x);
							if (x >= -120 && x <= 100) sum[i] += c4[i] * __int_as_float((x + 127) << 23);
						}
					}
				}
#pragma unroll
				for (int i = 0; i < 4; i++) {
					const int h = h0 + g + 8 * (i >> 1), e = e0 + 2 * t + (i & 1);
					float d = sum[i];
					if ((bad >> i & 1u) || (hi[i] >= lo[i] && (hi[i] - lo[i] > IXM_SPREAD || lo[i] < -120 || hi[i] > 100))) {
						const long long o = koff[e];
						d = o >= 0 ? ixm_dot_ref(qr + (size_t)h * hd, ik + o, hd) : 0.0f;
					}
					d = fmaxf(rbf(d, 1), 0.0f);
					vs[e * (heads + 1) + h] = rbf(d * ws[h], 1);
				}
			}
		}
		__syncthreads();
		if (tid < IXM_TE && j0 + tid < lim) {
			const float* vr = vs + tid * (heads + 1);
			float acc = 0.0f;
#pragma unroll 8
			for (int h = 0; h < heads; h++) acc += vr[h];
			scores[(size_t)row * ld + j0 + tid] = rbf(acc, 1);
		}
		__syncthreads(); // kb and vs are rewritten by the next tile
	}
}

DEV u32 ord_key(float f) {
	u32 u = __float_as_uint(f);
	if ((u & 0x7fffffffu) == 0u) u = 0u; // -0 ties with +0, as the CPU's comparison
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Per-row top-k (descending, ties → lower index, -1 padded), one CTA of 1024
// threads per row: radix select of the k-th key over 8-bit digits, gather,
// bitonic sort of 64-bit (key << 32 | ~index). smem: P (pow2 ≥ k) u64.
// Every pass walks the row in warp chunks (warp w: a contiguous range, TK_U
// loads in flight per lane), so the tie pass can rank ties in index order
// with one count per warp. Lanes of a warp adding to one bin (runs of equal
// scores: the many exact zeros after ReLU) add once; the passes stop when all
// candidate keys share their lower bits (bf16 scores: after two digits).
#define TK_U 8

template <typename F>
DEV void topk_walk(const float* __restrict__ sc, int c0, int c1, int lane, F f)
{
	for (int b = c0; b < c1; b += 32 * TK_U) {
		u32 key[TK_U];
#pragma unroll
		for (int u = 0; u < TK_U; u++) {
			const int j = b + 32 * u + lane;
			key[u] = j < c1 ? ord_key(sc[j]) : 0u;
		}
#pragma unroll
		for (int u = 0; u < TK_U; u++) {
			const int j = b + 32 * u + lane;
			f(j, key[u], j < c1);
		}
	}
}

extern "C" __global__ void __launch_bounds__(1024) indexer_topk_f32(
	int* __restrict__ out, const float* __restrict__ scores, const int* __restrict__ pos, int ld, int topk, int ratio, int P)
{
	PDL_ENTRY();
	extern __shared__ u64 cand[];
	__shared__ int hist[256];
	__shared__ int wcnt[32];
	__shared__ u32 sPrefix, sMask, sLow;
	__shared__ int sNeed, sCnt, sDone;
	const int row = blockIdx.x;
	const int avail = min((pos[row] + 1) / ratio, ld);
	const int k = min(topk, avail);
	const float* sc = scores + (size_t)row * ld;
	const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, wid = tid >> 5, nw = nt >> 5;
	const int C = (((avail + nw - 1) / nw) + 31) & ~31; // a warp's chunk
	const int c0 = min(wid * C, avail), c1 = min(c0 + C, avail);
	const u32 lt = (1u << lane) - 1u;
	if (tid == 0) { sPrefix = 0; sMask = 0; sNeed = k; sCnt = 0; sDone = 0; }
	__syncthreads();
	const bool all = k >= avail;
	if (!all) {
		for (int shift = 24; shift >= 0; shift -= 8) {
			for (int i = tid; i < 256; i += nt) hist[i] = 0;
			if (tid == 0) sLow = 0;
			__syncthreads();
			const u32 pre = sPrefix, msk = sMask, low = (1u << shift) - 1u;
			u32 orl = 0;
			topk_walk(sc, c0, c1, lane, [&](int, u32 key, bool v) {
				v = v && (key & msk) == pre;
				const u32 d = (key >> shift) & 255u;
				const u32 vb = __ballot_sync(0xffffffffu, v);
				if (vb == 0) return;
				const int l0 = __clz(__brev(vb));
				const u32 dl = __shfl_sync(0xffffffffu, d, l0);
				const u32 same = __ballot_sync(0xffffffffu, v && d == dl);
				if (lane == l0) atomicAdd(&hist[dl], __popc(same));
				if (v && d != dl) atomicAdd(&hist[d], 1);
				if (v) orl |= key & low;
			});
			for (int o = 16; o > 0; o >>= 1) orl |= __shfl_xor_sync(0xffffffffu, orl, o);
			if (lane == 0 && orl) atomicOr(&sLow, orl);
			__syncthreads();
			if (wid == 0) { // the digit: warp 0 scans 8 bins a lane, from the top
				const int need = sNeed;
				int h[8], s = 0;
#pragma unroll
				for (int i = 0; i < 8; i++) {
					h[i] = hist[255 - 8 * lane - i];
					s += h[i];
				}
				int incl = s; // bins above and in this lane's group
				for (int o = 1; o < 32; o <<= 1) {
					const int v = __shfl_up_sync(0xffffffffu, incl, o);
					if (lane >= o) incl += v;
				}
				const u32 hit = __ballot_sync(0xffffffffu, incl >= need);
				if (lane == __clz(__brev(hit))) {
					int above = incl - s, i = 0;
					for (; i < 7; i++) {
						if (above + h[i] >= need) break;
						above += h[i];
					}
					sNeed = need - above;
					sPrefix = pre | ((u32)(255 - 8 * lane - i) << shift);
					sMask = msk | (255u << shift);
					if (sLow == 0) { // the keys left share their lower bits: all zero
						sMask = 0xffffffffu;
						sDone = 1;
					}
				}
			}
			__syncthreads();
			if (sDone) break;
		}
	}
	const u32 T = sPrefix;
	// Keys above T (all keys when everything is selected); ties at T counted per warp.
	int ties = 0;
	topk_walk(sc, c0, c1, lane, [&](int j, u32 key, bool v) {
		const bool f = v && (all || key > T);
		const u32 fb = __ballot_sync(0xffffffffu, f);
		ties += __popc(__ballot_sync(0xffffffffu, v && !all && key == T));
		if (fb == 0) return;
		int base = 0;
		if (lane == 0) base = atomicAdd(&sCnt, __popc(fb));
		base = __shfl_sync(0xffffffffu, base, 0);
		if (f) cand[base + __popc(fb & lt)] = ((u64)key << 32) | (u64)(~(u32)j);
	});
	if (lane == 0) wcnt[wid] = ties;
	__syncthreads();
	if (!all) { // ties at T: the lowest indices, warps in index order
		const int need = k - sCnt, above = sCnt;
		int before = 0;
		for (int i = 0; i < wid; i++) before += wcnt[i];
		if (before < need && wcnt[wid] > 0) {
			int taken = before;
			for (int b = c0; b < c1 && taken < need; b += 32 * TK_U) {
				bool tie[TK_U];
#pragma unroll
				for (int u = 0; u < TK_U; u++) {
					const int j = b + 32 * u + lane;
					tie[u] = j < c1 && ord_key(sc[j]) == T;
				}
#pragma unroll
				for (int u = 0; u < TK_U; u++) {
					const u32 bal = __ballot_sync(0xffffffffu, tie[u]);
					const int rank = taken + __popc(bal & lt);
					if (tie[u] && rank < need) cand[above + rank] = ((u64)T << 32) | (u64)(~(u32)(b + 32 * u + lane));
					taken += __popc(bal);
				}
			}
		}
	}
	__syncthreads();
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

// Sparse MQA with sink (spec §5.6–5.7). One CTA of 8 warps takes one row and
// AT_HG heads, which share every key (MQA): per 64-slot block, the scores of
// 4 keys x 8 heads per warp pass (q in smem, a butterfly reduce-scatter
// leaves score (key, head) on lane key*8+head), the online softmax of
// backend/cpu per head (warp h), then P·V with every key row read once per
// thread column. sparse_attn_f32 runs all keys; sparse_attn_split_f32
// (sm_90) splits the blocks of a row over a cluster of AT_NC CTAs and
// combines through distributed shared memory in rank order;
// sparse_attn_dec_f32 splits them over S CTAs of a plain grid (any S up to
// AT_SMAX, flash-decoding) that leave (m, l, acc) in global memory, the last
// CTA of a (row, head group) combining them in split order. Faithful mode
// gives every split the running max of the blocks before it (the cluster
// exchanges per-CTA score maxima; the plain grid reads those that
// sparse_attn_max_f32 wrote), so each CTA starts its online softmax from
// the CPU's running max and rounds P to bf16 at exactly the CPU's points;
// exact mode skips that (the result is the same up to fp32 rounding). The
// combine rescales each split's (acc, l) by exp(m_c - m) and adds the sink
// once.
#define AT_HG 8
#define AT_NC 8
#define AT_SMAX 64
#define AT_THREADS 256
#define AT_KPB 4 // blocks of key pointers fetched at once: one key a thread
// attn_body's modes: whole rows, cluster splits, plain-grid splits, and the
// plain grid's faithful pass 1 alone (the split maxima).
#define AT_WHOLE 0
#define AT_CLU 1
#define AT_DEC 2
#define AT_MAX 3

DEV float dot4(float4 a, float4 b, float acc) {
	acc = fmaf(a.x, b.x, acc);
	acc = fmaf(a.y, b.y, acc);
	acc = fmaf(a.z, b.z, acc);
	return fmaf(a.w, b.w, acc);
}

// One butterfly step: lanes with bit O keep the upper O values, the others
// the lower, each adding its partner's copy.
template <int O>
DEV void rs_step(float (&v)[32], int lane) {
	const bool up = (lane & O) != 0;
#pragma unroll
	for (int i = 0; i < O; i++) {
		const float send = up ? v[i] : v[i + O];
		const float keep = up ? v[i + O] : v[i];
		v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
	}
}

// v[i] summed over the warp, scattered: lane l returns the total of v[l].
DEV float reduce_scatter32(float (&v)[32], int lane) {
	rs_step<16>(v, lane);
	rs_step<8>(v, lane);
	rs_step<4>(v, lane);
	rs_step<2>(v, lane);
	rs_step<1>(v, lane);
	return v[0];
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define AT_CLUSTER 1
DEV u32 cluster_rank() {
	u32 r;
	asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
	return r;
}
DEV void cluster_sync() {
	asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// p (this CTA's shared memory) as the same variable of CTA rank in the cluster.
DEV u32 dsmem(const void* p, u32 rank) {
	u32 r;
	asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
	return r;
}
DEV float ld_dsmem(u32 a) {
	float v;
	asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
	return v;
}
#endif

// out[row, h0+4hs+i, 4c4..4c4+3] = rb(acc[i] / lf[4hs+i]) for the heads < H.
DEV void attn_put(float* out, const float4 (&acc)[4], const float* lf, int row, int H, int h0, int D, int hs, int c4, int faithful) {
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const int h = hs * 4 + i;
		if (h0 + h >= H) continue;
		const float l = lf[h];
		float4 o;
		o.x = rbf(acc[i].x / l, faithful);
		o.y = rbf(acc[i].y / l, faithful);
		o.z = rbf(acc[i].z / l, faithful);
		o.w = rbf(acc[i].w / l, faithful);
		reinterpret_cast<float4*>(out + ((size_t)row * H + h0 + h) * D)[c4] = o;
	}
}

// Values [4c4, 4c4+4) of key row p: fp32, or (CPT) a compact entry when p
// carries tag bit 0 (entries are 8-byte aligned; this step's kv rows are fp32).
template <bool CPT>
DEV float4 key4(const u8* p, int c4, int nope, int soff) {
	if (CPT && ((size_t)p & 1)) return ld_entry4(p - 1, 4 * c4, nope, soff);
	return reinterpret_cast<const float4*>(p)[c4];
}

struct AttnSmem {
	const u8* kp[AT_KPB * 64]; // key rows of AT_KPB blocks (null: empty slot)
	float sc[AT_HG][64];    // scores (NaN: no key)
	float4 pw[64][2];       // bf16-rounded P per (key, head): heads 4i..4i+3 in pw[k][i]
	u32 inv[64][2];         // byte per (key, head): P not added (the CPU skips it)
	int wlive[AT_THREADS / 32]; // warp w's key pointers hold a key (block w/2 of a fetch)
	__align__(16) float al[AT_HG]; // read as float4 per head quad
	float m[AT_HG], l[AT_HG], lf[AT_HG], mloc[AT_HG];
	float f[AT_SMAX][AT_HG]; // combine factors
	int last;               // AT_DEC: this CTA combines
};

// Cache entries (ring, ent) are es bytes apart: fp32 (es = 4·D) or, with
// CPT, compact entries of nope e4m3 + D - nope bf16 values.
// Splits (AT_CLU, AT_DEC, AT_MAX): rank of ns take blocks [rank·nb/ns,
// (rank+1)·nb/ns). AT_DEC/AT_MAX records of (row, group g, split) at
// part[(row·G + g)·ns + rank]: m[AT_HG], l[AT_HG], acc[AT_HG][D]; pmax the
// same order of AT_HG maxima; counters one per (row, group).
template <int MODE, bool CPT>
DEV void attn_body(float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ kv,
	const u8* __restrict__ ring, const u8* __restrict__ ent, const int* __restrict__ sel, int selCols,
	const float* __restrict__ sink, const int* __restrict__ seqs, const int* __restrict__ pos,
	const int* __restrict__ seqOf, const int* __restrict__ blocks, int H, int D, int W, int RW, int ratio, int per,
	int nope, int es, float scale, int faithful, int row, int g, int rank, int ns, float* __restrict__ part,
	float* __restrict__ pmax, int* __restrict__ counters)
{
	constexpr bool SPLIT = MODE != AT_WHOLE;
	extern __shared__ float4 qs4[]; // [AT_HG][D/4]; the CTA's partial acc in the split combine
	__shared__ AttnSmem sm;
	const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	const int D4 = D >> 2;
	const int soff = nope + 2 * (D - nope);
	const int tag = CPT ? 1 : 0;
	const int h0 = g * AT_HG;
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
	const int nb = (nkeys + 63) >> 6;
	int blo = 0, bhi = nb;
	if (SPLIT) { blo = rank * nb / ns; bhi = (rank + 1) * nb / ns; }
	// Blocks at or past nbl hold no key where that follows from the positions
	// alone (no compressed part: the window's nwin keys only).
	const int nbl = ncomp == 0 ? (nwin + 63) >> 6 : nb;
	// The (row, group)'s first split record (recomputed where used: fewer live registers).
	auto first = [&]() { return ((size_t)row * ((H + AT_HG - 1) / AT_HG) + g) * ns; };
	for (int i = tid; i < AT_HG * D4; i += AT_THREADS) {
		const int h = i / D4;
		qs4[i] = h0 + h < H ? reinterpret_cast<const float4*>(q + ((size_t)row * H + h0 + h) * D)[i - h * D4] : f4zero();
	}
	if (tid < AT_HG) { sm.m[tid] = NEG_INF; sm.l[tid] = 0.0f; sm.mloc[tid] = NEG_INF; }

	// Key rows of blocks [kc, kc + AT_KPB) below bhi into sm.kp (the CPU's
	// index list), one key a thread, so the dependent loads (selection, block
	// table) of AT_KPB blocks overlap; ko: block b's first. Called by the
	// whole CTA after a barrier.
	static_assert(AT_THREADS == AT_KPB * 64, "one key pointer a thread");
	int kc = -(1 << 30), ko = 0;
	auto fetch = [&](int b) {
		if (b < kc || b >= kc + AT_KPB) {
			kc = b;
			const u8* kk = nullptr;
			const int ki = b * 64 + tid;
			if (ki < nkeys && ki < bhi * 64) {
				if (ki < nwin) {
					const int p = p0 + ki;
					kk = p >= start ? reinterpret_cast<const u8*>(kv + (size_t)(row0 + p - start) * D)
					                : ring + ((size_t)slot * RW + p % RW) * es + tag;
				} else if (ki >= winLen) {
					int j = ki - winLen;
					if (ratio == 4) {
						j = sel[(size_t)row * selCols + j];
						if (j < 0 || j >= (t + 1) / 4) j = -1;
					}
					if (j >= 0 && j / per < nblk) kk = ent + ((size_t)blocks[blkOff + j / per] * per + j % per) * es + tag;
				}
			}
			sm.kp[tid] = kk;
			const bool any = __ballot_sync(0xffffffffu, kk != nullptr) != 0u;
			if (lane == 0) sm.wlive[w] = any;
			__syncthreads();
		}
		ko = (b - kc) * 64;
	};
	// Block b (just fetched) has a key. An empty block changes neither the max
	// nor (m, l, acc) (alpha = exp(0) = 1, no P): it is skipped.
	auto live = [&](int b) { return (sm.wlive[2 * (b - kc)] | sm.wlive[2 * (b - kc) + 1]) != 0; };
	// Scores of the block's n keys into sm.sc: warp w, keys 8w..8w+7.
	auto scores = [&](int n) {
#pragma unroll 1
		for (int ps = 0; ps < 2; ps++) {
			const int kb = w * 8 + ps * 4;
			const u8* kr[4];
#pragma unroll
			for (int j = 0; j < 4; j++) kr[j] = kb + j < n ? sm.kp[ko + kb + j] : nullptr;
			float a[32];
#pragma unroll
			for (int i = 0; i < 32; i++) a[i] = 0.0f;
			for (int c4 = lane; c4 < D4; c4 += 32) {
				float4 kf[4];
#pragma unroll
				for (int j = 0; j < 4; j++) kf[j] = kr[j] ? key4<CPT>(kr[j], c4, nope, soff) : f4zero();
#pragma unroll
				for (int h = 0; h < AT_HG; h++) {
					const float4 qf = qs4[h * D4 + c4];
#pragma unroll
					for (int j = 0; j < 4; j++) a[j * 8 + h] = dot4(qf, kf[j], a[j * 8 + h]);
				}
			}
			const float s = reduce_scatter32(a, lane) * scale;
			const int ki = kb + (lane >> 3);
			sm.sc[lane & 7][ki] = ki < n && sm.kp[ko + ki] ? s : __int_as_float(0x7fc00000);
		}
	};

	if (MODE == AT_MAX || (MODE == AT_CLU && faithful)) {
		// Pass 1: this CTA's score maxima, then the running max of the blocks before it.
		// Only later splits read the maxima: none of them has a key when bhi >= nbl.
		for (int b = blo; b < min(bhi, nbl) && bhi < nbl; b++) {
			const int b0 = b * 64, n = min(64, nkeys - b0);
			__syncthreads();
			fetch(b);
			if (!live(b)) continue;
			scores(n);
			__syncthreads();
			if (w < AT_HG) {
				const float bm = warp_max(fmaxf(NEG_INF, fmaxf(sm.sc[w][lane], sm.sc[w][lane + 32])));
				if (lane == 0) sm.mloc[w] = fmaxf(sm.mloc[w], bm);
			}
		}
		__syncthreads();
		if (MODE == AT_MAX) {
			if (tid < AT_HG) pmax[(first() + rank) * AT_HG + tid] = sm.mloc[tid];
			return;
		}
#ifdef AT_CLUSTER
		cluster_sync();
		if (tid < AT_HG) {
			float mp = NEG_INF;
			for (int c = 0; c < rank; c++) mp = fmaxf(mp, ld_dsmem(dsmem(&sm.mloc[tid], c)));
			sm.m[tid] = mp;
		}
#endif
	}
	if (MODE == AT_DEC && faithful && tid < AT_HG) { // sparse_attn_max's maxima of the splits before this one
		float mp = NEG_INF;
		for (int c = 0; c < rank; c++) mp = fmaxf(mp, __ldcg(pmax + (first() + c) * AT_HG + tid));
		sm.m[tid] = mp;
	}

	// Pass 2: the CPU's online softmax over this CTA's blocks.
	const int it0 = tid, it1 = tid + AT_THREADS; // items: (head quad hs, column c4)
	const bool ok0 = it0 < 2 * D4, ok1 = it1 < 2 * D4;
	const int hs0 = ok0 ? it0 / D4 : 0, c40 = ok0 ? it0 - hs0 * D4 : 0;
	const int hs1 = ok1 ? it1 / D4 : 0, c41 = ok1 ? it1 - hs1 * D4 : 0;
	float4 acc0[4], acc1[4];
#pragma unroll
	for (int i = 0; i < 4; i++) { acc0[i] = f4zero(); acc1[i] = f4zero(); }
	for (int b = blo; b < min(bhi, nbl); b++) {
		const int b0 = b * 64, n = min(64, nkeys - b0);
		__syncthreads();
		fetch(b);
		if (!live(b)) continue;
		scores(n);
		__syncthreads();
		if (w < AT_HG) { // head w: block max, rescale, P
			const float s0 = sm.sc[w][lane], s1 = sm.sc[w][lane + 32];
			const float bm = warp_max(fmaxf(NEG_INF, fmaxf(s0, s1)));
			const float mo = sm.m[w];
			const float mn = fmaxf(mo, bm);
			u8* inv = reinterpret_cast<u8*>(&sm.inv[0][0]);
			float* pw = reinterpret_cast<float*>(&sm.pw[0][0]);
			if (mn == NEG_INF) { // nothing real yet: the CPU skips the block
				pw[lane * 8 + w] = 0.0f; pw[(lane + 32) * 8 + w] = 0.0f;
				inv[lane * 8 + w] = 1; inv[(lane + 32) * 8 + w] = 1;
				if (lane == 0) sm.al[w] = 1.0f;
			} else {
				const float alpha = exp32(mo - mn);
				const float e0 = s0 == s0 ? exp32(s0 - mn) : 0.0f;
				const float e1 = s1 == s1 ? exp32(s1 - mn) : 0.0f;
				const float ls = warp_sum(e0 + e1);
				pw[lane * 8 + w] = rbf(e0, faithful); pw[(lane + 32) * 8 + w] = rbf(e1, faithful);
				inv[lane * 8 + w] = s0 != s0; inv[(lane + 32) * 8 + w] = s1 != s1;
				if (lane == 0) { sm.l[w] = sm.l[w] * alpha + ls; sm.m[w] = mn; sm.al[w] = alpha; }
			}
		}
		__syncthreads();
		{
			const float4 a0 = reinterpret_cast<const float4*>(sm.al)[hs0];
			const float4 a1 = reinterpret_cast<const float4*>(sm.al)[hs1];
			const float sa0[4] = {a0.x, a0.y, a0.z, a0.w}, sa1[4] = {a1.x, a1.y, a1.z, a1.w};
#pragma unroll
			for (int i = 0; i < 4; i++) {
				acc0[i].x *= sa0[i]; acc0[i].y *= sa0[i]; acc0[i].z *= sa0[i]; acc0[i].w *= sa0[i];
				acc1[i].x *= sa1[i]; acc1[i].y *= sa1[i]; acc1[i].z *= sa1[i]; acc1[i].w *= sa1[i];
			}
		}
		// acc[i] += p(key k, head 4·hs + i) · V[k][c4], skipping the keys the CPU
		// skips (NaN scores) per head.
		auto accum = [&](float4 (&acc)[4], const u8* kr, int k, int hs, int c4) {
			const float4 kf = key4<CPT>(kr, c4, nope, soff);
			const float4 p4 = sm.pw[k][hs];
			const u32 iv = sm.inv[k][hs];
			const float pp[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
			for (int i = 0; i < 4; i++) {
				if (iv == 0u || !((iv >> (8 * i)) & 0xffu)) {
					acc[i].x = fmaf(pp[i], kf.x, acc[i].x);
					acc[i].y = fmaf(pp[i], kf.y, acc[i].y);
					acc[i].z = fmaf(pp[i], kf.z, acc[i].z);
					acc[i].w = fmaf(pp[i], kf.w, acc[i].w);
				}
			}
		};
#pragma unroll 4
		for (int k = 0; k < n; k++) {
			const u8* kr = sm.kp[ko + k];
			if (!kr) continue;
			if (ok0) accum(acc0, kr, k, hs0, c40);
			if (ok1) accum(acc1, kr, k, hs1, c41);
		}
	}
	__syncthreads();
	if (!SPLIT) {
		if (tid < AT_HG) sm.lf[tid] = h0 + tid < H ? sm.l[tid] + exp32(sink[h0 + tid] - sm.m[tid]) : 1.0f;
		__syncthreads();
		if (ok0) attn_put(out, acc0, sm.lf, row, H, h0, D, hs0, c40, faithful);
		if (ok1) attn_put(out, acc1, sm.lf, row, H, h0, D, hs1, c41, faithful);
		return;
	}
	if (MODE == AT_DEC) {
		// Publish (m, l, acc); the last CTA of the (row, group) combines the splits in order.
		const size_t rec = first(), rs = 2 * AT_HG + (size_t)AT_HG * D; // floats a record
		float* pr = part + (rec + rank) * rs;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			if (ok0) reinterpret_cast<float4*>(pr + 2 * AT_HG + (size_t)(hs0 * 4 + i) * D)[c40] = acc0[i];
			if (ok1) reinterpret_cast<float4*>(pr + 2 * AT_HG + (size_t)(hs1 * 4 + i) * D)[c41] = acc1[i];
		}
		if (tid < AT_HG) { pr[tid] = sm.m[tid]; pr[AT_HG + tid] = sm.l[tid]; }
		if (!splitk_last(counters + rec / ns, ns, &sm.last)) return;
		const float* p0 = part + rec * rs;
		if (tid < AT_HG) {
			float mf = NEG_INF;
			for (int c = 0; c < ns; c++) mf = fmaxf(mf, __ldcg(p0 + c * rs + tid));
			float lt = 0.0f;
			for (int c = 0; c < ns; c++) {
				const float mc = __ldcg(p0 + c * rs + tid);
				const float f = mc == NEG_INF ? 0.0f : exp32(mc - mf);
				sm.f[c][tid] = f;
				lt += f * __ldcg(p0 + c * rs + AT_HG + tid);
			}
			sm.lf[tid] = h0 + tid < H ? lt + exp32(sink[h0 + tid] - mf) : 1.0f;
		}
		__syncthreads();
		// 4 columns a thread, 4 splits at a time: 16 loads in flight; each sum in split order.
		const int ne = AT_HG * D4;
		for (int e0 = tid; e0 < ne; e0 += 4 * AT_THREADS) {
			float4 a[4];
#pragma unroll
			for (int u = 0; u < 4; u++) a[u] = f4zero();
			for (int c0 = 0; c0 < ns; c0 += 4) {
				float4 v[4][4];
#pragma unroll
				for (int j = 0; j < 4; j++)
#pragma unroll
					for (int u = 0; u < 4; u++) {
						const int e = e0 + u * AT_THREADS;
						v[j][u] = c0 + j < ns && e < ne ? __ldcg(reinterpret_cast<const float4*>(p0 + (c0 + j) * rs + 2 * AT_HG) + e) : f4zero();
					}
#pragma unroll
				for (int j = 0; j < 4; j++)
#pragma unroll
					for (int u = 0; u < 4; u++) {
						const int e = e0 + u * AT_THREADS;
						if (c0 + j >= ns || e >= ne) continue;
						const float f = sm.f[c0 + j][e / D4];
						a[u].x += f * v[j][u].x;
						a[u].y += f * v[j][u].y;
						a[u].z += f * v[j][u].z;
						a[u].w += f * v[j][u].w;
					}
			}
#pragma unroll
			for (int u = 0; u < 4; u++) {
				const int e = e0 + u * AT_THREADS, h = e / D4;
				if (e >= ne || h0 + h >= H) continue;
				const float l = sm.lf[h];
				float4 o;
				o.x = rbf(a[u].x / l, faithful);
				o.y = rbf(a[u].y / l, faithful);
				o.z = rbf(a[u].z / l, faithful);
				o.w = rbf(a[u].w / l, faithful);
				reinterpret_cast<float4*>(out + ((size_t)row * H + h0 + h) * D)[e - h * D4] = o;
			}
		}
		return;
	}
#ifdef AT_CLUSTER
	// Publish (m, l, acc); rank r then combines columns [r·D/NC, (r+1)·D/NC) of every head.
	float* pa = reinterpret_cast<float*>(qs4); // [AT_HG][D]
#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (ok0) reinterpret_cast<float4*>(pa + (size_t)(hs0 * 4 + i) * D)[c40] = acc0[i];
		if (ok1) reinterpret_cast<float4*>(pa + (size_t)(hs1 * 4 + i) * D)[c41] = acc1[i];
	}
	cluster_sync();
	if (tid < AT_HG) {
		float mc[AT_NC], mf = NEG_INF;
#pragma unroll
		for (int c = 0; c < AT_NC; c++) {
			mc[c] = ld_dsmem(dsmem(&sm.m[tid], c));
			mf = fmaxf(mf, mc[c]);
		}
		float lt = 0.0f;
#pragma unroll
		for (int c = 0; c < AT_NC; c++) {
			const float f = mc[c] == NEG_INF ? 0.0f : exp32(mc[c] - mf);
			sm.f[c][tid] = f;
			lt += f * ld_dsmem(dsmem(&sm.l[tid], c));
		}
		sm.lf[tid] = h0 + tid < H ? lt + exp32(sink[h0 + tid] - mf) : 1.0f;
	}
	__syncthreads();
	const int dsl = D / AT_NC;
	for (int e = tid; e < AT_HG * dsl; e += AT_THREADS) {
		const int h = e / dsl, dd = rank * dsl + (e - h * dsl);
		if (h0 + h >= H) continue;
		float s = 0.0f;
#pragma unroll
		for (int c = 0; c < AT_NC; c++) s += sm.f[c][h] * ld_dsmem(dsmem(pa + (size_t)h * D + dd, c));
		out[((size_t)row * H + h0 + h) * D + dd] = rbf(s / sm.lf[h], faithful);
	}
	cluster_sync(); // keep this CTA's shared memory alive until every rank has read it
#endif
}

// The entry points' parameters (rows: the grid's; the body reads blockIdx).
#define ATTN_ARGS                                                                                              \
	float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ kv, const u8* __restrict__ ring,   \
		const u8* __restrict__ ent, const int* __restrict__ sel, int selCols, const float* __restrict__ sink,           \
		const int* __restrict__ seqs, const int* __restrict__ pos, const int* __restrict__ seqOf,                      \
		const int* __restrict__ blocks, int rows, int H, int D, int W, int RW, int ratio, int per, int nope, int es,   \
		float scale, int faithful
#define ATTN_PASS out, q, kv, ring, ent, sel, selCols, sink, seqs, pos, seqOf, blocks, H, D, W, RW, ratio, per, nope, es, scale, faithful

// One CTA per (row, head group): grid (rows, groups).
#define ATTN_KERNEL(name, CPT)                                                                                 \
	extern "C" __global__ void __launch_bounds__(AT_THREADS) name(ATTN_ARGS)                                   \
	{                                                                                                          \
		PDL_ENTRY();                                                                                           \
		(void)rows;                                                                                            \
		attn_body<AT_WHOLE, CPT>(ATTN_PASS, blockIdx.x, blockIdx.y, 0, 1, nullptr, nullptr, nullptr);          \
	}

// Grid (AT_NC·groups, rows): the AT_NC consecutive CTAs along x of one
// (row, head group) form a cluster. sm_90+ only (the launcher checks).
#ifdef AT_CLUSTER
#define ATTN_SPLIT_KERNEL(name, CPT)                                                                           \
	extern "C" __global__ void __cluster_dims__(AT_NC, 1, 1) __launch_bounds__(AT_THREADS) name(ATTN_ARGS)     \
	{                                                                                                          \
		PDL_ENTRY();                                                                                           \
		(void)rows;                                                                                            \
		attn_body<AT_CLU, CPT>(ATTN_PASS, blockIdx.y, blockIdx.x / AT_NC, (int)cluster_rank(), AT_NC, nullptr,  \
			nullptr, nullptr);                                                                                 \
	}
#else
#define ATTN_SPLIT_KERNEL(name, CPT)                                                                           \
	extern "C" __global__ void __launch_bounds__(AT_THREADS) name(ATTN_ARGS) { __trap(); }
#endif

// Grid (splits·groups, rows): CTA x of row y is split x % splits of head
// group x / splits. part: the split records, pmax: the split maxima
// (faithful only), counters: one per (row, group), zero between launches.
#define ATTN_DEC_ARGS ATTN_ARGS, float *__restrict__ part, float *__restrict__ pmax, int *__restrict__ counters, int splits
#define ATTN_DEC_KERNEL(name, MODE, CPT)                                                                       \
	extern "C" __global__ void __launch_bounds__(AT_THREADS) name(ATTN_DEC_ARGS)                               \
	{                                                                                                          \
		PDL_ENTRY();                                                                                           \
		(void)rows;                                                                                            \
		attn_body<MODE, CPT>(ATTN_PASS, blockIdx.y, blockIdx.x / splits, blockIdx.x % splits, splits, part,    \
			pmax, counters);                                                                                   \
	}

ATTN_KERNEL(sparse_attn_f32, false)
ATTN_KERNEL(sparse_attn_kv8, true)
ATTN_SPLIT_KERNEL(sparse_attn_split_f32, false)
ATTN_SPLIT_KERNEL(sparse_attn_split_kv8, true)
ATTN_DEC_KERNEL(sparse_attn_dec_f32, AT_DEC, false)
ATTN_DEC_KERNEL(sparse_attn_dec_kv8, AT_DEC, true)
ATTN_DEC_KERNEL(sparse_attn_max_f32, AT_MAX, false)
ATTN_DEC_KERNEL(sparse_attn_max_kv8, AT_MAX, true)
