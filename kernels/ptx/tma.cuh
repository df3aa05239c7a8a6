/* Hopper's tensor memory accelerator (TMA) and warp specialisation, for the
 * warp-specialised attention kernel (attention_wgmma_tma.cu): bulk tensor
 * copies global -> shared described by a tensor map and completing on an
 * mbarrier (async_copy.cuh: mbar_init, mbar_expect, mbar_wait), bulk
 * tensor copies shared -> global (an output's tile), plain
 * arrivals on an mbarrier (a consumer releasing a buffer), and setmaxnreg
 * (a producer warpgroup hands its registers to the consumers). */
#ifndef FA_KERNELS_TMA_CUH
#define FA_KERNELS_TMA_CUH

#include "async_copy.cuh"

#if defined(__CUDACC_RTC__) /* no driver header in a run-time compiled unit: the map's layout (cuda.h's CUtensorMap) */
struct CUtensorMap {
  alignas(64) unsigned long long opaque[16];
};
#else
#include <cuda.h>
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* The box of map at coordinates {c0, c1, c2, c3} (innermost first) into
 * shared memory at dst, its bytes counted on bar. */
static __device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, int c0, int c1, int c2, int c3,
                                                   uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
               "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
               : "memory");
}
/* A tile of ROWS rows by D columns of a 4-D operand's map (boxes of 64
 * columns by ROWS rows, 128-byte swizzle: load_tile's layout for wgmma) at
 * rows [row, row + ROWS) of head h, batch b into dst, one box a 64-column
 * block, ROWS·128 bytes apart; its ROWS·D·2 bytes counted on bar (the
 * caller expects them).  Columns past the operand's come in as zeros. */
template <int D, int ROWS>
static __device__ __forceinline__ void tma_load_tile(uint32_t dst, const void *map, int row, int h, int b,
                                                     uint32_t bar) {
#pragma unroll
  for (int c = 0; c < D / 64; c++) tma_load_4d(dst + c * ROWS * 128, map, c * 64, row, h, b, bar);
}
/* The box of map at {c0, c1, c2, c3} written from shared memory at src
 * (the load's layout), a bulk copy of the issuing thread's bulk group; rows
 * and columns past the map's bounds are not written.  The writes to src
 * that it reads must be made visible to the copy engine first
 * (tma_store_fence by each writing thread, then their barrier). */
static __device__ __forceinline__ void tma_store_4d(const void *map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"((uint64_t)map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
static __device__ __forceinline__ void tma_store_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
static __device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/* This thread's committed stores have read their shared memory (READ), or
 * are done. */
template <bool READ> static __device__ __forceinline__ void tma_store_wait() {
  if (READ) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  else asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
/* One arrival on bar (its pending count down by one). */
static __device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Makes the mbarriers' initialisation visible to the copy engine. */
static __device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
/* The tensor map's descriptor fetched ahead of the first copy. */
static __device__ __forceinline__ void tma_prefetch_map(const void *map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)map) : "memory");
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* This warpgroup's registers per thread, lowered (a producer) or raised (a
 * consumer); each warpgroup's role is one branch of the kernel. */
template <int N> static __device__ __forceinline__ void warpgroup_regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> static __device__ __forceinline__ void warpgroup_regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
#endif

#endif
