// MoE grouped GEMM over FP4 expert weights on Hopper tensor cores (sm_90a):
// the same function as moe_fp4_gemm (kernels/moe_fp4.cu) for prefill-sized
// tile lists (moe_tile_map with bm = BT rows per tile).
//
// Everything is exact in bf16, so the whole K reduction runs in the tensor
// core's fp32 accumulator with no promotion steps:
//   - fp8_dequant_bf16 turns the permuted activations into bf16 x*2^s (an e4m3
//     value times a power of two is a bf16 value);
//   - two producer warpgroups unpack each weight row's FP4 codes to bf16 and
//     multiply by its group scale (an e2m1 value times an e8m0 power of two,
//     or times an e4m3 NVFP4 scale, has at most 6 significant bits), writing
//     the 128-byte-swizzled K-major layout wgmma reads; NVFP4 weights are
//     staged times 2^-9 (still exact) and G_e carries 2^9 back; thread 0
//     loads the token tile with TMA;
//   - two math warpgroups each multiply 64 weight rows (wgmma's M) by the BT
//     tokens of the tile (wgmma's N: no row slots are wasted on small experts),
//     keeping one wgmma group in flight.
// A work item is 128 output columns of one tile; CTAs past the items of the
// tiles the list holds exit at once, so experts with no rows cost nothing.
// y = bf16(G_e * acc), written only for the tile's rows.
#include "sm90.cuh"

// Producer warpgroups (unpacking), then two math warpgroups (wgmma).
#define MW_PRODUCERS 2

// xb[r, k] = bf16(e4m3(xq[r, k]) * 2^(xs[r, k/128] - 127)) for r < rows; 8 per thread.
extern "C" __global__ void fp8_dequant_bf16(u16* __restrict__ xb, const u8* __restrict__ xq,
	const u8* __restrict__ xs, int rows, int K)
{
	PDL_ENTRY();
	const size_t n8 = (size_t)rows * K / 8;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
		const size_t e = i * 8;
		const size_t r = e / K;
		const float s = e8m0_to_f32(xs[r * (K / 128) + (e % K) / 128]);
		const uint2 v = *reinterpret_cast<const uint2*>(xq + e);
		uint4 o;
		u32* op = &o.x;
#pragma unroll
		for (int j = 0; j < 4; j++) {
			const u32 w = j < 2 ? v.x : v.y, sh = 16 * (j & 1);
			op[j] = pack_bf16x2(e4m3_to_f32((w >> sh) & 0xffu) * s, e4m3_to_f32((w >> (sh + 8)) & 0xffu) * s);
		}
		*reinterpret_cast<uint4*>(xb + e) = o;
	}
}

#ifdef SM90A
// d (64 weight rows x BT tokens, fp32) += A(64x16 bf16) * B(BTx16 bf16)^T, both K-major.
DEV void wgmma_bf16(float (&d)[16], u64 da, u64 db) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
		"wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
		"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
		: "l"(da), "l"(db));
}

DEV void wgmma_bf16(float (&d)[32], u64 da, u64 db) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
		"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
		"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
		: "l"(da), "l"(db));
}

DEV void wgmma_bf16(float (&d)[64], u64 da, u64 db) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.eq.u32 p, 1, 1;\n"
		"wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
		"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
		: "l"(da), "l"(db));
}
DEV u32 bf16x2_mul(u32 a, u32 b) {
	u32 d;
	asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
	return d;
}

// Eight e2m1 codes (element i in nibble i) times a bf16x2 scale -> four
// bf16x2 words (elements 0,1 .. 6,7), exact. A byte permute puts nibbles 2p
// and 2p+1 at the bottom of the two halves; sign << 15 | (q & 7) << 6 is then
// the bf16 of e2m1(q) * 2^-126 (code 1, 0.5, is the subnormal 2^-127), and
// the scale carries the 2^126 back.
DEV uint4 e2m1x8_scaled(u32 w, u32 s2) {
	const u32 w4 = w >> 4;
	u32 o[4];
#pragma unroll
	for (int p = 0; p < 4; p++) {
		const u32 x = __byte_perm(w, w4, p | ((4 + p) << 8));
		o[p] = bf16x2_mul(((x << 12) & 0x80008000u) | ((x << 6) & 0x01C001C0u), s2);
	}
	return make_uint4(o[0], o[1], o[2], o[3]);
}

template <int BT>
struct MoeWG {
	static constexpr int STAGES = BT >= 128 ? 3 : 4;
	static constexpr int W_BYTES = 128 * 256; // 128 rows x 128 K bf16, as two 64-K swizzle atoms
	static constexpr int X_ATOM = BT * 128;
	static constexpr int STAGE = W_BYTES + 2 * X_ATOM;
};

