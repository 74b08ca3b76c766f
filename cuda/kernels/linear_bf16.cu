// Grouped linears on bf16 tensor cores.
//
// linear_bf16_w1/_w2: the faithful grouped output projection (wo_a, spec
// §5.8): for output row o of group g = o / R,
//   y[m, o] = bf16( sum_k x[m, g*K + k] * W[o, k] )   (fp32 sums, stored as f32)
// with W bf16 (FMT 1) or FP8 128x128-block e8m0-scaled (FMT 2), dequantised
// to bf16 while it is staged (exact: e4m3 times a power of two has 4
// significant bits). x must hold bf16 values (faithful mode rounds the
// attention output and the inverse RoPE to bf16), so its conversion is exact
// and every product is the one the fp32 kernel (linear_f32) forms; only the
// order of the fp32 sums differs. Scales below 2^-117 would give bf16
// subnormal weights, which the tensor cores may flush (docs/numerics.md).
//
// linear_bf16x3_w1: the fp32 linears (compressor wkv/wgate: fp32 x, bf16
// weights, fp32 out, no rounding). x is split exactly into three bf16 parts
// (hi = x with its low 16 bits cleared, mid likewise of x - hi, lo = the
// rest, at most 8 significant bits), so hi*w + mid*w + lo*w are exact
// products whose fp32 sum differs from x*w only by fp32 summation order
// (for |x| >= 2^-110; below, a remainder in fp32 subnormals loses < 2^-133;
// cuda/bf16split_test.go); three MMAs per product instead of one.
//
// A CTA computes a 128x128 tile with 8 warps (2 x 4, 64x32 each, mma.sync
// m16n8k16 from ldmatrix), K in steps of 32 through two shared-memory
// buffers (one for the split: three activation planes), the next step's
// global loads in flight during the MMAs.
#include "common.cuh"

#define BT_M 128
#define BT_N 128
#define BT_K 32
#define BT_LD 40 // bf16 per shared row: 32 + 8 (80-byte rows: ldmatrix's 8 rows hit distinct banks)

// x0, x1 split into three bf16x2 planes (hi, mid, lo) by truncation: every
// part is exactly a bf16 (its low 16 bits are zero) and hi + mid + lo = x.
DEV void split_bf16x3(float x0, float x1, u32 (&hml)[3]) {
	u32 hv[2], mv[2], lv[2];
	const float xv[2] = {x0, x1};
#pragma unroll
	for (int j = 0; j < 2; j++) {
		const float v = xv[j];
		const float h = __uint_as_float(__float_as_uint(v) & 0xffff0000u);
		const float r = v - h; // exact
		const float m = __uint_as_float(__float_as_uint(r) & 0xffff0000u);
		hv[j] = __float_as_uint(h) >> 16;
		mv[j] = __float_as_uint(m) >> 16;
		lv[j] = __float_as_uint(r - m) >> 16; // exact, at most 8 significant bits
	}
	hml[0] = hv[0] | (hv[1] << 16);
	hml[1] = mv[0] | (mv[1] << 16);
	hml[2] = lv[0] | (lv[1] << 16);
}

