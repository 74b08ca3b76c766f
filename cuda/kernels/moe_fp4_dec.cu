// Decode-shaped MoE grouped GEMM over FP4 expert weights: the same function
// as moe_fp4_gemm (kernels/moe_fp4.cu) for tile lists of 8 or 16 rows per
// tile (moe_tile_map with bm = 8 or 16), built for the weight stream rather than
// for reuse: the weights are the MMA's A operand (16 output columns per
// warp), the tile's tokens its B operand (n = 8), so no row slots are wasted.
//
// Stream: a 4-stage cp.async ring of 16-byte copies (one 128-K block of
// weights, activations and weight scales per stage: 3 blocks, 12 KB of
// weights in flight per CTA, 9 CTAs per SM). Weights come back by ldmatrix
// from a swizzled (conflict-free) layout: thread c gets word c of each
// 16-byte row chunk, i.e. physical elements 8c..8c+7 of a 32-group.
//
// MMA: two chained f16 m16n8k16 per 32 K (sm_90 has no FP8 mma.sync; ptxas
// lowers it to the same HMMAs plus FADDs). e2m1 -> e4m3 is exact as the
// bits (s<<7)|(em<<2) = value * 2^-6 (even/odd nibbles, 7 integer ops per 8
// codes), then e4m3 -> f16 by cvt for A and B alike (sm_80: a bit map,
// * 2^-8). The powers of two are undone in G at the store. Element pairs (0,2),(4,6),
// (1,3),(5,7) of a lane's 8 are used identically in A and B. One MMA pair
// is one MXFP4 group; NVFP4 16-groups are lanes c<2 / c>=2, so B column
// n = (token n>>1, half n&1) carries only that half (the other lanes read
// a zero row): one MMA pair gives both group sums for 4 tokens (a second
// pair for tokens 4..7). Weight scales apply in fp32 to each fresh group
// product, activation scales per 128 K.
//
// Split K: with part != 0, CTA z covers K blocks [z*kbPer, (z+1)*kbPer) and
// stores fp32 sums (times G_e) to part[z][Mtot][N]. With counters (one int
// per (column block, tile), zero at launch) the tile's last CTA adds them
// (dec_fixup); without, linear_fp8_reduce does, in the same order.
#include "moe_dec.cuh"
#include "moe_route.cuh"

#define DS 4    // ring stages
#define DW 4096 // weights per stage: 64 rows x 64 bytes

// Stage layout of a tile of 8*MT tokens: weights, then per 32-K step the
// tokens' 32 bytes and a zero row, then the scales (64 rows x up to 8 bytes).
template <int MT>
struct DecGeom {
	static constexpr int XJ = (8 * MT + 1) * 32; // activations of one 32-K step
	static constexpr int X = 4 * XJ;
	static constexpr int STAGE = DW + X + 512;
	static constexpr int ZERO = 8 * MT * 32; // zero row inside each 32-K step
};

DEV u32 prmt(u32 a, u32 b, u32 sel) {
	u32 d;
	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
	return d;
}


