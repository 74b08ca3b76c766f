// moe_fp4_dec's function on its 8-row tiles (same tile list, grid, split K
// and in-kernel fixup) with no conversion instruction: e2m1 and e4m3 codes
// become f16 by integer ops alone. Hopper runs cvt (F2FP) at a fraction of
// the integer rate, and moe_fp4_dec's 1.5 cvt a weight byte keep its integer
// pipe busy at ~40 % of the copy rate; here unpacking a weight byte costs 2
// integer-pipe ops (LOP3, PRMT) and 0.75 IMAD (docs/kernels-moe.md: the budget).
//
// Per 128-K block (a stage of a 3-deep cp.async ring: 64 weight rows x 64
// bytes, 8 tokens x 128 e4m3 activations, 64 rows of scales):
//   - every thread converts 8 activations to f16 (x 2^-8) and the block's
//     scales into a converted slot (two slots, alternating);
//   - at the next block's barrier each warp reads them back: the MMA's B
//     operand by one 16-byte load a 32-K chunk, and converts its 16 weight
//     rows (ldmatrix'ed from the ring a block earlier) to f16 (x 2^-14) for
//     two m16n8k16 MMAs a 32-K chunk, tokens as the n = 8 side.
// So the conversions of a block overlap the MMAs of the one before, with the
// ring's one barrier a block.
//
// Scales: MXFP4 e8m0 in fp32 per 32-K chunk product; NVFP4 e4m3 folded
// into the f16 weights (fp4 * s * 2^-7 is exact in f16: at most 8
// significant bits, multiples of 2^-17, below 22), so one fp32 MMA chain
// covers the block for both 16-groups. Activation scales per block, the
// global scale and the powers of two at the end, in fp32.
#include "moe_dec.cuh"

#define FS 3                      // ring stages
#define FW 4096                   // weights per stage: 64 rows x 64 bytes (swizzled as moe_fp4_dec's)
#define FX 1024                   // activations per stage: 8 tokens x 128 e4m3
#define FSTAGE (FW + FX + 512)    // + scales: 64 rows x 8 bytes (MXFP4 uses 4)
#define FXH_ROW 320               // f16 activations of a token: 256 bytes + 64 (conflict-free 16-byte reads)
#define FXH (8 * FXH_ROW)         // the slot's f16 activations
#define FSC 80                    // converted scales: words per 32-K chunk or 16-group (64 rows + 16)
#define FSLOT (FXH + 8 * FSC * 4) // a converted slot: activations, then scales
#define FSMEM (FS * FSTAGE + 2 * FSLOT)

DEV u32 prmt(u32 a, u32 b, u32 sel) {
	u32 d;
	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
	return d;
}
// w >> 3 on the multiply pipe (the integer pipe is the limit).
DEV u32 shr3(u32 w) {
	u32 d;
	asm("mul.hi.u32 %0, %1, 536870912;" : "=r"(d) : "r"(w));
	return d;
}
// cp.async to a shared-space address (the ring's offsets stay 32-bit).
DEV void cp16(u32 dst, const void* src, int src_bytes) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
template <int B>
DEV void cp_ca(u32 dst, const void* src, int src_bytes) {
	asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(B), "r"(src_bytes));
}
// Shared-memory loads and stores by 32-bit address (offsets fold into the
// instruction); volatile keeps them on their side of the CTA barrier.
DEV uint2 lds64(u32 a) {
	uint2 v;
	asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
	return v;
}
DEV uint4 lds128(u32 a) {
	uint4 v;
	asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
	return v;
}
DEV u32 lds32(u32 a) {
	u32 v;
	asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
	return v;
}
DEV void sts32(u32 a, u32 v) { asm volatile("st.shared.u32 [%0], %1;" ::"r"(a), "r"(v)); }
DEV void sts128(u32 a, uint4 v) { asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)); }
DEV u32 hmul2(u32 a, u32 b) {
	u32 d;
	asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
	return d;
}

// Eight e2m1 codes (nibble i = element i) -> four f16x2 words of the values
// times 2^-14: the f16's high byte is [s 000 e1 e0 m 0] and its low byte zero
// (0.5 becomes the f16 subnormal 2^-15). Pairs (0,2), (4,6), (1,3), (5,7),
// low element in the low half.
DEV void fp4x8_f16(u32 w, u32* h) {
	const u32 eo = (w & 0x80808080u) | (shr3(w) & 0x0e0e0e0eu);          // odd nibbles, a byte each
	const u32 ee = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0e0e0e0eu); // even nibbles
	h[0] = prmt(ee, 0u, 0x1404u);
	h[1] = prmt(ee, 0u, 0x3424u);
	h[2] = prmt(eo, 0u, 0x1404u);
	h[3] = prmt(eo, 0u, 0x3424u);
}

