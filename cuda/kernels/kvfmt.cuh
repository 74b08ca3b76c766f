// Compact KV cache formats (kvcache/format.go, layouts in kvcache/doc.go):
// warp encoders bit for bit the Go codec's Encode, and exact decoders.
//
// Entry (nope + rope values): nope e4m3 codes, then rope bf16, then one e8m0
// scale per 64 nope values, zero padding to the entry's byte size. Index key
// (dim values): e2m1 codes two per byte (element 2i low nibble), then one e8m0
// scale per 32, zero padding. A block with a NaN or an infinity has scale
// byte 0xFF and zero codes (it decodes to NaN).
#pragma once
#include "common.cuh"

#define KV_FLT_MAX 3.4028234663852886e38f

// ceil(log2 x) by the bits, as num.CeilLog2 (x positive normal here).
DEV int ceil_log2_bits(float x) {
	const u32 u = __float_as_uint(x);
	int e = (int)((u >> 23) & 0xff) - 127;
	if ((u & 0x7fffff) != 0) e++;
	return e;
}

// e2m1 code of x (|x| <= 6 after scaling): num.F32ToE2M1, ties to the even code.
DEV u32 f32_to_e2m1(float x) {
	if (x != x) return 0u;
	const u32 sign = (__float_as_uint(x) >> 28) & 8u;
	const float f = fabsf(x);
	u32 c;
	if (f <= 0.25f) c = 0;
	else if (f < 0.75f) c = 1;
	else if (f <= 1.25f) c = 2;
	else if (f < 1.75f) c = 3;
	else if (f <= 2.5f) c = 4;
	else if (f < 3.5f) c = 5;
	else if (f <= 5.0f) c = 6;
	else c = 7;
	return sign | c;
}

// One warp stores entry x (nope + rope fp32 values, any memory) into dst
// (bytes bytes). Every lane of the warp calls it.
DEV void enc_entry_warp(u8* __restrict__ dst, const float* x, int nope, int rope, int bytes, int lane) {
	const int soff = nope + 2 * rope;
	for (int b0 = 0; b0 < nope; b0 += 64) {
		const int n = min(64, nope - b0);
		const float v0 = lane < n ? x[b0 + lane] : 0.0f, v1 = lane + 32 < n ? x[b0 + lane + 32] : 0.0f;
		const bool bad = __any_sync(0xffffffffu, !(fabsf(v0) <= KV_FLT_MAX) || !(fabsf(v1) <= KV_FLT_MAX));
		u32 c0 = 0, c1 = 0, sb = 0xffu;
		if (!bad) {
			const float am = warp_max(fmaxf(fabsf(v0), fabsf(v1)));
			const int e = ceil_log2_bits(fmaxf(am, 1e-4f) * (1.0f / 448.0f));
			const float s = __uint_as_float((u32)(e + 127) << 23);
			c0 = f32_to_e4m3(__fdiv_rn(v0, s));
			c1 = f32_to_e4m3(__fdiv_rn(v1, s));
			sb = (u32)(e + 127);
		}
		if (lane < n) dst[b0 + lane] = (u8)c0;
		if (lane + 32 < n) dst[b0 + lane + 32] = (u8)c1;
		if (lane == 0) dst[soff + b0 / 64] = (u8)sb;
	}
	u16* r = reinterpret_cast<u16*>(dst + nope);
	for (int i = lane; i < rope; i += 32) r[i] = (u16)f32_to_bf16(x[nope + i]);
	for (int i = soff + (nope + 63) / 64 + lane; i < bytes; i += 32) dst[i] = 0;
}

// One warp stores index key x (dim fp32 values) into dst (bytes bytes).
DEV void enc_index_warp(u8* __restrict__ dst, const float* x, int dim, int bytes, int lane) {
	const int soff = (dim + 1) / 2;
	for (int b0 = 0; b0 < dim; b0 += 32) {
		const int i = b0 + lane;
		const float v = i < dim ? x[i] : 0.0f;
		const bool bad = __any_sync(0xffffffffu, !(fabsf(v) <= KV_FLT_MAX));
		u32 c = 0, sb = 0xffu;
		if (!bad) {
			const float am = warp_max(fabsf(v));
			const int e = ceil_log2_bits(fmaxf(am, 6.0f * 1.1754943508222875e-38f) * (1.0f / 6.0f));
			c = f32_to_e2m1(__fdiv_rn(v, __uint_as_float((u32)(e + 127) << 23)));
			sb = (u32)(e + 127);
		}
		const u32 hi = __shfl_down_sync(0xffffffffu, c, 1);
		if ((lane & 1) == 0 && i < dim) dst[i / 2] = (u8)(c | (i + 1 < dim ? hi << 4 : 0u));
		if (lane == 0) dst[soff + b0 / 32] = (u8)sb;
	}
	for (int i = soff + (dim + 31) / 32 + lane; i < bytes; i += 32) dst[i] = 0;
}

// Values [d, d+4) of an entry (d % 4 == 0, nope % 4 == 0; soff = nope + 2·rope):
// e4m3 code times its block's scale, or bf16 — exactly the values Encode kept.
DEV float4 ld_entry4(const u8* __restrict__ e, int d, int nope, int soff) {
	if (d < nope) {
		float v[4];
		e4m3x4_to_f32(*reinterpret_cast<const u32*>(e + d), v);
		const float s = e8m0_to_f32(e[soff + (d >> 6)]);
		return make_float4(v[0] * s, v[1] * s, v[2] * s, v[3] * s);
	}
	const u32* r = reinterpret_cast<const u32*>(e + nope + 2 * (d - nope));
	const u32 a = r[0], b = r[1];
	return make_float4(bf16_to_f32(a), bf16_to_f32(a >> 16), bf16_to_f32(b), bf16_to_f32(b >> 16));
}

// Values [8w, 8w+8) of an index key (dim % 8 == 0): one code word, one scale.
DEV void ld_index8(const u8* __restrict__ k, int w, int dim, float4& lo, float4& hi) {
	const u32 c = *reinterpret_cast<const u32*>(k + 4 * w);
	const float s = e8m0_to_f32(k[dim / 2 + (w >> 2)]);
	float v[8];
#pragma unroll
	for (int i = 0; i < 8; i++) v[i] = e2m1_to_f32((c >> (4 * i)) & 15u) * s;
	lo = make_float4(v[0], v[1], v[2], v[3]);
	hi = make_float4(v[4], v[5], v[6], v[7]);
}
