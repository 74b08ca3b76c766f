// Shared device helpers. No CUDA headers: every type and conversion is
// spelled out with integer bit arithmetic so NVRTC needs no include path.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define DEV static __device__ __forceinline__

// First statement of every kernel (cuda/pdl.go): wait until the previous
// grid in the stream has completed and its writes are visible, then let the
// next grid be scheduled. Both are no-ops for launches without PDL.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_ENTRY() do { } while (0)
#endif

// L2 prefetch hint for [p, p + bytes): one bulk request (sm_90+), issued
// before PDL_ENTRY for weights (memory no kernel writes), so a kernel that
// waits on its predecessor already streams its first bytes. Skipped unless
// p and bytes are multiples of 16.
DEV void prefetch_l2(const void* p, unsigned long long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	if (bytes == 0 || bytes >= (1ull << 32) || ((reinterpret_cast<unsigned long long>(p) | bytes) & 15) != 0) return;
	asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"((unsigned)bytes) : "memory");
#endif
}

// bf16 <-> fp32. bf16 is the top half of an fp32.
DEV float bf16_to_f32(u32 h) { return __uint_as_float((h & 0xffffu) << 16); }

// Round to nearest even; NaN stays NaN.
DEV u32 f32_to_bf16(float f) {
	u32 u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
	u += 0x7fffu + ((u >> 16) & 1u);
	return u >> 16;
}

DEV u32 pack_bf16x2(float lo, float hi) { return f32_to_bf16(lo) | (f32_to_bf16(hi) << 16); }

// x rounded to bf16 when rnd (faithful), else kept.
DEV float rbf(float x, int rnd) { return rnd ? bf16_to_f32(f32_to_bf16(x)) : x; }

// A split-K sum: p[0] + p[plane] + ... + p[(splits-1)*plane] added in split
// order from 0, as linear_fp8_reduce and moe_fp4_dec's in-kernel fixup both
// do (the same bits). The loads bypass L1 (other CTAs of the grid may have
// just written the partials) and eight are issued before their adds.
DEV float sum_splits(const float* p, size_t plane, int splits) {
	float a = 0.f;
	for (int z0 = 0; z0 < splits; z0 += 8) {
		float v[8];
#pragma unroll
		for (int k = 0; k < 8; k++)
			if (z0 + k < splits) asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v[k]) : "l"(p + (size_t)(z0 + k) * plane));
#pragma unroll
		for (int k = 0; k < 8; k++)
			if (z0 + k < splits) a += v[k];
	}
	return a;
}

// Split-K arrival of a CTA (every thread calls it after writing its
// partials): the partials are published, the CTA counts itself in on
// counter, and the last of splits CTAs, which resets the counter for the
// next launch or graph replay, gets true after a fence, so that it sees
// every CTA's partials. flag: a shared int the CTA may overwrite.
DEV bool splitk_last(int* counter, int splits, volatile int* flag) {
	__threadfence(); // this thread's partials reach L2 before the CTA counts itself in
	__syncthreads();
	if (threadIdx.x == 0) {
		const int done = atomicAdd(counter, 1) == splits - 1;
		if (done) *counter = 0; // every other CTA has counted
		*flag = done;
	}
	__syncthreads();
	if (!*flag) return false;
	__threadfence(); // the others' partials, published before their counts
	return true;
}

// e4m3 ("fn": bias 7, no infinities, 0x7f/0xff NaN, max 448) -> fp32.
DEV float e4m3_to_f32(u32 b) {
	u32 em = b & 0x7fu;
	float v;
	if (em == 0x7fu) v = __uint_as_float(0x7fc00000u);
	else if (em < 8u) v = (float)em * 0.001953125f; // subnormal: m * 2^-9
	else v = __uint_as_float((em << 20) + (120u << 23));
	return (b & 0x80u) ? -v : v;
}

// fp32 -> e4m3 with round-to-nearest-even. The caller clamps to [-448, 448];
// NaN is mapped to 0x7f (NaN).
// The FP8 activation quantisation's block amax over a warp: each lane's
// partial max in, the block's out on every lane; a NaN wins (spec §3.3).
DEV float warp_amax(float amax) {
	for (int o = 16; o > 0; o >>= 1) {
		const float t = __shfl_xor_sync(0xffffffffu, amax, o);
		if (t > amax || t != t) amax = t;
	}
	return amax;
}

