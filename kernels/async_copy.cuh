/* Asynchronous 16-byte copies from global to shared memory (cp.async),
 * for the attention tile loaders and the softmax's shared-memory stash. */
#ifndef FA_KERNELS_ASYNC_COPY_CUH
#define FA_KERNELS_ASYNC_COPY_CUH

#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared; src_bytes = 0 fills zeros (rows past the end). */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#endif
