// Blackwell (sm_100a) building blocks of the tcgen05 kernels: tensor memory,
// the block-scaled MMA and its descriptors, mbarriers and TMA tile loads.
// Every tcgen05/TMA instruction is inline asm, so the provisional PTX fixture
// (NVRTC 12.4 for compute_90a with MEGAMOE_SM100_PTX; docs/blackwell.md)
// carries them untouched. SM100A is defined only where they compile; the
// kernels are empty elsewhere and the launchers never pick them there.
#pragma once
#include "sm90.cuh" // TmaMap

#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 1000 && defined(__CUDA_ARCH_FEAT_SM100_ALL)) || \
	(defined(__CUDA_ARCH__) && defined(MEGAMOE_SM100_PTX))
#define SM100A 1
#endif

// The CTA of every sm_100a GEMM: 4 loader warps, 4 epilogue warps (warp w
// reads TMEM lanes 32(w%4)..+31), one MMA warp.
#define TC_LOADERS 128
#define TC_THREADS (TC_LOADERS + 128 + 32)
#define TC_MMA_WARP 8

#ifdef SM100A
DEV void tc_mbar_init(u64* bar, u32 count) {
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
DEV void tc_mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
DEV void tc_mbar_arrive(u64* bar) {
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
DEV void tc_mbar_arrive_tx(u64* bar, u32 bytes) {
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
DEV u32 tc_mbar_try(u64* bar, u32 parity) {
	u32 ok;
	asm volatile(
		"{\n.reg .pred %%tcp;\n"
		"mbarrier.try_wait.parity.shared::cta.b64 %%tcp, [%1], %2;\n"
		"selp.u32 %0, 1, 0, %%tcp;\n}\n"
		: "=r"(ok)
		: "r"(smem_addr(bar)), "r"(parity)
		: "memory");
	return ok;
}
// Wait until the phase of the given parity has completed.
DEV void tc_mbar_wait(u64* bar, u32 parity) {
	while (!tc_mbar_try(bar, parity)) {
	}
}
// Generic-proxy shared-memory writes become visible to the async proxy
// (tcgen05.mma and tcgen05.cp read shared memory through it).
DEV void tc_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// TMA load of the box at element (inner, outer) of map into dst; its bytes
// complete on bar.
DEV void tc_tma_load2d(void* dst, const TmaMap* map, u64* bar, int inner, int outer) {
	asm volatile(
		"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
			smem_addr(dst)),
		"l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)), "r"(inner), "r"(outer)
		: "memory");
}

// Tensor memory: a whole warp allocates ncols columns (a power of two, 32 to
// 512) and the address lands in *dst; the same warp frees them.
DEV void tmem_alloc(u32* dst, u32 ncols) {
	asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n" ::"r"(smem_addr(dst)), "r"(ncols) : "memory");
	asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
}
DEV void tmem_dealloc(u32 taddr, u32 ncols) {
	asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" ::"r"(taddr), "r"(ncols) : "memory");
}
DEV void tc_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory"); }
DEV void tc_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory"); }

// Shared-memory matrix descriptor (tcgen05 layout, CUTLASS SmemDescriptor):
// start >> 4 (bits 0-13), LBO >> 4 (16-29), SBO >> 4 (32-45), the fixed 0b001
// (46-48), swizzle (61-63: 2 = 128-byte). K-major 128-byte swizzle: 8-row
// groups 1024 bytes apart, LBO unused; the tile starts on 1024 bytes.
DEV u64 tc_desc_sw128(const void* p) {
	return (u64)((smem_addr(p) & 0x3FFFFu) >> 4) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 46) | ((u64)2 << 61);
}
// The scale-factor atom for tcgen05.cp.32x128b: no swizzle, 8 rows of 16
// bytes 128 bytes apart (DeepGEMM make_sf_desc).
DEV u64 tc_desc_sf(const void* p) {
	return (u64)((smem_addr(p) & 0x3FFFFu) >> 4) | ((u64)(128 >> 4) << 32) | ((u64)1 << 46);
}

// Instruction descriptor of kind::mxf8f6f4.block_scale (CUTLASS
// InstrDescriptorBlockScaled): A and B e4m3 (type 0), K-major, N >> 3 at bit
// 17, ue8m0 scales (bit 23), M >> 4 at bit 24; the scale-factor ids of A
// (bits 29-30) and B (bits 4-5) pick the byte of the 32-K group.
DEV u32 tc_idesc_mxf8(int M, int N, u32 sf_id) {
	return ((u32)(N >> 3) << 17) | (1u << 23) | ((u32)(M >> 4) << 24) | (sf_id << 29) | (sf_id << 4);
}

// Instruction descriptor of kind::f16 (CUTLASS InstrDescriptor): D fp32
// (bits 4-5 = 1), A and B bf16 (type 1 at bits 7 and 10), K-major.
DEV u32 tc_idesc_bf16(int M, int N) {
	return (1u << 4) | (1u << 7) | (1u << 10) | ((u32)(N >> 3) << 17) | ((u32)(M >> 4) << 24);
}

// D[tmem d] (+)= A B^T over K = 16 bf16 values, A and B from shared memory.
DEV void tc_mma_bf16(u32 d, u64 adesc, u64 bdesc, u32 idesc, u32 accumulate) {
	asm volatile(
		"{\n.reg .pred %%tcacc;\nsetp.ne.b32 %%tcacc, %4, 0;\n"
		"tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, %%tcacc;\n}\n" ::"r"(d),
		"l"(adesc), "l"(bdesc), "r"(idesc), "r"(accumulate)
		: "memory");
}

// D[tmem d] (+)= (A * SFA)(B * SFB)^T over K = 32, A and B from shared memory.
DEV void tc_mma_mxf8(u32 d, u64 adesc, u64 bdesc, u32 idesc, u32 sfa, u32 sfb, u32 accumulate) {
	asm volatile(
		"{\n.reg .pred %%tcacc;\nsetp.ne.b32 %%tcacc, %6, 0;\n"
		"tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale [%0], %1, %2, %3, [%4], [%5], %%tcacc;\n}\n" ::"r"(d),
		"l"(adesc), "l"(bdesc), "r"(idesc), "r"(sfa), "r"(sfb), "r"(accumulate)
		: "memory");
}
// Copy one 512-byte scale-factor atom into 4 TMEM columns of lanes 0-31,
// replicated into the four lane quarters.
DEV void tc_cp_sf(u32 taddr, u64 sdesc) {
	asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;\n" ::"r"(taddr), "l"(sdesc) : "memory");
}
// The barrier's phase completes once every MMA/cp this thread issued has.
DEV void tc_commit(u64* bar) {
	asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Eight consecutive 32-bit columns of this thread's lane.
DEV void tmem_ld8(u32 taddr, float (&v)[8]) {
	u32 r[8];
	asm volatile("tcgen05.ld.sync.aligned.32x32b.x8.b32 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8];\n"
		: "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7])
		: "r"(taddr)
		: "memory");
	asm volatile("tcgen05.wait::ld.sync.aligned;\n" ::: "memory");
#pragma unroll
	for (int i = 0; i < 8; i++) v[i] = __uint_as_float(r[i]);
}
#endif

// Four e2m1 codes (nibbles of x, element i in nibble i) as four e4m3 bytes:
// every e2m1 value is an e4m3 value. A byte permute looks the magnitudes up
// (0, 0.5, 1, 1.5 | 2, 3, 4, 6); the signs move from bit 3 of each nibble to
// bit 7 of each byte.
DEV u32 e2m1x4_to_e4m3(u32 x) {
	const u32 mag = __byte_perm(0x3C383000u, 0x4C484440u, x & 0x7777u);
	const u32 s = x & 0x8888u;
	return mag | ((s & 0x8u) << 4) | ((s & 0x80u) << 8) | ((s & 0x800u) << 12) | ((s & 0x8000u) << 16);
}

// The byte of row r's j-th 32-K scale in a 512-byte scale-factor atom
// (CUTLASS Sm1xxBlockScaledBasicChunk, 128 rows x 4 groups).
DEV int sf_atom_offset(int r) { return (r & 31) * 16 + (r >> 5) * 4; }