// The block's scale exponent e, s = 2^e = 2^ceil(log2(max(amax, 1e-4)/448)),
// from the fp32 bits (exact for powers of two), clamped to e8m0's range;
// amax finite.
DEV int fp8_scale_exp(float amax) {
	const u32 bits = __float_as_uint(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
	int e = (int)((bits >> 23) & 0xff) - 127;
	if ((bits & 0x7fffff) != 0) e++;
	return max(-127, min(127, e));
}

DEV u32 f32_to_e4m3(float x) {
	u32 u = __float_as_uint(x);
	u32 s = (u >> 24) & 0x80u;
	float a = fabsf(x);
	if (!(a == a)) return 0x7fu;
	if (a >= 448.0f) return s | 0x7eu;
	if (a < 0.015625f) { // below 2^-6: subnormal grid of 2^-9 (8 maps to 0x08, the min normal)
		return s | (u32)rintf(a * 512.0f);
	}
	u32 au = __float_as_uint(a);
	u32 r = au + 0x7ffffu + ((au >> 20) & 1u); // RNE to 3 mantissa bits
	r &= 0xfff00000u;
	u32 e = (r >> 23) - 120u;
	u32 m = (r >> 20) & 7u;
	return s | (e << 3) | m;
}

// The FP8 activation quantisation of one 128-value block a warp holds, as
// quant_fp8_f32 (kernels/ops_f32.cu) does it for blk = 128, bit for bit:
// writes the e4m3 codes of this lane's four values v (columns 4*lane ..
// 4*lane+3 of the block) to q and, from lane 0, the block's e8m0 scale byte
// to *s (a non-finite block: NaN codes, byte 255).
DEV void quant128(const float* v, int lane, u8* __restrict__ q, u8* __restrict__ s)
{
	float amax = 0.0f;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const float a = fabsf(v[i]);
		if (a > amax || a != a) amax = a;
	}
	amax = warp_amax(amax);
	u32 packed = 0x7f7f7f7fu;
	int e = 128; // scale byte 255
	if (amax <= 3.0e38f) {
		e = fp8_scale_exp(amax);
		const float sc = __uint_as_float((u32)(e + 127) << 23);
		packed = 0;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const float y = fminf(fmaxf(__fdiv_rn(v[i], sc), -448.0f), 448.0f);
			packed |= f32_to_e4m3(y) << (8 * i);
		}
	}
	*reinterpret_cast<u32*>(q + 4 * lane) = packed;
	if (lane == 0) *s = (u8)(e + 127);
}

// e8m0 (ue8m0) scale byte -> fp32: 2^(b-127); 0 -> 2^-127; 255 -> NaN.
DEV float e8m0_to_f32(u32 b) {
	b &= 0xffu;
	if (b == 0u) return __uint_as_float(0x00400000u);
	if (b == 255u) return __uint_as_float(0x7fc00000u);
	return __uint_as_float(b << 23);
}
// The same by selects, for loops where a branch per scale would stand
// between two blocks' MMAs (the branchy form keeps moe_fp4_dec_nv's stack small).
DEV float e8m0_to_f32_sel(u32 b) {
	b &= 0xffu;
	return __uint_as_float(b == 0u ? 0x00400000u : b == 255u ? 0x7fc00000u : b << 23);
}

// e4m3 code -> bf16 bits, exact (every e4m3 value is a bf16 value).
DEV u32 e4m3_to_bf16(u32 b) {
	u32 s = (b & 0x80u) << 8;
	u32 em = b & 0x7fu;
	if (em >= 8u) return s | ((em << 4) + (120u << 7));
	return s | (__float_as_uint((float)em * 0.001953125f) >> 16);
}

// Two e4m3 bytes (low byte first) -> bf16x2 (low half = first byte).
DEV u32 e4m3x2_to_bf16x2(u32 v) { return e4m3_to_bf16(v & 0xffu) | (e4m3_to_bf16((v >> 8) & 0xffu) << 16); }

// Two e4m3 bytes -> f16x2 holding value * 2^-8, exact including subnormals:
// the e4m3 exponent/mantissa bits land in the f16 fields one to one.
DEV u32 e4m3x2_to_f16x2_scaled(u32 v) {
	u32 x = (v & 0xffu) | ((v & 0xff00u) << 8);
	return ((x & 0x00800080u) << 8) | ((x & 0x007f007fu) << 7);
}

// e2m1 nibble -> fp32 (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives).
DEV float e2m1_to_f32(u32 q) {
	u32 em = q & 7u;
	float v = em < 2u ? (float)em * 0.5f : __uint_as_float((em << 22) + (126u << 23));
	return (q & 8u) ? -v : v;
}