// The e4m3 bytes 1 and 3 of t -> f16x2 of the values times 2^-8, exact with
// subnormals (the e4m3 fields land in the f16's one to one).
DEV u32 e4m3_odd_f16x2(u32 t) { return (t & 0x80008000u) | ((t >> 1) & 0x3f803f80u); }

// Eight activations (x0..x7 in v.x, v.y) -> the B words of fp4x8_f16's pairs.
DEV uint4 act8_f16(uint2 v) {
	return make_uint4(e4m3_odd_f16x2(v.x << 8), e4m3_odd_f16x2(v.y << 8), e4m3_odd_f16x2(v.x), e4m3_odd_f16x2(v.y));
}

// Four NVFP4 e4m3 scales (a byte each) -> f16 s * 2^7 in both halves of
// each word (the f16 multiplier of fp4x8_f16's words); e4m3 NaN stays NaN.
DEV void nv_scale4(u32 x, u32* s) {
	const u32 f02 = hmul2(e4m3_odd_f16x2(x << 8), 0x78007800u), f13 = hmul2(e4m3_odd_f16x2(x), 0x78007800u);
	s[0] = prmt(f02, 0u, 0x1010u);
	s[1] = prmt(f13, 0u, 0x1010u);
	s[2] = prmt(f02, 0u, 0x3232u);
	s[3] = prmt(f13, 0u, 0x3232u);
	if (((x & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) { // a NaN code (0x7f or 0xff)
#pragma unroll
		for (int i = 0; i < 4; i++)
			if (((x >> (8 * i)) & 0x7fu) == 0x7fu) s[i] = 0x7e007e00u;
	}
}

// Shared-memory row of CTA weight row r in the converted scales: rows g and
// g + 8 of a warp side by side, so one 8-byte load gives a lane both.
DEV int sc_row(int r) { return (r & ~15) | ((r & 7) << 1) | ((r >> 3) & 1); }

// The weight undo of the f16 encodings: MXFP4 A * 2^-14, B * 2^-8; NVFP4 A *
// s * 2^-7, B * 2^-8.
#define F16_UNDO_MX 4194304.0f // 2^22
#define F16_UNDO_NV 32768.0f   // 2^15

template <bool NV>
DEV void decf16_cta(u8* smem, u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	int e, int mBeg, int mEnd, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const int g = lane >> 2, c = lane & 3;
	const int col0 = blockIdx.x * 64;
	const int nkb = K / 128;
	const int kb0 = part ? blockIdx.z * kbPer : 0;
	const int kb1 = part ? min(kb0 + kbPer, nkb) : nkb;
	const int nb = kb1 - kb0;
	const int gpr = NV ? K / 16 : K / 32; // scale groups per weight row
	constexpr int sbytes = NV ? 8 : 4;    // scale bytes per row per 128-K block
	const u8* we = w + (size_t)e * N * (K / 2);
	const u8* se = wscale + (size_t)e * N * gpr;
	u8* const ring = smem;
	u8* const slots = smem + FS * FSTAGE;

	// Copies (moe_fp4_dec's): weights 2 x 16 B a thread; threads 0..63 a
	// scale row, 64..127 a 16-byte chunk of a token's 128 activations.
	const int wr = tid >> 2, wp = tid & 3;
	const int wok0 = col0 + wr < N ? 16 : 0, wok1 = col0 + wr + 32 < N ? 16 : 0;
	const u8* wq0 = we + (size_t)(wok0 ? col0 + wr : 0) * (K / 2) + wp * 16 + (size_t)kb0 * 64;
	const u8* wq1 = wq0 + (wok1 ? (size_t)32 * (K / 2) : 0);
	const u32 sring = smem_addr(ring);
	const u32 wd = sring + wr * 64 + ((wp ^ ((wr >> 1) & 3)) << 4);
	const u8* aq;
	u32 ad;
	int aok, astep;
	if (tid < 64) {
		const int row = col0 + tid;
		aok = row < N ? sbytes : 0;
		aq = se + (size_t)(row < N ? row : 0) * gpr + (size_t)kb0 * sbytes;
		ad = sring + FW + FX + tid * 8;
		astep = sbytes;
	} else {
		const int u = tid - 64, tk = mBeg + (u >> 3);
		aok = tk < mEnd ? 16 : 0;
		aq = xq + (size_t)(tk < mEnd ? tk : mBeg) * K + (u & 7) * 16 + (size_t)kb0 * 128;
		ad = sring + FW + (u >> 3) * 128 + (u & 7) * 16;
		astep = 128;
	}
	auto issue = [&](u32 off) { // into the stage at byte offset off
		cp16(wd + off, wq0, wok0);
		cp16(wd + off + 32 * 64, wq1, wok1);
		if (tid >= 64) cp16(ad + off, aq, aok);
		else cp_ca<sbytes>(ad + off, aq, aok);
		wq0 += 64;
		wq1 += 64;
		aq += astep;
	};
#pragma unroll
	for (int s = 0; s < FS - 1; s++) {
		if (s < nb) issue(s * FSTAGE);
		cp_async_commit();
	}

	// ldmatrix addresses (moe_fp4_dec's): lane l reads row (l&7) + 8*((l>>3)&1)
	// of the warp's 16, chunk l>>4 (+2 for the second x4, at ^ 32).
	const int lr = wid * 16 + (lane & 7) + 8 * ((lane >> 3) & 1);
	const u32 ldA0 = sring + lr * 64 + (((lane >> 4) ^ ((lane >> 1) & 3)) << 4);
	// Producer: activations of token tid>>4, elements 8*(tid&15)..+7 (ring
	// pX, slot pXH); scales of row tid>>1, half tid&1 of its bytes (pS, pSC).
	const int ptok = tid >> 4, prow = tid >> 1, ph = tid & 1;
	const u32 slot0 = sring + FS * FSTAGE, slotFlip = slot0 ^ (slot0 + FSLOT);
	const u32 pX = sring + FW + ptok * 128 + (tid & 15) * 8, pXH = ptok * FXH_ROW + (tid & 15) * 16;
	const u32 pS = sring + FW + FX + prow * 8 + (NV ? 4 * ph : 0), pShift = NV ? 0 : 16 * ph;
	const u32 pSC = FXH + 4 * (sc_row(prow) + (NV ? 4 : 2) * ph * FSC);
	// Consumer: B of token g, chunk j at + j*64; scales of rows g, g + 8
	// (NVFP4: of this lane's 16-group, c >> 1, of each chunk).
	const u32 bo = g * FXH_ROW + c * 16, so = FXH + 4 * (wid * 16 + 2 * g) + (NV ? 4 * FSC * (c >> 1) : 0);
	// This thread's D tokens: 2c and 2c + 1 (columns of the m16n8 tile).
	// Tokens past the tile read a valid row's scales: their B columns are
	// zero and their outputs are not stored.
	const int tA = mBeg + 2 * c, tB = tA + 1;
	const u8* xsA = xs + (size_t)(tA < mEnd ? tA : mBeg) * nkb + kb0; // < 2^31 entries: Mtot * K / 128
	const u8* xsB = xs + (size_t)(tB < mEnd ? tB : mBeg) * nkb + kb0;
	u32 wv[8], xa = 0u, xb = 0u;
	float acc[4] = {0.f, 0.f, 0.f, 0.f}; // (rowA, tA), (rowA, tB), (rowB, tA), (rowB, tB)

	// The block in the ring stage at byte offset off -> converted slot sl,
	// weights into wv, activation scales into xa, xb.
	auto produce = [&](u32 off, u32 sl) {
		sts128(sl + pXH, act8_f16(lds64(pX + off)));
		if (NV) {
			u32 s4[4];
			nv_scale4(lds32(pS + off), s4);
#pragma unroll
			for (int k = 0; k < 4; k++) sts32(sl + pSC + 4 * FSC * k, s4[k]);
		} else {
			const u32 b2 = lds32(pS + off) >> pShift; // bytes 2ph, 2ph + 1
			sts32(sl + pSC, __float_as_uint(e8m0_to_f32_sel(b2)));
			sts32(sl + pSC + 4 * FSC, __float_as_uint(e8m0_to_f32_sel(b2 >> 8)));
		}
		ldsm_x4(wv, ldA0 + off);
		ldsm_x4(wv + 4, (ldA0 + off) ^ 32u);
		xa = *xsA++;
		xb = *xsB++;
	};
	// The MMAs of the block produce() converted into slot sl.
	auto compute = [&](u32 sl) {
		float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
		for (int j = 0; j < 4; j++) {
			u32 ha[4], hb[4];
			fp4x8_f16(wv[2 * j], ha);     // row g
			fp4x8_f16(wv[2 * j + 1], hb); // row g + 8
			const uint4 b = lds128(sl + bo + j * 64);
			const u32 b0[2] = {b.x, b.y}, b1[2] = {b.z, b.w};
			if (NV) {
				const uint2 s = lds64(sl + so + 4 * FSC * 2 * j);
#pragma unroll
				for (int k = 0; k < 4; k++) ha[k] = hmul2(ha[k], s.x), hb[k] = hmul2(hb[k], s.y);
			}
			const u32 a0[4] = {ha[0], hb[0], ha[1], hb[1]}, a1[4] = {ha[2], hb[2], ha[3], hb[3]};
			if (NV) {
				mma_f16_16816(blk, a0, b0);
				mma_f16_16816(blk, a1, b1);
			} else {
				float p[4] = {0.f, 0.f, 0.f, 0.f};
				mma_f16_16816(p, a0, b0);
				mma_f16_16816(p, a1, b1);
				const uint2 f = lds64(sl + so + 4 * FSC * j);
				blk[0] = fmaf(p[0], __uint_as_float(f.x), blk[0]);
				blk[1] = fmaf(p[1], __uint_as_float(f.x), blk[1]);
				blk[2] = fmaf(p[2], __uint_as_float(f.y), blk[2]);
				blk[3] = fmaf(p[3], __uint_as_float(f.y), blk[3]);
			}
		}
		const float x0 = e8m0_to_f32_sel(xa), x1 = e8m0_to_f32_sel(xb);
		acc[0] = fmaf(blk[0], x0, acc[0]);
		acc[1] = fmaf(blk[1], x1, acc[1]);
		acc[2] = fmaf(blk[2], x0, acc[2]);
		acc[3] = fmaf(blk[3], x1, acc[3]);
	};

	// Step i: block i landed for all (barrier), the copy of block i + FS - 1
	// goes out into the stage block i - 1 left, block i - 1's MMAs run from
	// the slot and registers it filled, then block i is converted into the
	// other slot.
	static_assert(FS == 3, "the stage offsets below rotate over three stages");
	u32 off = 0, sl = slot0; // block i's stage and slot
	for (int i = 0; i <= nb; i++) {
		cp_async_wait<FS - 2>();
		__syncthreads();
		if (i + FS - 1 < nb) issue(off == 0 ? 2 * FSTAGE : off - FSTAGE); // stage (i + 2) % 3
		cp_async_commit();
		if (i > 0) compute(sl ^ slotFlip);
		if (i < nb) produce(off, sl);
		off = off == 2 * FSTAGE ? 0 : off + FSTAGE;
		sl ^= slotFlip;
	}
	cp_async_wait<0>();
	const float G = ((NV && gscale) ? gscale[e] : 1.0f) * (NV ? F16_UNDO_NV : F16_UNDO_MX);
	const int oA = col0 + wid * 16 + g, oB = oA + 8;
	const int os[4] = {oA, oA, oB, oB}, ts[4] = {tA, tB, tA, tB};
#pragma unroll
	for (int k = 0; k < 4; k++) {
		if (os[k] >= N || ts[k] >= mEnd) continue;
		const float v = acc[k] * G;
		if (part) part[((size_t)blockIdx.z * Mtot + ts[k]) * N + os[k]] = v;
		else y[(size_t)ts[k] * N + os[k]] = (u16)f32_to_bf16(v);
	}
	if (part && counters) dec_fixup(ring, y, part, counters + blockIdx.y * gridDim.x + blockIdx.x, mBeg, mEnd, col0, N, Mtot);
}

template <bool NV>
DEV void decf16_kernel(u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	PDL_ENTRY();
	__shared__ __align__(128) u8 smem[FSMEM];
	const int t = blockIdx.y;
	const int cnt = scratch[0];
	const int4 tile = reinterpret_cast<const int4*>(scratch + 4)[t]; // in bounds: t < maxTiles
	if (t >= cnt) return;
	decf16_cta<NV>(smem, y, xq, xs, tile.x, tile.y, tile.z, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

// sm_90: 8 CTAs (32 warps, <= 64 registers, 26.5 KB of shared memory each)
// an SM, the grid moe_fp4_dec's planner sizes (decCTAsPerSM). Elsewhere no
// occupancy target, no spills.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define F16_MIN_CTAS 8
#else
#define F16_MIN_CTAS 1
#endif
extern "C" __global__ void __launch_bounds__(128, F16_MIN_CTAS) moe_fp4_decf16(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	decf16_kernel<false>(y, xq, xs, scratch, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}

extern "C" __global__ void __launch_bounds__(128, F16_MIN_CTAS) moe_fp4_decf16_nv(
	u16* __restrict__ y, const u8* __restrict__ xq, const u8* __restrict__ xs,
	const int* __restrict__ scratch, const u8* __restrict__ w, const u8* __restrict__ wscale,
	const float* __restrict__ gscale, int N, int K, float* __restrict__ part, int kbPer, int Mtot, int* __restrict__ counters)
{
	decf16_kernel<true>(y, xq, xs, scratch, w, wscale, gscale, N, K, part, kbPer, Mtot, counters);
}