// Work items: the list's tiles x 128-column blocks (item i: tile i / ncb,
// column block i % ncb, so CTAs running together share a token tile). CTA b
// of a grid of G takes items b, b + G, ... (one CTA an SM: persistent); the
// stage ring runs on across items (block counter g), so a CTA's next item
// loads while its math warpgroups store the last one.
template <int BT>
DEV void moe_fp4_wg_body(u16* __restrict__ y, const TmaMap* mapX, const int* __restrict__ scratch,
	const u8* __restrict__ w, const u8* __restrict__ wscale, const float* __restrict__ gscale, int nvfp4, int N, int K)
{
	using C = MoeWG<BT>;
	const int ncb = (N + 127) / 128;
	const int items = scratch[0] * ncb;
	const int first = blockIdx.y * gridDim.x + blockIdx.x, stride = gridDim.x * gridDim.y;
	if (first >= items) return;
	auto item = [&](int i, int& e, int& mBeg, int& mEnd, int& n0) {
		const int4 tile = reinterpret_cast<const int4*>(scratch + 4)[i / ncb]; // in bounds: i / ncb < count
		e = tile.x, mBeg = tile.y, mEnd = tile.z, n0 = (i % ncb) * 128;
	};
	extern __shared__ __align__(1024) u8 smem_raw[];
	u8* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
	u64* full = reinterpret_cast<u64*>(smem + C::STAGES * C::STAGE);
	u64* empty = full + C::STAGES;
	const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
	const int nkb = K / 128;
	if (threadIdx.x == 0) {
		for (int s = 0; s < C::STAGES; s++) {
			mbar_init(&full[s], 128 * MW_PRODUCERS); // every producer thread (thread 0 with the TMA bytes)
			mbar_init(&empty[s], 8);  // lane 0 of each math warp
		}
		mbar_init_fence();
	}
	__syncthreads();

	if (wg < MW_PRODUCERS) {
		// Producer thread: the 32-K quarter q of rows rr and rr + 64 of every
		// 128-K block. A warp's load covers 8 rows x 64 bytes, whole sectors
		// (one thread per row's 32 bytes needed twice the L1 wavefronts, and
		// L1 was the busiest unit); the 8 lanes of a quarter-warp hold 8 rows,
		// so their swizzled 16-byte stores hit distinct banks.
		const int pt = threadIdx.x, l = pt & 31, q = l >> 3, rr = (pt >> 5) * 8 + (l & 7);
		const int gpr = nvfp4 ? K / 16 : K / 32;
		const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
		int g = 0; // blocks staged so far, over all items
		for (int it = first; it < items; it += stride) {
			int e, mBeg, mEnd, n0;
			item(it, e, mBeg, mEnd, n0);
			const uint4* wr[2];
			const u8* sr[2];
			bool ok[2];
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int n = n0 + rr + 64 * h;
				ok[h] = n < N;
				wr[h] = reinterpret_cast<const uint4*>(w + ((size_t)e * N + (ok[h] ? n : 0)) * (K / 2)) + q;
				sr[h] = wscale + ((size_t)e * N + (ok[h] ? n : 0)) * gpr;
			}
			uint4 raw[2];
			u32 rs[2];
			// Codes and scales of block kb+1 load into registers while block kb is unpacked.
			auto fetch = [&](int kb) {
#pragma unroll
				for (int h = 0; h < 2; h++) {
					raw[h] = ok[h] ? wr[h][kb * 4] : z4;
					if (nvfp4) rs[h] = ok[h] ? *reinterpret_cast<const u16*>(sr[h] + kb * 8 + 2 * q) : 0u;
					else rs[h] = ok[h] ? sr[h][kb * 4 + q] : 0u;
				}
			};
			if (nkb > 0) fetch(0);
			for (int kb = 0; kb < nkb; kb++, g++) {
				const int s = g % C::STAGES;
				const u32 ph = (g / C::STAGES) & 1;
				const uint4 cur[2] = {raw[0], raw[1]};
				const u32 cs[2] = {rs[0], rs[1]};
				if (kb + 1 < nkb) fetch(kb + 1);
				mbar_wait(&empty[s], ph ^ 1);
				u8* Ws = smem + s * C::STAGE;
				if (pt == 0) {
					u8* Xs = Ws + C::W_BYTES;
					mbar_expect_tx(&full[s], 2 * C::X_ATOM);
					tma_load2d(Xs, mapX, &full[s], kb * 256, mBeg);
					tma_load2d(Xs + C::X_ATOM, mapX, &full[s], kb * 256 + 128, mBeg);
				}
#pragma unroll
				for (int h = 0; h < 2; h++) {
					const int row = rr + 64 * h;
					u8* dst = Ws + (q >> 1) * (128 * 128) + row * 128;
					u32 s2[2]; // bf16x2 scales of chunks 0-1 and 2-3
					u32 E = 0;
					if (nvfp4) {
						// e4m3 * 2^117 < 2^126: the bf16 scale times the codes' 2^-126 is
						// the weight times 2^-9, which the epilogue gives back.
#pragma unroll
						for (int c = 0; c < 2; c++) {
							const u32 sb = f32_to_bf16(e4m3_to_f32((cs[h] >> (8 * c)) & 0xffu) * 0x1p117f); // NaN stays NaN
							s2[c] = sb | (sb << 16);
						}
					} else {
						// 2^(E-127) * 2^126 is a bf16 up to E = 128; larger scales take a second factor.
						E = cs[h];
						const u32 sb = (min(E, 128u) + 126u) << 7;
						s2[0] = s2[1] = sb | (sb << 16);
					}
					const u32 x = E == 255u ? 0x7fc07fc0u : ((E - 1u) << 7) * 0x10001u;
#pragma unroll
					for (int j = 0; j < 4; j++) {
						const int c8 = 4 * (q & 1) + j; // 16-byte chunk of the swizzle atom
						const u32 codes = j == 0 ? cur[h].x : j == 1 ? cur[h].y : j == 2 ? cur[h].z : cur[h].w;
						uint4 o = e2m1x8_scaled(codes, s2[j >> 1]);
						if (E > 128u) o = make_uint4(bf16x2_mul(o.x, x), bf16x2_mul(o.y, x), bf16x2_mul(o.z, x), bf16x2_mul(o.w, x));
						*reinterpret_cast<uint4*>(dst + ((c8 ^ (row & 7)) << 4)) = o;
					}
				}
				asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
				mbar_arrive(&full[s]);
			}
		}
		return;
	}

	const int cw = wg - MW_PRODUCERS;
	const int wq = tid >> 5, l = tid & 31;
	int g = 0; // blocks consumed so far, over all items
	for (int it = first; it < items; it += stride) {
		float acc[BT / 2];
#pragma unroll
		for (int i = 0; i < BT / 2; i++) acc[i] = 0.f;
		for (int kb = 0; kb < nkb; kb++, g++) {
			const int s = g % C::STAGES;
			mbar_wait(&full[s], (g / C::STAGES) & 1);
			const u8* Ws = smem + s * C::STAGE;
			const u8* Xs = Ws + C::W_BYTES;
			wg_pin(acc);
			wg_fence();
#pragma unroll
			for (int a = 0; a < 2; a++) {
				const u64 da = desc_sw128(Ws + a * (128 * 128) + cw * (64 * 128)), db = desc_sw128(Xs + a * C::X_ATOM);
#pragma unroll
				for (int ks = 0; ks < 4; ks++) wgmma_bf16(acc, da + 2 * ks, db + 2 * ks);
			}
			wg_commit();
			wg_wait<1>();
			wg_pin(acc);
			if (kb > 0 && l == 0) mbar_arrive(&empty[(g - 1) % C::STAGES]);
		}
		wg_wait<0>();
		wg_pin(acc);
		if (nkb > 0 && l == 0) mbar_arrive(&empty[(g - 1) % C::STAGES]); // the item's last stage
		int e, mBeg, mEnd, n0; // read after the K loop: fewer live registers in it
		item(it, e, mBeg, mEnd, n0);
		// NVFP4 weights were staged times 2^-9 (the producers' scale), exactly.
		const float G = nvfp4 ? (gscale ? gscale[e] : 1.0f) * 512.0f : 1.0f;
		// d[4q+{0,1}]: (feature r0, tokens 8q+2c+{0,1}); d[4q+{2,3}]: feature r0+8.
		const int r0 = n0 + 64 * cw + 16 * wq + (l >> 2);
		const int c2 = 2 * (l & 3);
#pragma unroll
		for (int i = 0; i < BT / 2; i++) {
			const int n = r0 + ((i & 2) ? 8 : 0);
			const int m = mBeg + 8 * (i >> 2) + c2 + (i & 1);
			if (n < N && m < mEnd) y[(size_t)m * N + n] = (u16)f32_to_bf16(acc[i] * G);
		}
	}
}
#endif

#ifdef SM90A
#define MOE_WG_BODY(BT) moe_fp4_wg_body<BT>(y, &mapX, scratch, w, wscale, gscale, nvfp4, N, K)
#else
#define MOE_WG_BODY(BT)
#endif
#define MOE_WG_KERNEL(BT)                                                                                    \
	extern "C" __global__ void __launch_bounds__(128 * (MW_PRODUCERS + 2), 1) moe_fp4_wg##BT(u16* __restrict__ y,                \
		const __grid_constant__ TmaMap mapX, const int* __restrict__ scratch, const u8* __restrict__ w,      \
		const u8* __restrict__ wscale, const float* __restrict__ gscale, int nvfp4, int N, int K) \
	{ PDL_ENTRY();                                                                                           \
		MOE_WG_BODY(BT);                                                                                     \
	}
MOE_WG_KERNEL(32)
MOE_WG_KERNEL(64)
MOE_WG_KERNEL(128)
