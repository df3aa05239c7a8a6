/* CUDA device discovery, facts and synchronisation. */
#include "common.cuh"

#include <pthread.h>
#include <string.h>

static int cuda_usable;
static pthread_once_t cuda_probe_once = PTHREAD_ONCE_INIT;

/* Usable = the runtime loads, a driver answers and there is a device.  On
 * a machine without a GPU or driver this returns an error code (never
 * aborts, never prints), which is cleared so that it does not surface
 * later as someone else's error. */
static void cuda_probe(void) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  cuda_usable = n > 0;
}

extern "C" int fa_cuda_available(void) {
  pthread_once(&cuda_probe_once, cuda_probe);
  return cuda_usable;
}

/* Fills the CUDA fields of out (the caller has zeroed it and set backend). */
extern "C" fa_status fa_cuda_device_info(fa_context *ctx, fa_device_info_t *out) {
  if (!fa_cuda_available()) return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: no usable CUDA device");
  int dev = 0;
  FA_CUDA_CHECK(ctx, cudaGetDevice(&dev));
  cudaDeviceProp prop;
  FA_CUDA_CHECK(ctx, cudaGetDeviceProperties(&prop, dev));
  size_t len = strnlen(prop.name, sizeof out->name - 1); /* prop.name is 256 bytes */
  memcpy(out->name, prop.name, len);
  out->name[len] = 0;
  out->sms = prop.multiProcessorCount;
  out->smem_per_block = prop.sharedMemPerBlockOptin; /* with the opt-in attribute: what a kernel can get */
  out->smem_per_sm = prop.sharedMemPerMultiprocessor;
  out->mem_total = prop.totalGlobalMem;
  out->l2_bytes = (size_t)prop.l2CacheSize;
  out->cc_major = prop.major;
  out->cc_minor = prop.minor;
  return FA_OK;
}

/* ---- the devices' properties (fa_cuda_props), a record a device ---- */

#define PROPS_DEVICES 64
static fa_cuda_props props_of[PROPS_DEVICES];
static int props_ready[PROPS_DEVICES];
static pthread_mutex_t props_lock = PTHREAD_MUTEX_INITIALIZER;

/* compiled for the build's architectures like every kernel: its PTX
 * version says which code the device runs */
__global__ void props_probe_kernel(void) {}

static cudaError_t props_query(int dev, fa_cuda_props *p) {
  cudaFuncAttributes fa;
  cudaError_t e;
  p->device = dev;
  if ((e = cudaDeviceGetAttribute(&p->sms, cudaDevAttrMultiProcessorCount, dev)) ||
      (e = cudaDeviceGetAttribute(&p->l2_bytes, cudaDevAttrL2CacheSize, dev)) ||
      (e = cudaDeviceGetAttribute(&p->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) ||
      (e = cudaDeviceGetAttribute(&p->cc_major, cudaDevAttrComputeCapabilityMajor, dev)) ||
      (e = cudaDeviceGetAttribute(&p->cc_minor, cudaDevAttrComputeCapabilityMinor, dev)) ||
      (e = cudaFuncGetAttributes(&fa, (const void *)props_probe_kernel)))
    return e;
  p->sm90_code = fa.ptxVersion >= 90;
  return cudaSuccess;
}

/* A lookup after the first: cudaGetDevice and a copy (a query of the
 * attributes costs µs, and a decode step is a few µs of work). */
static cudaError_t props_get(fa_cuda_props *out) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const int cached = dev >= 0 && dev < PROPS_DEVICES;
  if (cached && __atomic_load_n(&props_ready[dev], __ATOMIC_ACQUIRE)) {
    *out = props_of[dev];
    return cudaSuccess;
  }
  if ((e = props_query(dev, out)) != cudaSuccess) return e;
  if (cached) {
    pthread_mutex_lock(&props_lock);
    if (!props_ready[dev]) {
      props_of[dev] = *out;
      __atomic_store_n(&props_ready[dev], 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&props_lock);
  }
  return cudaSuccess;
}

fa_status fa_cuda_device_props(fa_context *ctx, fa_cuda_props *out) {
  return fa_cuda_error(ctx, props_get(out), "the device's properties (cudaDeviceGetAttribute)");
}

int fa_cuda_device_props_quiet(fa_cuda_props *out) {
  if (props_get(out) == cudaSuccess) return 1;
  (void)cudaGetLastError();
  return 0;
}

extern "C" fa_status fa_cuda_sync(fa_context *ctx) {
  if (!fa_cuda_available()) return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: no usable CUDA device");
  FA_CUDA_CHECK(ctx, cudaStreamSynchronize(fa_cuda_stream(ctx)));
  return FA_OK;
}

/* ---- the context's timer: two events on its stream ---- */

static fa_status ensure_events(fa_context *ctx) {
  for (int i = 0; i < 2; i++)
    if (!ctx->events[i]) {
      cudaEvent_t e;
      FA_CUDA_CHECK(ctx, cudaEventCreate(&e));
      ctx->events[i] = (void *)e;
    }
  return FA_OK;
}

extern "C" fa_status fa_cuda_timer_start(fa_context *ctx) {
  fa_status st = ensure_events(ctx);
  if (st) return st;
  FA_CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)ctx->events[0], fa_cuda_stream(ctx)));
  /* the query hands the record to the device now: the driver may hold it
   * back until the next submission, and a repetition whose fn queued no
   * device work then timed 0 (a 3 ms host sleep as 0.002 ms, H200).  Not
   * ready is the answer expected, not an error */
  cudaError_t q = cudaEventQuery((cudaEvent_t)ctx->events[0]);
  if (q != cudaSuccess && q != cudaErrorNotReady) FA_CUDA_CHECK(ctx, q);
  return FA_OK;
}