// SPLIT 1: x is bf16-valued, output rounded to bf16; SPLIT 3: fp32 x in three
// bf16 planes, fp32 output.
template <int FMT, int SPLIT>
DEV void bf16_grouped(float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w,
	const u8* __restrict__ ws, int sCols, int M, int N, int K, int R, int ldx)
{
	constexpr int NBUF = SPLIT == 1 ? 2 : 1; // 40 KB of static shared memory either way
	__shared__ __align__(16) u16 As[NBUF][SPLIT][BT_M * BT_LD];
	__shared__ __align__(16) u16 Bs[NBUF][BT_N * BT_LD];
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const int g = blockIdx.z, m0 = blockIdx.y * BT_M;
	const int o0 = g * R + blockIdx.x * BT_N, oEnd = min((g + 1) * R, N);

	// Staging: thread tid owns row tid >> 1 of both tiles, 16 of its 32 columns.
	const int sr = tid >> 1, sc = (tid & 1) * 16;
	const bool aok = m0 + sr < M, bok = o0 + sr < oEnd;
	const float* xa = x + (size_t)g * K + (size_t)(aok ? m0 + sr : 0) * ldx + sc;
	const int wo = bok ? o0 + sr : 0;
	float4 ra[4];
	uint4 rb[2];
	u32 rs = 0;
	auto load = [&](int k0) {
#pragma unroll
		for (int i = 0; i < 4; i++)
			ra[i] = aok ? *reinterpret_cast<const float4*>(xa + k0 + 4 * i) : make_float4(0.f, 0.f, 0.f, 0.f);
		if (FMT == 1) {
			const uint4* p = reinterpret_cast<const uint4*>(w + ((size_t)wo * K + k0 + sc) * 2);
			rb[0] = bok ? p[0] : make_uint4(0, 0, 0, 0);
			rb[1] = bok ? p[1] : make_uint4(0, 0, 0, 0);
		} else {
			rb[0] = bok ? *reinterpret_cast<const uint4*>(w + (size_t)wo * K + k0 + sc) : make_uint4(0, 0, 0, 0);
			rs = ws[(size_t)(wo / 128) * sCols + k0 / 128];
		}
	};
	auto store = [&](int buf) {
		if (SPLIT == 1) {
			uint4 a[2];
			u32* av = reinterpret_cast<u32*>(a);
#pragma unroll
			for (int i = 0; i < 4; i++) {
				av[2 * i] = pack_bf16x2(ra[i].x, ra[i].y);
				av[2 * i + 1] = pack_bf16x2(ra[i].z, ra[i].w);
			}
			uint4* ad = reinterpret_cast<uint4*>(&As[buf][0][sr * BT_LD + sc]);
			ad[0] = a[0];
			ad[1] = a[1];
		} else {
			uint4 a[3][2];
			const float* xv = reinterpret_cast<const float*>(ra);
#pragma unroll
			for (int i = 0; i < 16; i += 2) {
				u32 hml[3];
				split_bf16x3(xv[i], xv[i + 1], hml);
#pragma unroll
				for (int p = 0; p < 3; p++) reinterpret_cast<u32*>(a[p])[i >> 1] = hml[p];
			}
#pragma unroll
			for (int p = 0; p < SPLIT; p++) {
				uint4* ad = reinterpret_cast<uint4*>(&As[buf][p][sr * BT_LD + sc]);
				ad[0] = a[p][0];
				ad[1] = a[p][1];
			}
		}
		uint4* bd = reinterpret_cast<uint4*>(&Bs[buf][sr * BT_LD + sc]);
		if (FMT == 1) {
			bd[0] = rb[0];
			bd[1] = rb[1];
		} else {
			const float s = e8m0_to_f32_sel(rs);
			const u32* q = reinterpret_cast<const u32*>(&rb[0]);
			uint4 b[2];
			u32* bv = reinterpret_cast<u32*>(b);
#pragma unroll
			for (int i = 0; i < 8; i++) {
				const u32 c = q[i >> 1] >> (16 * (i & 1));
				bv[i] = pack_bf16x2(e4m3_to_f32(c & 0xffu) * s, e4m3_to_f32((c >> 8) & 0xffu) * s);
			}
			bd[0] = b[0];
			bd[1] = b[1];
		}
	};

	// Warp (wm, wn) covers rows wm*64 .. +63 and columns wn*32 .. +31 of the tile.
	const int wm = wid & 1, wn = wid >> 1;
	float acc[4][4][4];
	zero_acc(acc);
	// ldmatrix row addresses: A 16x16 blocks (lanes 0-15 rows at k, 16-31 at k+8);
	// B pairs of n8 tiles (lanes 0-7 / 8-15: rows 0-7 at k / k+8, 16-31: rows 8-15).
	const u32 aoff = ((wm * 64 + (lane & 15)) * BT_LD + (lane >> 4) * 8) * 2;
	const u32 boff = ((wn * 32 + (lane & 7) + ((lane >> 4) << 3)) * BT_LD + ((lane >> 3) & 1) * 8) * 2;
	auto compute = [&](int buf) {
		const u32 b0 = smem_addr(&Bs[buf][0]) + boff;
#pragma unroll
		for (int ks = 0; ks < BT_K / 16; ks++) {
			u32 b[4][2];
#pragma unroll
			for (int np = 0; np < 2; np++) {
				u32 t[4];
				ldsm_x4(t, b0 + (np * 16 * BT_LD + ks * 16) * 2);
				b[2 * np][0] = t[0];
				b[2 * np][1] = t[1];
				b[2 * np + 1][0] = t[2];
				b[2 * np + 1][1] = t[3];
			}
#pragma unroll
			for (int p = 0; p < SPLIT; p++) {
				const u32 a0 = smem_addr(&As[buf][p][0]) + aoff;
				u32 a[4][4];
#pragma unroll
				for (int mt = 0; mt < 4; mt++) ldsm_x4(a[mt], a0 + (mt * 16 * BT_LD + ks * 16) * 2);
#pragma unroll
				for (int mt = 0; mt < 4; mt++)
#pragma unroll
					for (int nt = 0; nt < 4; nt++) mma_bf16_16816(acc[mt][nt], a[mt], b[nt]);
			}
		}
	};

	const int nk = K / BT_K;
	load(0);
	store(0);
	__syncthreads();
	for (int kt = 0; kt < nk; kt++) {
		if (kt + 1 < nk) load((kt + 1) * BT_K);
		compute(kt % NBUF);
		if (NBUF == 1) __syncthreads(); // one buffer: every warp is done with it
		if (kt + 1 < nk) store((kt + 1) % NBUF); // two: its last readers passed the barrier below one step ago
		__syncthreads();
	}

	// acc[mt][nt]: [0..1] row +0, [2..3] row +8; columns 2c, 2c+1 of the n8 tile.
#pragma unroll
	for (int mt = 0; mt < 4; mt++) {
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int m = m0 + wm * 64 + mt * 16 + (lane >> 2) + 8 * h;
			if (m >= M) continue;
#pragma unroll
			for (int nt = 0; nt < 4; nt++) {
				const int o = o0 + wn * 32 + nt * 8 + 2 * (lane & 3);
#pragma unroll
				for (int j = 0; j < 2; j++)
					if (o + j < oEnd) {
						const float v = acc[mt][nt][2 * h + j];
						y[(size_t)m * N + o + j] = SPLIT == 1 ? bf16_to_f32(f32_to_bf16(v)) : v;
					}
			}
		}
	}
}

