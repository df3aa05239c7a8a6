/* Device memory: allocations counted in the engine's figures and limit
 * (fa_memory, fa_set_memory_limit), and copies on the context's stream. */
#include "common.cuh"

#define FA_NO_DEVICE_MSG "flashattn: no usable CUDA device"

extern "C" fa_status fa_cuda_malloc(fa_context *ctx, void **p, size_t nbytes) {
  *p = NULL;
  if (!fa_cuda_available()) return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_DEVICE_MSG);
  if (!fa_mem_acquire(FA_CUDA, nbytes)) {
    size_t current = 0;
    fa_memory(FA_CUDA, &current, NULL);
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                   "flashattn: out of memory: %zu bytes requested on cuda (engine holds %zu, limit %zu)", nbytes,
                   current, fa_memory_limit(FA_CUDA));
  }
  /* at least one byte: an empty tensor still gets a distinct, freeable pointer */
  cudaError_t err = cudaMalloc(p, nbytes ? nbytes : 1);
  if (err == cudaSuccess) return FA_OK;
  *p = NULL;
  fa_mem_release(FA_CUDA, nbytes);
  (void)cudaGetLastError();
  if (err == cudaErrorMemoryAllocation) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                   "flashattn: out of memory: the GPU could not give %zu bytes (%zu of %zu bytes free)", nbytes,
                   free_b, total_b);
  }
  return fa_cuda_error(ctx, err, "cudaMalloc");
}

/* cudaFree waits for the device; it fails only when the runtime is
 * already gone (at exit) or after a sticky error: the bytes are no longer
 * ours either way. */
extern "C" void fa_cuda_free(void *p, size_t nbytes) {
  if (!p) return;
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
  fa_mem_release(FA_CUDA, nbytes);
}

/* Ordered on the context's stream; copies that touch host memory are
 * complete on return (the host buffer may be reused or read at once). */
extern "C" fa_status fa_cuda_memcpy(fa_context *ctx, void *dst, const void *src, size_t nbytes, fa_copy_kind kind) {
  if (nbytes == 0) return FA_OK;
  if (!fa_cuda_available()) return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_DEVICE_MSG);
  cudaMemcpyKind k = kind == FA_COPY_H2D   ? cudaMemcpyHostToDevice
                     : kind == FA_COPY_D2H ? cudaMemcpyDeviceToHost
                                           : cudaMemcpyDeviceToDevice;
  cudaStream_t s = fa_cuda_stream(ctx);
  FA_CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, nbytes, k, s));
  if (kind != FA_COPY_D2D) FA_CUDA_CHECK(ctx, cudaStreamSynchronize(s));
  return FA_OK;
}