// Warp-wide reductions.
DEV float warp_sum(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

DEV float warp_max(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// ---- cp.async (sm_80+) ----
// Zeroes an MMA accumulator array (unrolled: the registers stay registers).
template <int I, int J, int K> DEV void zero_acc(float (&a)[I][J][K]) {
#pragma unroll
	for (int i = 0; i < I; i++)
#pragma unroll
		for (int j = 0; j < J; j++)
#pragma unroll
			for (int k = 0; k < K; k++) a[i][j][k] = 0.f;
}

DEV u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16-byte global->shared copy; src_bytes 0 zero-fills the destination.
DEV void cp_async16(void* dst, const void* src, int src_bytes) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
// cp.async of 4 or 8 bytes (scales); src_bytes 0 zero-fills.
template <int B>
DEV void cp_async_ca(void* dst, const void* src, int src_bytes) {
	asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(B), "r"(src_bytes));
}
DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
DEV void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ---- tensor-core MMA (mma.sync, sm_80+) ----
// ldmatrix of four / two 8x8 b16 matrices from shared memory (addr: this
// lane's row address).
DEV void ldsm_x4(u32* d, u32 addr) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		: "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(addr) : "memory");
}
DEV void ldsm_x2(u32* d, u32 addr) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(d[0]), "=r"(d[1]) : "r"(addr) : "memory");
}

// D = A(16x16 bf16, row) * B(16x8 bf16, col) + D, fp32 accumulate.
DEV void mma_bf16_16816(float* d, const u32* a, const u32* b) {
	asm volatile(
		"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Same with f16 operands.
DEV void mma_f16_16816(float* d, const u32* a, const u32* b) {
	asm volatile(
		"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// FP8 mma.sync needs sm_89+ and PTX ISA 8.4 (CUDA 12.4+); older NVRTCs take the f16 path.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && \
	(__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define MM_HAVE_FP8_MMA 1
// D = A(16x32 e4m3, row) * B(32x8 e4m3, col) + D (sm_89+).
DEV void mma_e4m3_16832(float* d, const u32* a, const u32* b) {
	asm volatile(
		"mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// d += A(16x32 e4m3) * B(32x8 e4m3), fp32, any sm_80+: the FP8 MMA where
// there is one, else two f16 k16 MMAs on the exact 2^-8-scaled values (the
// same 4 bytes per register map to logical k {2c, 2c+1} and {8+2c, 9+2c} in
// A and B alike, so the dot product is unchanged).
DEV void mma_k32(float* d, const u32* a, const u32* b) {
#ifdef MM_HAVE_FP8_MMA
	mma_e4m3_16832(d, a, b);
#else
	float t[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
	for (int h = 0; h < 2; h++) {
		u32 wa0 = a[2 * h], wa1 = a[2 * h + 1], wb = b[h];
		u32 af[4] = {e4m3x2_to_f16x2_scaled(wa0 & 0xffffu), e4m3x2_to_f16x2_scaled(wa1 & 0xffffu),
			e4m3x2_to_f16x2_scaled(wa0 >> 16), e4m3x2_to_f16x2_scaled(wa1 >> 16)};
		u32 bf[2] = {e4m3x2_to_f16x2_scaled(wb & 0xffffu), e4m3x2_to_f16x2_scaled(wb >> 16)};
		mma_f16_16816(t, af, bf);
	}
#pragma unroll
	for (int i = 0; i < 4; i++) d[i] = fmaf(t[i], 65536.0f, d[i]);
#endif
}

// ---- weight streaming (decode GEMVs) ----
// Weight-stream loads: every weight is read once, so bypass L1 and let L2
// fetch 256-byte lines. volatile: never speculated past a bounds check.
DEV uint4 ldw16(const u8* p) {
	uint4 r;
	asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
		: "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
	return r;
}
DEV uint2 ldw8(const u8* p) {
	uint2 r;
	asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
	return r;
}
DEV u32 ldw4(const u8* p) {
	u32 r;
	asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];\n" : "=r"(r) : "l"(p));
	return r;
}
// Scale bytes are shared by neighbouring lanes and rows: keep them in L1.
DEV u32 lds1(const u8* p) {
	u32 r;
	asm volatile("ld.global.nc.u8 %0, [%1];\n" : "=r"(r) : "l"(p));
	return r;
}

// Exact decoders of packed weights to fp32 (the values e4m3_to_f32 and
// e2m1_to_f32 give, without branches).
DEV void f16x2_to_f32(u32 h, float& lo, float& hi) {
	asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;}\n" : "=f"(lo), "=f"(hi) : "r"(h));
}
// Four e4m3 bytes (low byte first) -> v[0..4). sm_89+: the hardware e4m3x2
// -> f16x2 conversion (exact: every e4m3 value, subnormals included, is an
// f16 value; 0x7f/0xff give NaN as e4m3_to_f32 does), then f16 -> f32.
DEV void e4m3x4_to_f32(u32 r, float* v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
	u32 h0, h1;
	asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;}\n"
		: "=r"(h0), "=r"(h1) : "r"(r));
	f16x2_to_f32(h0, v[0], v[1]);
	f16x2_to_f32(h1, v[2], v[3]);
#else
#pragma unroll
	for (int i = 0; i < 4; i++) v[i] = e4m3_to_f32((r >> (8 * i)) & 0xffu);
#endif
}