extern "C" fa_status fa_cuda_timer_stop(fa_context *ctx, double *ms) {
  *ms = 0;
  fa_status st = ensure_events(ctx);
  if (st) return st;
  float f = 0;
  FA_CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)ctx->events[1], fa_cuda_stream(ctx)));
  FA_CUDA_CHECK(ctx, cudaEventSynchronize((cudaEvent_t)ctx->events[1]));
  FA_CUDA_CHECK(ctx, cudaEventElapsedTime(&f, (cudaEvent_t)ctx->events[0], (cudaEvent_t)ctx->events[1]));
  *ms = f;
  return FA_OK;
}

/* ---- a side stream: work that may run beside the context's stream ---- */

static void side_release(fa_context *ctx) {
  for (int i = 0; i < 2; i++)
    if (ctx->fork_events[i]) {
      if (cudaEventDestroy((cudaEvent_t)ctx->fork_events[i]) != cudaSuccess) (void)cudaGetLastError();
      ctx->fork_events[i] = NULL;
    }
  if (ctx->side_stream && cudaStreamDestroy((cudaStream_t)ctx->side_stream) != cudaSuccess) (void)cudaGetLastError();
  ctx->side_stream = NULL;
}

/* Returns the side stream (non-blocking, on the current device), after
 * making it wait for the work queued so far on the context's stream. */
extern "C" fa_status fa_cuda_fork(fa_context *ctx, cudaStream_t *side) {
  int dev = 0;
  FA_CUDA_CHECK(ctx, cudaGetDevice(&dev));
  if (ctx->side_stream && ctx->side_device != dev) side_release(ctx);
  if (!ctx->side_stream) {
    cudaStream_t s;
    FA_CUDA_CHECK(ctx, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ctx->side_stream = (void *)s, ctx->side_device = dev;
  }
  for (int i = 0; i < 2; i++)
    if (!ctx->fork_events[i]) {
      cudaEvent_t e;
      FA_CUDA_CHECK(ctx, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      ctx->fork_events[i] = (void *)e;
    }
  *side = (cudaStream_t)ctx->side_stream;
  FA_CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)ctx->fork_events[0], fa_cuda_stream(ctx)));
  FA_CUDA_CHECK(ctx, cudaStreamWaitEvent(*side, (cudaEvent_t)ctx->fork_events[0], 0));
  return FA_OK;
}

/* Makes the context's stream wait for the work queued so far on the side
 * stream (after fa_cuda_fork); if that cannot be queued, waits for it here. */
extern "C" fa_status fa_cuda_join(fa_context *ctx) {
  cudaStream_t side = (cudaStream_t)ctx->side_stream;
  cudaError_t err = cudaEventRecord((cudaEvent_t)ctx->fork_events[1], side);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(fa_cuda_stream(ctx), (cudaEvent_t)ctx->fork_events[1], 0);
  if (err == cudaSuccess) return FA_OK;
  (void)cudaStreamSynchronize(side);
  return fa_cuda_error(ctx, err, "joining the side stream");
}

extern "C" void fa_cuda_cublas_release(fa_context *ctx); /* attention_naive.cu */

extern "C" void fa_cuda_context_release(fa_context *ctx) {
  fa_cuda_cublas_release(ctx);
  side_release(ctx);
  for (int i = 0; i < 2; i++)
    if (ctx->events[i]) {
      if (cudaEventDestroy((cudaEvent_t)ctx->events[i]) != cudaSuccess) (void)cudaGetLastError();
      ctx->events[i] = NULL;
    }
}
