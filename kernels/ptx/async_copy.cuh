/* Asynchronous copies: 16 bytes from global to shared memory (cp.async),
 * for the attention tile loaders and the softmax's shared-memory stash;
 * and, on Hopper, 8 bytes into another block's shared memory in the
 * cluster (st.async) counted on that block's mbarrier, for the softmax's
 * cluster rows. */
#ifndef FA_KERNELS_ASYNC_COPY_CUH
#define FA_KERNELS_ASYNC_COPY_CUH

#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared; src_bytes = 0 fills zeros (rows past the end). */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
/* 4 bytes global -> shared (cp.async.ca: the sizes below 16), src_bytes
 * = 0 fills zeros: the decode kernel's page-table entries, fetched ahead
 * with the tiles. */
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
/* An L2 policy for data read once (a decode step's K and V): its lines
 * are the first evicted, so that streaming them replaces each other
 * rather than what else L2 holds (dirty lines among it would be written
 * back first, at the stream's expense). */
static __device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
/* cp_async16 under an L2 policy (l2_evict_first_policy, ...). */
static __device__ __forceinline__ void cp_async16_policy(void *dst, const void *src, int src_bytes, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes), "l"(policy));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* The address of this block's shared variable at addr in block rank's. */
static __device__ __forceinline__ uint32_t cluster_map(uint32_t addr, unsigned rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
static __device__ __forceinline__ void mbar_init(uint32_t bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}
/* This phase of bar completes when bytes more have been stored into the block (and its one arrival). */
static __device__ __forceinline__ void mbar_expect(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
/* Waits until the phase of bar with this parity has completed; what was
 * stored into the block before it (copies counted on bar, the arriving
 * threads' stores) is then visible.  mbar_wait acquires at the block's
 * scope: at the cluster's, ptxas invalidated L1 after every wait
 * (CCTL.IVALL: 4.8 % of the stall samples of the D = 128 forward at
 * L = 1024, H200 ncu, 2026-11-28), which only stores from other blocks of
 * a cluster need (st_async: mbar_wait_cluster). */
#define FA_MBAR_WAIT_LOOP(SCOPE)                                                                                   \
  asm volatile("{\n"                                                                                               \
               ".reg .pred done;\n"                                                                                \
               "wait_%=:\n"                                                                                        \
               "mbarrier.try_wait.parity.acquire." SCOPE ".shared::cta.b64 done, [%0], %1;\n"                      \
               "@!done bra wait_%=;\n"                                                                             \
               "}" ::"r"(bar),                                                                                     \
               "r"(parity)                                                                                         \
               : "memory")
static __device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity) { FA_MBAR_WAIT_LOOP("cta"); }
static __device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, unsigned parity) { FA_MBAR_WAIT_LOOP("cluster"); }
#undef FA_MBAR_WAIT_LOOP
/* Stores {a, b} at remote (a cluster address) and counts 8 bytes on the remote mbarrier rbar. */
static __device__ __forceinline__ void st_async_f2(uint32_t remote, float a, float b, uint32_t rbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(remote), "f"(a),
               "f"(b), "r"(rbar)
               : "memory");
}
#endif

#endif
