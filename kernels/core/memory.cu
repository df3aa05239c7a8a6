/* Device memory: allocations counted in the engine's figures and limit
 * (fa_memory, fa_set_memory_limit), and copies on the context's stream. */
#include "block_keep.h"
#include "common.cuh"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FA_NO_DEVICE_MSG "flashattn: no usable CUDA device"

/* The caching allocator: the device's default stream-ordered memory pool
 * with its release threshold raised, so that freed blocks stay with the
 * pool and a sweep does not pay cudaMalloc per call.  Blocks are taken on
 * the context's stream and given back on the legacy default stream, which
 * waits for the work of every blocking stream: a block is reused only
 * after everything queued before its release. */
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static int pool_ok;

/* In front of the pool, a few small blocks kept by the engine itself:
 * cudaMallocAsync and cudaFreeAsync cost 1.7 and 2.0 µs of host time, a
 * third of a tiny decode call (B = 1, 256 keys: 12 µs a call, H200,
 * sampled).  A block of a call on the legacy stream (never a CUDA graph's:
 * a captured stream is another), given back, is taken again, for
 * the same byte count (exact sizes: compute-sanitizer's memcheck still sees
 * each overrun), only by a call on the legacy stream, which comes after
 * everything queued before the block's release, as the pool's own reuse
 * does.  Kept only where the process sees one device (a block then needs
 * no device of its own) and FLASHATTN_NO_CUDA_CACHE is unset (for
 * compute-sanitizer: a reused block is neither freed nor uninitialised). */
#define SMALL_MAX_BYTES ((size_t)1 << 20)
#define SMALL_DEPTH 256 /* blocks a byte count (of FA_KEEP_CLASSES): the collector frees a loop's outputs by the hundred */
#define SMALL_TOTAL_BYTES ((size_t)32 << 20)
static fa_block_keep small = FA_BLOCK_KEEP_INIT(SMALL_DEPTH, SMALL_TOTAL_BYTES); /* src/block_keep.h */
static int small_on;

static void pool_setup(void) {
  int dev = 0, supported = 0, devices = 0;
  cudaMemPool_t pool;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev) == cudaSuccess && supported &&
      cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    pool_ok = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess;
  }
  const char *off = getenv("FLASHATTN_NO_CUDA_CACHE");
  small_on = pool_ok && cudaGetDeviceCount(&devices) == cudaSuccess && devices == 1 && !(off && *off && *off != '0');
  (void)cudaGetLastError();
}

static int legacy_stream(cudaStream_t s) { return s == (cudaStream_t)0 || s == cudaStreamLegacy; }

/* A kept block given back to the pool (out of device memory). */
static void small_release(void *p) {
  if (cudaFreeAsync(p, cudaStreamLegacy) != cudaSuccess) (void)cudaGetLastError();
}

static cudaError_t device_alloc(void **p, size_t n, cudaStream_t s) {
  if (pool_ok) return cudaMallocAsync(p, n, s);
  return cudaMalloc(p, n);
}

/* Out of memory with blocks cached: hand the cache back and try again. */
static cudaError_t device_alloc_retrying(void **p, size_t n, cudaStream_t s) {
  cudaError_t err = device_alloc(p, n, s);
  if (err != cudaErrorMemoryAllocation || !pool_ok) return err;
  (void)cudaGetLastError();
  if (small_on) fa_block_keep_drain(&small, small_release);
  int dev = 0;
  cudaMemPool_t pool;
  if (cudaDeviceSynchronize() == cudaSuccess && cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess)
    (void)cudaMemPoolTrimTo(pool, 0);
  (void)cudaGetLastError();
  return device_alloc(p, n, s);
}

extern "C" fa_status fa_cuda_malloc(fa_context *ctx, void **p, size_t nbytes) {
  *p = NULL;
  if (!fa_cuda_available()) return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_DEVICE_MSG);
  pthread_once(&pool_once, pool_setup);
  if (!fa_mem_acquire(FA_CUDA, nbytes)) {
    size_t current = 0;
    fa_memory(FA_CUDA, &current, NULL);
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                   "flashattn: out of memory: %zu bytes requested on cuda (engine holds %zu, limit %zu)", nbytes,
                   current, fa_memory_limit(FA_CUDA));
  }
  /* at least one byte: an empty tensor still gets a distinct, freeable pointer */
  const size_t n = nbytes ? nbytes : 1;
  if (small_on && n <= SMALL_MAX_BYTES && legacy_stream(fa_cuda_stream(ctx)) && (*p = fa_block_keep_take(&small, n)))
    return FA_OK;
  cudaError_t err = device_alloc_retrying(p, n, fa_cuda_stream(ctx));
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

/* Back to the pool (see above); fails only when the runtime is already
 * gone (at exit) or after a sticky error: the bytes are no longer ours
 * either way. */
extern "C" void fa_cuda_free(void *p, size_t nbytes) {
  if (!p) return;
  cudaError_t err = pool_ok ? cudaFreeAsync(p, cudaStreamLegacy) : cudaFree(p);
  if (err != cudaSuccess) (void)cudaGetLastError();
  fa_mem_release(FA_CUDA, nbytes);
}

extern "C" int fa_cuda_legacy_stream(const fa_context *ctx) { return legacy_stream(fa_cuda_stream(ctx)); }

/* Kept by the engine where it can (a block of a legacy-stream call: never
 * a graph's), else as fa_cuda_free. */
extern "C" void fa_cuda_free_reusable(void *p, size_t nbytes) {
  if (!p) return;
  const size_t n = nbytes ? nbytes : 1;
  if (!(small_on && n <= SMALL_MAX_BYTES && fa_block_keep_put(&small, p, n, SIZE_MAX))) return fa_cuda_free(p, nbytes);
  fa_mem_release(FA_CUDA, nbytes);
}

