// Hopper (sm_90a) building blocks shared by the wgmma kernels: tensor maps,
// mbarriers, TMA tile loads, shared-memory matrix descriptors and the wgmma
// group controls. SM90A is defined only where they compile (sm_90a); the
// kernels are empty elsewhere and the launchers never pick them there.
#pragma once
#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SM90A 1
#endif

// An encoded CUtensorMap, passed by value as a __grid_constant__ parameter.
struct __align__(64) TmaMap { u64 w[16]; };

#ifdef SM90A
DEV void mbar_init(u64* bar, u32 count) {
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
// Arrive and add transaction bytes the phase also waits for.
DEV void mbar_arrive_expect_tx(u64* bar, u32 bytes) {
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Add transaction bytes without arriving.
DEV void mbar_expect_tx(u64* bar, u32 bytes) {
	asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
DEV void mbar_arrive(u64* bar) {
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Wait until the phase of the given parity has completed.
DEV void mbar_wait(u64* bar, u32 parity) {
	asm volatile(
		"{\n.reg .pred P1;\nLAB_WAIT:\n"
		"mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
		"@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(smem_addr(bar)),
		"r"(parity)
		: "memory");
}
DEV void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// TMA load of the box at element (inner, outer) of map into dst, completing
// its bytes on bar.
DEV void tma_load2d(void* dst, const TmaMap* map, u64* bar, int inner, int outer) {
	asm volatile(
		"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
			smem_addr(dst)),
		"l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)), "r"(inner), "r"(outer)
		: "memory");
}

// TMA load of the rank-3 box at element (x, y, z) of map into dst (the box
// lands densely, innermost dimension first, swizzled by address bits as in 2D).
DEV void tma_load3d(void* dst, const TmaMap* map, u64* bar, int x, int y, int z) {
	asm volatile(
		"cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
			smem_addr(dst)),
		"l"(reinterpret_cast<u64>(map)), "r"(smem_addr(bar)), "r"(x), "r"(y), "r"(z)
		: "memory");
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row core
// groups 1024 bytes apart (what TMA's SWIZZLE_128B writes for 128-byte rows;
// the tile must start on 1024 bytes).
DEV u64 desc_sw128(const void* p) {
	return (u64)((smem_addr(p) & 0x3FFFFu) >> 4) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

DEV void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DEV void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
DEV void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Pins accumulators in place around the asynchronous MMAs (ptxas must not
// move their reads or writes across the fence/wait).
template <int R>
DEV void wg_pin(float (&d)[R]) {
#pragma unroll
	for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}
#endif