extern "C" __global__ void __launch_bounds__(256) linear_bf16_w1(float* __restrict__ y, const float* __restrict__ x,
	const u8* __restrict__ w, const u8* __restrict__ ws, int sCols, int M, int N, int K, int R, int ldx)
{
	PDL_ENTRY();
	bf16_grouped<1, 1>(y, x, w, ws, sCols, M, N, K, R, ldx);
}

extern "C" __global__ void __launch_bounds__(256) linear_bf16_w2(float* __restrict__ y, const float* __restrict__ x,
	const u8* __restrict__ w, const u8* __restrict__ ws, int sCols, int M, int N, int K, int R, int ldx)
{
	PDL_ENTRY();
	bf16_grouped<2, 1>(y, x, w, ws, sCols, M, N, K, R, ldx);
}

extern "C" __global__ void __launch_bounds__(256) linear_bf16x3_w1(float* __restrict__ y, const float* __restrict__ x,
	const u8* __restrict__ w, const u8* __restrict__ ws, int sCols, int M, int N, int K, int R, int ldx)
{
	PDL_ENTRY();
	bf16_grouped<1, 3>(y, x, w, ws, sCols, M, N, K, R, ldx);
}

// ---- linear_bf16_dec: the same grouped linear for decode (M <= 8·NT) ----
// The weights are the MMA's A operand (16 output rows a warp) and the tokens
// its B (NT tiles of 8), so every weight byte is read once from HBM and x
// once per CTA (from L2, into shared memory as bf16). A CTA owns 128 rows
// (8 warps x 16) of one group and the K slice [y·kc, (y+1)·kc). Per 64-K
// chunk lane (g, t) loads 16 contiguous K of rows g and g+8; MMA step s
// takes its K 16t+4s..+3 into the fragment slots of k 2t, 2t+1, 2t+8, 2t+9,
// and B takes x at the same K (a dot product only needs A and B to agree on
// which K a slot holds). FP8 weights go to bf16 unscaled (exact); each
// chunk's MMAs sum into tmp, which the chunk's 128x128 block scale (a power
// of two) multiplies into acc: the products are those of linear_f32, only
// the order of the fp32 sums differs. bf16 weights likewise sum a chunk in
// tmp, added to acc in fp32: the tensor cores' accumulation is not IEEE, and
// 2048 K of MMAs into one accumulator drifted past 2^-20·Σ|products|
// (docs/numerics.md). SPLIT 3 (bf16 weights): fp32 x in the
// three exact bf16 planes of linear_bf16x3, three MMAs per product, for the
// fp32 linears (head, compressor); rnd 0 keeps their fp32 outputs. Split K
// (gridDim.y > 1): partials to part[split][M][N]; the tile's last CTA sums
// them in split order (sum_splits) and resets its counter.
#define BD_ROWS 128
#define BD_THREADS 256