/* The same, ordered on the context's stream instead of the legacy one:
 * for a call's own temporaries, so that a host may capture the call into
 * a CUDA graph (an operation on the legacy stream ends a capture). */
extern "C" void fa_cuda_free_on(fa_context *ctx, void *p, size_t nbytes) {
  if (!p) return;
  if (legacy_stream(fa_cuda_stream(ctx))) return fa_cuda_free_reusable(p, nbytes); /* allocated in this call */
  cudaError_t err = pool_ok ? cudaFreeAsync(p, fa_cuda_stream(ctx)) : cudaFree(p);
  if (err != cudaSuccess) (void)cudaGetLastError();
  fa_mem_release(FA_CUDA, nbytes);
}

/* Ordered on the context's stream; copies that touch host memory are
 * complete on return (the host buffer may be reused or read at once),
 * but those from pinned memory (FA_COPY_H2D_PINNED), which do not wait. */
extern "C" fa_status fa_cuda_memcpy(fa_context *ctx, void *dst, const void *src, size_t nbytes, fa_copy_kind kind) {
  if (nbytes == 0) return FA_OK;
  if (!fa_cuda_available()) return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_DEVICE_MSG);
  cudaMemcpyKind k = kind == FA_COPY_H2D || kind == FA_COPY_H2D_PINNED ? cudaMemcpyHostToDevice
                     : kind == FA_COPY_D2H                            ? cudaMemcpyDeviceToHost
                                                                      : cudaMemcpyDeviceToDevice;
  cudaStream_t s = fa_cuda_stream(ctx);
  FA_CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, nbytes, k, s));
  if (kind == FA_COPY_H2D || kind == FA_COPY_D2H) FA_CUDA_CHECK(ctx, cudaStreamSynchronize(s));
  return FA_OK;
}

/* A call's small host arrays (alibi's slopes, kv_lens: a few KB) onto the
 * device without waiting: each chunk rides in a kernel's parameters, which
 * the launch copies, so the host neither waits for the stream (an H2D
 * copy from pageable memory has to, before the host may reuse its buffer:
 * fa_cuda_memcpy) nor keeps a staging buffer alive, and a graph capture
 * keeps the values.  Waiting there cost a call behind a busy stream its
 * overlap with the device: the host's preparation after the wait ran with
 * the GPU idle.  Behind a 256 MiB flush an alibi call spent 230-260 us on
 * the host against 40-100 for the plain one, and without the wait it runs
 * 1.02-1.12 x as fast at 1k-4k keys (H200, in turns,
 * docs/perf/2026-12-03-upload-async-h200.json). */
#define UPLOAD_CHUNK 4032 /* with the count, under the 4 KB of kernel parameters any build may launch with */
struct upload_chunk {
  unsigned n;
  unsigned char bytes[UPLOAD_CHUNK];
};
static __global__ void upload_chunk_kernel(unsigned char *dst, const upload_chunk c) {
  for (unsigned i = threadIdx.x; i < c.n; i += blockDim.x) dst[i] = c.bytes[i];
}

extern "C" fa_status fa_cuda_upload(fa_context *ctx, void *dst, const void *src, size_t nbytes) {
  if (nbytes == 0) return FA_OK;
  if (!fa_cuda_available()) return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_DEVICE_MSG);
  cudaStream_t s = fa_cuda_stream(ctx);
  upload_chunk c;
  for (size_t at = 0; at < nbytes; at += UPLOAD_CHUNK) {
    c.n = (unsigned)(nbytes - at < UPLOAD_CHUNK ? nbytes - at : UPLOAD_CHUNK);
    memcpy(c.bytes, (const unsigned char *)src + at, c.n);
    upload_chunk_kernel<<<1, 256, 0, s>>>((unsigned char *)dst + at, c);
    FA_CUDA_CHECK_LAUNCH(ctx, "upload_chunk_kernel");
  }
  return FA_OK;
}

/* Pinned host memory (counted as host memory in the engine's figures): the
 * source of copies that must not wait for the device (FA_COPY_H2D_PINNED). */
extern "C" fa_status fa_cuda_host_alloc(fa_context *ctx, void **p, size_t nbytes) {
  *p = NULL;
  if (!fa_cuda_available()) return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_DEVICE_MSG);
  if (!fa_mem_acquire(FA_CPU, nbytes))
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: out of memory: %zu bytes of pinned host memory requested",
                   nbytes);
  cudaError_t err = cudaMallocHost(p, nbytes ? nbytes : 1);
  if (err == cudaSuccess) return FA_OK;
  *p = NULL;
  fa_mem_release(FA_CPU, nbytes);
  return fa_cuda_error(ctx, err, "cudaMallocHost");
}

extern "C" void fa_cuda_host_free(void *p, size_t nbytes) {
  if (!p) return;
  if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
  fa_mem_release(FA_CPU, nbytes);
}

/* Events for that: made without timing, recorded on the context's stream,
 * waited for by the host (an event never recorded is complete). */
extern "C" fa_status fa_cuda_event_new(fa_context *ctx, void **ev) {
  cudaEvent_t e = NULL;
  FA_CUDA_CHECK(ctx, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  *ev = e;
  return FA_OK;
}
extern "C" void fa_cuda_event_free(void *ev) {
  if (ev && cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess) (void)cudaGetLastError();
}
extern "C" fa_status fa_cuda_event_record(fa_context *ctx, void *ev) {
  FA_CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)ev, fa_cuda_stream(ctx)));
  return FA_OK;
}
extern "C" fa_status fa_cuda_event_wait(fa_context *ctx, void *ev) {
  FA_CUDA_CHECK(ctx, cudaEventSynchronize((cudaEvent_t)ev));
  return FA_OK;
}