// e4m3 byte of an e2m1 nibble scaled by 2^-6: (s << 7) | (em << 2) (0.5 is
// the e4m3 subnormal 2^-7, the rest normals). Even nibbles (low half of each
// byte) and odd ones, four at a time.
DEV u32 q_even(u32 w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }
DEV u32 q_odd(u32 w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

// Four e4m3 bytes -> two f16x2 (bytes 0,1 -> lo; 2,3 -> hi). sm_89+ reads
// the high half straight from the register (F2FP .H1, no shift); sm_80 has
// no FP8 convert: the bit map gives value * 2^-8, undone in G.
DEV void e4m3x4_f16x2(u32 v, u32& lo, u32& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
	asm("{.reg .b16 l, h; mov.b32 {l, h}, %2; cvt.rn.f16x2.e4m3x2 %0, l; cvt.rn.f16x2.e4m3x2 %1, h;}"
		: "=r"(lo), "=r"(hi) : "r"(v));
#else
	lo = e4m3x2_to_f16x2_scaled(v & 0xffffu);
	hi = e4m3x2_to_f16x2_scaled(v >> 16);
#endif
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define DEC_UNDO 64.0f // A * 2^-6
#else
#define DEC_UNDO 4194304.0f // A * 2^-6 * 2^-8, B * 2^-8
#endif

// Eight activation bytes -> the four f16x2 B words paired as (0,2),(4,6),(1,3),(5,7).
DEV void b_words(uint2 x, u32* b) {
	e4m3x4_f16x2(prmt(x.x, x.y, 0x6420u), b[0], b[1]);
	e4m3x4_f16x2(prmt(x.x, x.y, 0x7531u), b[2], b[3]);
}

// The A fragments of a 32-K chunk: row g word wa, row g+8 word wb (a[0..3]
// the even pairs, a[4..7] the odd ones).
DEV void a_frags(u32 wa, u32 wb, u32* a) {
	e4m3x4_f16x2(q_even(wa), a[0], a[2]);
	e4m3x4_f16x2(q_even(wb), a[1], a[3]);
	e4m3x4_f16x2(q_odd(wa), a[4], a[6]);
	e4m3x4_f16x2(q_odd(wb), a[5], a[7]);
}

// p += a x (b): the 32 K of one chunk for 8 B columns.
DEV void mma_chunk(float* p, const u32* a, const u32* b) {
	const u32 b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
	mma_f16_16816(p, a, b0);
	mma_f16_16816(p, a + 4, b1);
}

// p = a x the 8 B columns of one 32-K chunk at x (eight activation bytes a lane).
DEV void chunk_product(float* p, const u32* a, const u8* x) {
	u32 b[4];
	b_words(*reinterpret_cast<const uint2*>(x), b);
	p[0] = p[1] = p[2] = p[3] = 0.f;
	mma_chunk(p, a, b);
}

// NVFP4: blk[0] (row A) and blk[1] (row B) += a chunk product's two 16-group
// sums (D columns h = 0, 1), each times its group scale.
DEV void nv_fold(float* blk, const float* p, const float* fA, const float* fB) {
	blk[0] = fmaf(p[0], fA[0], blk[0]);
	blk[0] = fmaf(p[1], fA[1], blk[0]);
	blk[1] = fmaf(p[2], fB[0], blk[1]);
	blk[1] = fmaf(p[3], fB[1], blk[1]);
}

// No byte of s is 0 or 255.
DEV bool e8m0_plain(u32 s) {
	const u32 z = (s - 0x01010101u) & ~s, f = (~s - 0x01010101u) & s;
	return ((z | f) & 0x80808080u) == 0u;
}

// The four e4m3 NVFP4 group scales of a word, as fp32.
DEV void nv_scales(u32 v, float* f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
	u32 lo, hi;
	e4m3x4_f16x2(v, lo, hi);
	asm("{.reg .b16 a, b, c, d; mov.b32 {a, b}, %4; mov.b32 {c, d}, %5;\n"
		"cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; cvt.f32.f16 %2, c; cvt.f32.f16 %3, d;}"
		: "=f"(f[0]), "=f"(f[1]), "=f"(f[2]), "=f"(f[3]) : "r"(lo), "r"(hi));
#else
#pragma unroll
	for (int i = 0; i < 4; i++) f[i] = e4m3_to_f32((v >> (8 * i)) & 0xffu);
#endif
}

// sm_89+: 9 CTAs (36 warps, <= 56 registers, 9 x 23.5 KB smem) per SM, one
// wave for the 1-token Flash w13 grid (1152 live CTAs on 132 SMs); NVFP4
// needs 64 registers (8 CTAs) to keep its sums out of local memory. sm_80 is
// a fallback: no occupancy target, no spills.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define DEC_MIN_CTAS 9
#define DEC_MIN_CTAS_NV 8
#else
#define DEC_MIN_CTAS 1
#define DEC_MIN_CTAS_NV 1
#endif

// One CTA of moe_fp4_dec, MXFP4 or NVFP4 (NV), for tiles of 8*MT tokens:
// with MT = 2 each weight fragment is decoded once for two 8-token MMAs
// (prefill chunks put 9-16 rows on an expert). The K loop is unrolled by the
// ring depth so that stage offsets are constants and the copy sources are
// running pointers: the loop's bookkeeping was about as many instructions as
// the FP4 decoding (seen in the SASS).
template <bool NV, int MT, bool EARLY = false>
DEV void dec_cta(u8* ring, u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	int e, int mBeg, int mEnd, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const int g = lane >> 2, c = lane & 3;
	using Gm = DecGeom<MT>;
	const int col0 = blockIdx.x * 64;
	const int nkb = K / 128;
	const int kb0 = part ? blockIdx.z * kbPer : 0;
	const int kb1 = part ? min(kb0 + kbPer, nkb) : nkb;
	const int nb = kb1 - kb0;
	const int gpr = NV ? K / 16 : K / 32; // scale groups per weight row
	constexpr int sbytes = NV ? 8 : 4;    // scale bytes per row per 128-K block
	const u8* we = w + (size_t)e * N * (K / 2);
	const u8* se = wscale + (size_t)e * N * gpr;

	// Copy assignment: weights 2 x 16 B per thread; threads 0..63 one scale
	// row, 64..127 one 16-byte activation chunk (token u>>3, chunk u&7) of
	// each 8-token block. The sources advance by one 128-K block per issue.
	const int wr = tid >> 2, wp = tid & 3; // rows wr and wr + 32, 16-byte chunk wp
	const int wok0 = col0 + wr < N ? 16 : 0, wok1 = col0 + wr + 32 < N ? 16 : 0;
	const u8* wq0 = we + (size_t)(wok0 ? col0 + wr : 0) * (K / 2) + wp * 16 + (size_t)kb0 * 64;
	const u8* wq1 = wq0 + (wok1 ? (size_t)32 * (K / 2) : 0); // else row wr again, zero-filled
	u8* const wd = ring + wr * 64 + ((wp ^ ((wr >> 1) & 3)) << 4); // row + 32: same swizzle
	const u8* aq[MT];
	u8* ad;
	int aok[MT], astep;
	if (tid < 64) {
		const int row = col0 + tid;
		aok[0] = row < N ? sbytes : 0;
		aq[0] = se + (size_t)(row < N ? row : 0) * gpr + (size_t)kb0 * sbytes;
#pragma unroll
		for (int t = 1; t < MT; t++) aq[t] = aq[0], aok[t] = aok[0]; // unused
		ad = ring + DW + Gm::X + tid * sbytes;
		astep = sbytes;
	} else {
		const int u = tid - 64, tok = u >> 3, q = u & 7;
#pragma unroll
		for (int t = 0; t < MT; t++) {
			const int tk = mBeg + tok + 8 * t;
			aok[t] = tk < mEnd ? 16 : 0;
			aq[t] = xq + (size_t)(tk < mEnd ? tk : mBeg) * K + q * 16 + (size_t)kb0 * 128;
		}
		ad = ring + DW + (q >> 1) * Gm::XJ + tok * 32 + (q & 1) * 16;
		astep = 128;
	}
	// EARLY's first stages in two parts: the weights and their scales (no
	// kernel writes them), then the activations (after the PDL wait).
	auto issue_w = [&](int st) {
		cp_async16(wd + st * Gm::STAGE, wq0, wok0);
		cp_async16(wd + st * Gm::STAGE + 32 * 64, wq1, wok1);
		if (tid < 64) { // warp-uniform
			cp_async_ca<sbytes>(ad + st * Gm::STAGE, aq[0], aok[0]);
			aq[0] += astep;
		}
		wq0 += 64;
		wq1 += 64;
	};
	auto issue_x = [&](int st) {
		if (tid >= 64) {
#pragma unroll
			for (int t = 0; t < MT; t++) {
				cp_async16(ad + st * Gm::STAGE + t * 256, aq[t], aok[t]);
				aq[t] += astep;
			}
		}
	};
	auto issue = [&](int st) {
		cp_async16(wd + st * Gm::STAGE, wq0, wok0);
		cp_async16(wd + st * Gm::STAGE + 32 * 64, wq1, wok1);
		if (tid >= 64) {
#pragma unroll
			for (int t = 0; t < MT; t++) cp_async16(ad + st * Gm::STAGE + t * 256, aq[t], aok[t]);
		} else {
			cp_async_ca<sbytes>(ad + st * Gm::STAGE, aq[0], aok[0]);
		}
		wq0 += 64;
		wq1 += 64;
#pragma unroll
		for (int t = 0; t < MT; t++) aq[t] += astep;
	};

	// Zero rows of every stage (never written by the copies); visible after the
	// first barrier below.
	{
		const int st = tid >> 5, j = (tid >> 3) & 3, k = tid & 7;
		reinterpret_cast<u32*>(ring + st * Gm::STAGE + DW + j * Gm::XJ + Gm::ZERO)[k] = 0u;
	}
	if (EARLY) {
		// The first stages' weights stream while the previous kernel runs; they
		// join the first commit group, so step 0 waits for all of them.
#pragma unroll
		for (int s = 0; s < DS - 1; s++)
			if (s < nb) issue_w(s);
		PDL_ENTRY();
#pragma unroll
		for (int s = 0; s < DS - 1; s++) {
			if (s < nb) issue_x(s);
			cp_async_commit();
		}
	} else {
#pragma unroll
		for (int s = 0; s < DS - 1; s++) {
			if (s < nb) issue(s);
			cp_async_commit();
		}
	}

	// Per-thread read offsets. ldmatrix: lane l addresses row (l&7) + 8*((l>>3)&1)
	// of the warp's 16, chunk (l>>4) (+2 for the second x4).
	const int lr = wid * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);
	const int lsw = (lane >> 4) ^ ((lane >> 1) & 3);
	const u32 ldA0 = smem_addr(ring) + lr * 64 + (lsw << 4); // the second x4 is at ^ 32 (stages are 64-aligned)
	const int rowA = wid * 16 + g, rowB = rowA + 8; // CTA-local weight rows of this thread
	// B rows: MXFP4 token g; NVFP4 column g = (token g>>1, half g&1), zero row
	// unless this lane's 8 elements are in that half.
	// Token block t (8 tokens) adds 8t rows to B and 8t to the D tokens.
	const bool mine = (c >> 1) == (g & 1);
	const int boff0 = NV ? (mine ? (g >> 1) * 32 : Gm::ZERO) + 8 * c : g * 32 + 8 * c;
	const int bstep = NV && !mine ? 0 : 8 * 32; // the zero row stays the zero row
	const int boff1 = mine ? boff0 + 4 * 32 : boff0; // NVFP4 tokens 4..7 of a block
	const int rows = mEnd - mBeg;
	// This thread's D tokens: MXFP4 (2c, 2c+1); NVFP4 (c, c+4); + 8t.
	const int tA = NV ? mBeg + c : mBeg + 2 * c, tB = NV ? mBeg + c + 4 : tA + 1;
	float acc[4 * MT]; // block t: (rowA, tA), (rowA, tB), (rowB, tA), (rowB, tB)
	const u8* xsA[MT];
	const u8* xsB[MT];
	bool okA[MT], okB[MT];
	u32 xa[MT], xb[MT];
#pragma unroll
	for (int t = 0; t < MT; t++) {
		okA[t] = tA + 8 * t < mEnd;
		okB[t] = tB + 8 * t < mEnd;
		xsA[t] = xs + (size_t)(okA[t] ? tA + 8 * t : mBeg) * nkb + kb0; // < 2^31 entries: Mtot * K / 128
		xsB[t] = xs + (size_t)(okB[t] ? tB + 8 * t : mBeg) * nkb + kb0;
		xa[t] = nb > 0 ? *xsA[t] : 0u;
		xb[t] = nb > 0 ? *xsB[t] : 0u;
#pragma unroll
		for (int k = 0; k < 4; k++) acc[4 * t + k] = 0.f;
	}

	auto step = [&](int i, int st) {
		cp_async_wait<DS - 2>();
		__syncthreads(); // stage st landed for all; the stage before it is free
		if (i + DS - 1 < nb) issue((st + DS - 1) % DS);
		cp_async_commit();
		float x0[MT], x1[MT];
#pragma unroll
		for (int t = 0; t < MT; t++) {
			x0[t] = okA[t] ? e8m0_to_f32(xa[t]) : 0.f;
			x1[t] = okB[t] ? e8m0_to_f32(xb[t]) : 0.f;
			if (i + 1 < nb) {
				xa[t] = xsA[t][i + 1];
				xb[t] = xsB[t][i + 1];
			}
		}
		const u8* S = ring + st * Gm::STAGE;
		u32 wv[8]; // wA[0], wB[0], wA[1], wB[1], ... (chunks 0..3)
		ldsm_x4(wv, ldA0 + st * Gm::STAGE);
		ldsm_x4(wv + 4, (ldA0 + st * Gm::STAGE) ^ 32u);
		const u8* X = S + DW;
		if (!NV) {
			const u32 scA = *reinterpret_cast<const u32*>(S + DW + Gm::X + rowA * 4);
			const u32 scB = *reinterpret_cast<const u32*>(S + DW + Gm::X + rowB * 4);
			float blk[4 * MT];
#pragma unroll
			for (int k = 0; k < 4 * MT; k++) blk[k] = 0.f;
			auto block = [&](auto dec) {
#pragma unroll
				for (int j = 0; j < 4; j++) {
					u32 a[8];
					a_frags(wv[2 * j], wv[2 * j + 1], a);
					const float fA = dec(scA, j), fB = dec(scB, j);
#pragma unroll
					for (int t = 0; t < MT; t++) {
						if (t > 0 && rows <= 8 * t) break; // uniform over the CTA
						float p[4];
						chunk_product(p, a, X + j * Gm::XJ + boff0 + t * bstep);
						blk[4 * t + 0] = fmaf(p[0], fA, blk[4 * t + 0]);
						blk[4 * t + 1] = fmaf(p[1], fA, blk[4 * t + 1]);
						blk[4 * t + 2] = fmaf(p[2], fB, blk[4 * t + 2]);
						blk[4 * t + 3] = fmaf(p[3], fB, blk[4 * t + 3]);
					}
				}
			};
			// e8m0 is 2^(b-127) = bits b << 23 for b in 1..254; a word with a 0
			// (2^-127) or 255 (NaN) byte takes the exact helper.
			if (e8m0_plain(scA) && e8m0_plain(scB))
				block([](u32 sc, int j) { return __uint_as_float(((sc >> (8 * j)) << 23) & 0x7f800000u); });
			else
				block([](u32 sc, int j) { return e8m0_to_f32(sc >> (8 * j)); });
#pragma unroll
			for (int t = 0; t < MT; t++) {
				acc[4 * t + 0] = fmaf(blk[4 * t + 0], x0[t], acc[4 * t + 0]);
				acc[4 * t + 1] = fmaf(blk[4 * t + 1], x1[t], acc[4 * t + 1]);
				acc[4 * t + 2] = fmaf(blk[4 * t + 2], x0[t], acc[4 * t + 2]);
				acc[4 * t + 3] = fmaf(blk[4 * t + 3], x1[t], acc[4 * t + 3]);
			}
		} else {
			const uint2 scA = *reinterpret_cast<const uint2*>(S + DW + Gm::X + rowA * 8);
			const uint2 scB = *reinterpret_cast<const uint2*>(S + DW + Gm::X + rowB * 8);
			float fA[8], fB[8]; // the row's eight 16-group scales of this block
			nv_scales(scA.x, fA);
			nv_scales(scA.y, fA + 4);
			nv_scales(scB.x, fB);
			nv_scales(scB.y, fB + 4);
			float blk0[2 * MT], blk1[2 * MT]; // block t: tokens tA, tB; rows A, B
#pragma unroll
			for (int k = 0; k < 2 * MT; k++) blk0[k] = blk1[k] = 0.f;
#pragma unroll
			for (int j = 0; j < 4; j++) {
				// 16-groups 2j (D columns h = 0) and 2j+1 (h = 1).
				u32 a[8];
				a_frags(wv[2 * j], wv[2 * j + 1], a);
#pragma unroll
				for (int t = 0; t < MT; t++) {
					if (t > 0 && rows <= 8 * t) break; // uniform over the CTA
					float p[4];
					chunk_product(p, a, X + j * Gm::XJ + boff0 + t * bstep);
					nv_fold(blk0 + 2 * t, p, fA + 2 * j, fB + 2 * j);
					if (rows > 8 * t + 4) { // NVFP4 tokens 4..7 of the block need a second pass
						chunk_product(p, a, X + j * Gm::XJ + boff1 + t * bstep);
						nv_fold(blk1 + 2 * t, p, fA + 2 * j, fB + 2 * j);
					}
				}
			}
#pragma unroll
			for (int t = 0; t < MT; t++) {
				acc[4 * t + 0] = fmaf(blk0[2 * t], x0[t], acc[4 * t + 0]);
				acc[4 * t + 2] = fmaf(blk0[2 * t + 1], x0[t], acc[4 * t + 2]);
				acc[4 * t + 1] = fmaf(blk1[2 * t], x1[t], acc[4 * t + 1]);
				acc[4 * t + 3] = fmaf(blk1[2 * t + 1], x1[t], acc[4 * t + 3]);
			}
		}
	};
	for (int i0 = 0; i0 < nb; i0 += DS) {
#pragma unroll
		for (int st = 0; st < DS; st++)
			if (i0 + st < nb) step(i0 + st, st);
	}
	cp_async_wait<0>();
	const float G = ((NV && gscale) ? gscale[e] : 1.0f) * DEC_UNDO;
	const int oA = col0 + rowA, oB = col0 + rowB;
	const int os[4] = {oA, oA, oB, oB}, ts[4] = {tA, tB, tA, tB};
#pragma unroll
	for (int t = 0; t < MT; t++) {
#pragma unroll
		for (int k = 0; k < 4; k++) {
			const int tk = ts[k] + 8 * t;
			if (os[k] >= N || tk >= mEnd) continue;
			const float v = acc[4 * t + k] * G;
			if (part) part[((size_t)blockIdx.z * Mtot + tk) * N + os[k]] = v;
			else y[(size_t)tk * N + os[k]] = (u16)f32_to_bf16(v);
		}
	}
	if (part && counters) dec_fixup(ring, y, part, counters + blockIdx.y * gridDim.x + blockIdx.x, mBeg, mEnd, col0, N, Mtot);
}

template <bool NV, int MT>
DEV void dec_kernel(u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	PDL_ENTRY();
	__shared__ __align__(128) u8 ring[DS * DecGeom<MT>::STAGE];
	const int t = blockIdx.y;
	const int cnt = scratch[0];
	const int4 tile = reinterpret_cast<const int4*>(scratch + 4)[t]; // in bounds: t < maxTiles
	if (t >= cnt) return;
	dec_cta<NV, MT>(ring, y, xq, xs, tile.x, tile.y, tile.z, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

// decmap (moe_fp4_decm*): CTA t finds tile t of moe_tile_map's list (8-row
// tiles, expert order) from the offsets itself, so that decode needs no
// tile_map launch and no wait on it. 128 threads scan the experts' tile
// counts; the thread whose experts hold tile t writes it. False past the
// list's end. CG: the offsets through L2 only (read before the PDL wait).
template <bool CG = false>
DEV bool dec_find_tile(const int* __restrict__ offsets, int E, int Mtot, int t, int4& tile, int* warpSums, int4* found)
{
	auto off = [&](int e) {
		if (!CG) return offsets[e];
		int v;
		asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(offsets + e));
		return v;
	};
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	if (tid == 0) found->x = -1; // published by the scan's barriers
	const int per = (E + blockDim.x - 1) / blockDim.x, e0 = tid * per, e1 = min(e0 + per, E);
	int local = 0;
	for (int e = e0; e < e1; e++) {
		const int b = min(max(off(e), 0), Mtot), en = min(max(off(e + 1), b), Mtot);
		local += (en - b + 7) >> 3;
	}
	int k = block_excl_scan(local, lane, wid, warpSums);
	if (t >= k && t < k + local) {
		for (int e = e0; e < e1; e++) {
			const int b = min(max(off(e), 0), Mtot), en = min(max(off(e + 1), b), Mtot);
			const int nt = (en - b + 7) >> 3;
			if (t < k + nt) {
				const int r = b + 8 * (t - k);
				*found = make_int4(e, r, min(r + 8, en), 0);
				break;
			}
			k += nt;
		}
	}
	__syncthreads();
	tile = *found;
	return tile.x >= 0;
}

// EARLY (decpre, moe_fp4_decp*): the tile lookup and the first stages'
// weight copies run before the PDL wait, overlapping the previous kernel.
// Only for offsets no kernel still running may write (the launcher's
// settled tile lists): two or more launches back, or a copy.
template <bool NV, bool EARLY = false>
DEV void decm_kernel(u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ offsets, int E, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	if (!EARLY) PDL_ENTRY();
	__shared__ __align__(128) u8 ring[DS * DecGeom<1>::STAGE];
	__shared__ int warpSums[32];
	__shared__ int4 found;
	int4 tile;
	if (!dec_find_tile<EARLY>(offsets, E, Mtot, blockIdx.y, tile, warpSums, &found)) return;
	dec_cta<NV, 1, EARLY>(ring, y, xq, xs, tile.x, tile.y, tile.z, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

// MXFP4 and NVFP4 entry points: NVFP4 holds more live values (the second
// token pass, eight scales per row) and gets 64 registers.
extern "C" __global__ void __launch_bounds__(128, DEC_MIN_CTAS) moe_fp4_dec(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	dec_kernel<false, 1>(y, xq, xs, scratch, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

extern "C" __global__ void __launch_bounds__(128, DEC_MIN_CTAS_NV) moe_fp4_dec_nv(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	dec_kernel<true, 1>(y, xq, xs, scratch, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

// Tiles of 16 tokens (moe_tile_map with bm = 16): 6 CTAs an SM, 80 registers
// (at 64 the two blocks' sums spilled; NVFP4 keeps a few words on the stack).
extern "C" __global__ void __launch_bounds__(128, 6) moe_fp4_dec16(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	dec_kernel<false, 2>(y, xq, xs, scratch, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

extern "C" __global__ void __launch_bounds__(128, 6) moe_fp4_dec16_nv(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	dec_kernel<true, 2>(y, xq, xs, scratch, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

// decmap entry points (8-row tiles): moe_fp4_dec's CTA after dec_find_tile.
extern "C" __global__ void __launch_bounds__(128, DEC_MIN_CTAS) moe_fp4_decm(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ offsets, int E, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	decm_kernel<false>(y, xq, xs, offsets, E, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

extern "C" __global__ void __launch_bounds__(128, DEC_MIN_CTAS_NV) moe_fp4_decm_nv(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ offsets, int E, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	decm_kernel<true>(y, xq, xs, offsets, E, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

// decpre entry points (8-row tiles on settled offsets): decmap with its tile
// lookup and first weight loads before the PDL wait.
extern "C" __global__ void __launch_bounds__(128, DEC_MIN_CTAS) moe_fp4_decp(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ offsets, int E, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	decm_kernel<false, true>(y, xq, xs, offsets, E, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

extern "C" __global__ void __launch_bounds__(128, DEC_MIN_CTAS_NV) moe_fp4_decp_nv(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ offsets, int E, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	decm_kernel<true, true>(y, xq, xs, offsets, E, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}