// Four e4m3 bytes -> two bf16x2 (exact; NaN stays NaN).
DEV void e4m3x4_to_bf16x4(u32 r, u32& lo, u32& hi) {
	float v[4];
	e4m3x4_to_f32(r, v);
	lo = __byte_perm(__float_as_uint(v[0]), __float_as_uint(v[1]), 0x7632);
	hi = __byte_perm(__float_as_uint(v[2]), __float_as_uint(v[3]), 0x7632);
}

template <int FMT, int NT, int SPLIT>
DEV void bf16_dec(float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ w,
	const u8* __restrict__ ws, float* __restrict__ part, int* __restrict__ counters, int sCols, int M, int N, int K,
	int R, int ldx, int kc, int rnd)
{
	// x as SPLIT bf16 planes [SPLIT][8·NT][kc + 4] (the 8-byte slots of 16 lanes on distinct banks).
	extern __shared__ __align__(16) u16 xs[];
	__shared__ volatile int last;
	constexpr int LPC = FMT == 1 ? 4 : 2;     // uint4 a lane loads per chunk (both rows)
	constexpr int RING = NT >= 4 ? 8 : 16; // uint4 a lane keeps in flight
	constexpr int CPR = RING / LPC;           // chunks in the ring
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
	const int o0 = blockIdx.x * BD_ROWS, grp = o0 / R, kb = blockIdx.y * kc, nch = kc >> 6;
	const int ra = o0 + wid * 16 + g8;
	const int xst = kc + 4, xpl = 8 * NT * xst;
	const u8* pa = FMT == 2 ? w + (size_t)ra * K + kb + 16 * t4 : w + ((size_t)ra * K + kb + 16 * t4) * 2;
	const size_t rowB = FMT == 2 ? (size_t)8 * K : (size_t)16 * K; // row g+8
	constexpr int CB = FMT == 2 ? 64 : 128;                        // bytes of a row's chunk
	const u8* sp = FMT == 2 ? ws + (size_t)(o0 / 128) * sCols + kb / 128 : nullptr;
	uint4 r[RING];
	u32 sc[CPR];
	auto load = [&](int j, int c) {
		const u8* p = pa + (size_t)c * CB;
		if (FMT == 2) {
			r[2 * j] = ldw16(p);
			r[2 * j + 1] = ldw16(p + rowB);
			sc[j] = lds1(sp + (c >> 1));
		} else {
			r[4 * j] = ldw16(p);
			r[4 * j + 1] = ldw16(p + 16);
			r[4 * j + 2] = ldw16(p + rowB);
			r[4 * j + 3] = ldw16(p + rowB + 16);
		}
	};
	// The weights do not depend on the previous kernel: in flight before the wait.
#pragma unroll
	for (int j = 0; j < CPR; j++)
		if (j < nch) load(j, j);
	PDL_ENTRY();
	// x rows of this group and slice, as bf16 (SPLIT 1, exact: faithful x holds
	// bf16 values) or three exact bf16 planes (SPLIT 3); rows past M are zeros.
	const int q4 = kc >> 2;
	const float* xg = x + (size_t)grp * K + kb;
#pragma unroll 4
	for (int i = tid; i < 8 * NT * q4; i += BD_THREADS) {
		const int m = i / q4, c4 = i - m * q4;
		float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
		if (m < M) v = *reinterpret_cast<const float4*>(xg + (size_t)m * ldx + 4 * c4);
		u16* d = xs + m * xst + 4 * c4;
		if (SPLIT == 1) {
			*reinterpret_cast<uint2*>(d) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
		} else {
			u32 lo[3], hi[3];
			split_bf16x3(v.x, v.y, lo);
			split_bf16x3(v.z, v.w, hi);
#pragma unroll
			for (int p = 0; p < 3; p++) *reinterpret_cast<uint2*>(d + p * xpl) = make_uint2(lo[p], hi[p]);
		}
	}
	__syncthreads();

	float acc[NT][4];
#pragma unroll
	for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
	const u16* xl = xs + g8 * xst + 16 * t4;
	for (int c0 = 0; c0 < nch; c0 += CPR) {
#pragma unroll
		for (int j = 0; j < CPR; j++) {
			const int c = c0 + j;
			if (c >= nch) break;
			// A fragments of the chunk: a[s] for step s (rows g, g+8; k pairs lo, hi).
			u32 a[4][4];
			if (FMT == 2) {
				const u32* wa = reinterpret_cast<const u32*>(&r[2 * j]);
				const u32* wb = reinterpret_cast<const u32*>(&r[2 * j + 1]);
#pragma unroll
				for (int s = 0; s < 4; s++) {
					e4m3x4_to_bf16x4(wa[s], a[s][0], a[s][2]);
					e4m3x4_to_bf16x4(wb[s], a[s][1], a[s][3]);
				}
			} else {
				const u32* wa = reinterpret_cast<const u32*>(&r[4 * j]);
				const u32* wb = reinterpret_cast<const u32*>(&r[4 * j + 2]);
#pragma unroll
				for (int s = 0; s < 4; s++) {
					a[s][0] = wa[2 * s];
					a[s][2] = wa[2 * s + 1];
					a[s][1] = wb[2 * s];
					a[s][3] = wb[2 * s + 1];
				}
			}
			const float scl = FMT == 2 ? e8m0_to_f32_sel(sc[j]) : 1.f;
			// FP8: the ring slot is free once converted; bf16 weights are the
			// fragments themselves, so their slot refills after the MMAs.
			if (FMT == 2 && c + CPR < nch) load(j, c + CPR);
#pragma unroll
			for (int n = 0; n < NT; n++) {
				float t[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
				for (int s = 0; s < 4; s++) {
#pragma unroll
					for (int p = SPLIT - 1; p >= 0; p--) { // planes lo, mid, hi
						const uint2 b = *reinterpret_cast<const uint2*>(xl + p * xpl + n * 8 * xst + c * 64 + 4 * s);
						const u32 bb[2] = {b.x, b.y};
						mma_bf16_16816(t, a[s], bb);
					}
				}
#pragma unroll
				for (int i = 0; i < 4; i++) acc[n][i] = FMT == 2 ? fmaf(t[i], scl, acc[n][i]) : acc[n][i] + t[i];
			}
			if (FMT == 1 && c + CPR < nch) load(j, c + CPR);
		}
	}

	// acc[n]: [0..1] row ra, tokens 8n + 2t, +1; [2..3] row ra + 8.
	const int S = gridDim.y;
	float* dst = S == 1 ? y : part + (size_t)blockIdx.y * M * N;
#pragma unroll
	for (int n = 0; n < NT; n++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int m = 8 * n + 2 * t4 + (i & 1), o = ra + 8 * (i >> 1);
			if (m < M) dst[(size_t)m * N + o] = S == 1 ? rbf(acc[n][i], rnd) : acc[n][i];
		}
	if (S == 1) return;
	if (!splitk_last(counters + blockIdx.x, S, &last)) return;
	const size_t plane = (size_t)M * N;
	for (int i = tid; i < M * BD_ROWS; i += BD_THREADS) {
		const size_t o = (size_t)(i / BD_ROWS) * N + o0 + i % BD_ROWS;
		y[o] = rbf(sum_splits(part + o, plane, S), rnd);
	}
}

#define BF16_DEC_KERNEL(name, FMT, NT, SPLIT)                                                                       \
	extern "C" __global__ void __launch_bounds__(BD_THREADS, 2) name(float* __restrict__ y,                         \
		const float* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws, float* __restrict__ part, \
		int* __restrict__ counters, int sCols, int M, int N, int K, int R, int ldx, int kc, int rnd)               \
	{                                                                                                               \
		bf16_dec<FMT, NT, SPLIT>(y, x, w, ws, part, counters, sCols, M, N, K, R, ldx, kc, rnd);                     \
	}
BF16_DEC_KERNEL(linear_bf16_dec1_w1, 1, 1, 1)
BF16_DEC_KERNEL(linear_bf16_dec1_w2, 2, 1, 1)
BF16_DEC_KERNEL(linear_bf16_dec2_w1, 1, 2, 1)
BF16_DEC_KERNEL(linear_bf16_dec2_w2, 2, 2, 1)
BF16_DEC_KERNEL(linear_bf16_dec4_w1, 1, 4, 1)
BF16_DEC_KERNEL(linear_bf16_dec4_w2, 2, 4, 1)
// fp32 x (three planes, three MMAs per product), bf16 weights: the fp32 linears.
BF16_DEC_KERNEL(linear_bf16x3_dec1_w1, 1, 1, 3)
BF16_DEC_KERNEL(linear_bf16x3_dec2_w1, 1, 2, 3)
BF16_DEC_KERNEL(linear_bf16x3_dec4_w1, 1, 4, 3)
