/* The one common header of the CUDA backend: the engine's internal
 * interface (a C header, given C linkage) and CUDA error checking.
 *
 * Kernel files are C-style CUDA: no exceptions, no new/delete, no
 * function-local statics with dynamic initialisation (their thread-safe
 * guards need libstdc++, which the C-linked library does not pull in). */
#ifndef FA_KERNELS_COMMON_CUH
#define FA_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#ifndef __CUDACC_RTC__ /* NVRTC (attention variants): device code only */
#include <cuda_runtime.h>
#endif

extern "C" {
#include "internal.h"
}

#ifndef __CUDACC_RTC__
/* Records a failed CUDA call on ctx: out of device memory as
 * FA_ERR_OUT_OF_MEMORY, anything else as FA_ERR_BACKEND.  The runtime's
 * last-error slot is cleared, so that a recoverable error is reported once
 * and the engine stays usable (a sticky error, such as an illegal address
 * in a kernel, leaves the device unusable whatever we do). */
static inline fa_status fa_cuda_error(fa_context *ctx, cudaError_t err, const char *what) {
  if (err == cudaSuccess) return FA_OK;
  (void)cudaGetLastError();
  return fa_fail(ctx, err == cudaErrorMemoryAllocation ? FA_ERR_OUT_OF_MEMORY : FA_ERR_BACKEND,
                 "flashattn: CUDA error in %s: %s", what, cudaGetErrorString(err));
}

/* In a function returning fa_status: returns the error of a failed call. */
#define FA_CUDA_CHECK(ctx, call)                                                                             \
  do {                                                                                                       \
    cudaError_t fa_cuda_err_ = (call);                                                                       \
    if (fa_cuda_err_ != cudaSuccess) return fa_cuda_error((ctx), fa_cuda_err_, #call);                       \
  } while (0)

/* The facts of the current device that launches consult, queried once a
 * device and kept (kernels/core/device.cu): the only place kernels ask
 * the runtime for them. */
typedef struct {
  int device;     /* its number (cudaGetDevice) */
  int sms;        /* multiprocessors */
  int l2_bytes;   /* L2 cache */
  int smem_optin; /* shared memory a block may opt in to */
  int cc_major, cc_minor;
  int sm90_code;  /* this build runs sm_90 code on it (not a kernel JIT-compiled from older PTX) */
} fa_cuda_props;
fa_status fa_cuda_device_props(fa_context *ctx, fa_cuda_props *out);
/* The same for callers without a context: 1 on success, else 0 (the
 * runtime's error cleared). */
int fa_cuda_device_props_quiet(fa_cuda_props *out);

/* After a kernel launch <<<...>>>: returns the launch error, if any
 * (bad configuration, too much shared memory, no kernel image). */
#define FA_CUDA_CHECK_LAUNCH(ctx, kernel_name)                                                               \
  do {                                                                                                       \
    cudaError_t fa_cuda_err_ = cudaGetLastError();                                                           \
    if (fa_cuda_err_ != cudaSuccess) return fa_cuda_error((ctx), fa_cuda_err_, "launch of " kernel_name);    \
  } while (0)

#endif

#define FA_LOG2E 1.4426950408889634f
/* 2^x on the SFU (about 2 ulp, results below 2^-126 flushed to 0, -inf -> 0,
 * NaN -> NaN): e^x is exp2_approx(x · FA_LOG2E). */
static __device__ __forceinline__ float exp2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

/* tanh(x) three ways (softcap_step's forms): TANH_LIBM tanhf; TANH_SFU2
 * 1 - 2 / (e^2x + 1) from the SFU's exp2 and reciprocal (within a few 1e-7
 * of tanhf); TANH_SFU1 the same with the reciprocal by three Newton steps
 * from an integer seed (within 5 %) on the FMA pipe, one SFU op: within
 * 3e-7 of tanh absolutely, less relatively near 0.  NaN -> NaN, +-inf ->
 * +-1.  Why SFU1: a forward softcap score took three SFU ops (the
 * softmax's exp2 too) at 16 a clock an SM, more than the tile's products
 * on the tensor cores: the forward's softcap calls ran 1.04-1.16x faster
 * with it (H200, docs/perf/2026-11-30-softcap-tanh-sfu1-h200.json); the
 * backward, not bound by the SFU, ran 0.97x with it and keeps SFU2.  The
 * Lua variants take SFU1 where the tanh's error reaches the score times at
 * most 128 (variant_codegen.c's gains), else tanhf (SFU1 with tanh's
 * series near 0, for relative precision, ran their softcap at 0.90-0.96x). */
enum tanh_form { TANH_LIBM, TANH_SFU2, TANH_SFU1 };
template <tanh_form F> static __device__ __forceinline__ float tanh_as(float x) {
  if (F == TANH_LIBM) return tanhf(x);
  float u = x * (2.f * FA_LOG2E);
  if (F == TANH_SFU2) return 1.f - __fdividef(2.f, exp2_approx(u) + 1.f);
  asm("min.NaN.f32 %0, %0, 0f41D00000;" : "+f"(u)); /* e^2x <= 2^26, where the seed holds; NaN kept */
  const float y = exp2_approx(u) + 1.f;
  float r = __int_as_float(0x7EF311C3 - __float_as_int(y));
#pragma unroll
  for (int i = 0; i < 3; i++) r *= fmaf(-y, r, 2.f);
  return fmaf(-2.f, r, 1.f);
}

/* bf16 to float by its bits (the upper half of the float): the header's
 * conversion made the softmax kernels spill (ptxas, CUDA 13). */
static __device__ __forceinline__ float fa_bf16_to_float(unsigned short bits) { return __uint_as_float((unsigned)bits << 16); }

/* The dtype vocabulary of every kernel (the one): storage type T, its
 * accumulation type acc (float; double for f64), load (T to acc) and store
 * (acc to T, rounding to nearest); pair: two 16-bit elements as one. */
template <typename T> struct Elem {
  typedef float acc;
  static __device__ __forceinline__ float load(T v) { return (float)v; }
  static __device__ __forceinline__ T store(float v) { return (T)v; }
};
template <> struct Elem<__half> {
  typedef float acc;
  typedef __half2 pair;
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};
template <> struct Elem<__nv_bfloat16> {
  typedef float acc;
  typedef __nv_bfloat162 pair;
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return fa_bf16_to_float(__bfloat16_as_ushort(v)); }
  static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <> struct Elem<double> {
  typedef double acc;
  static __device__ __forceinline__ double load(double v) { return v; }
  static __device__ __forceinline__ double store(double v) { return v; }
};
/* The same as functions, for the kernels that compute in float. */
template <typename T> static __device__ __forceinline__ typename Elem<T>::acc to_float(T v) { return Elem<T>::load(v); }
template <typename T> static __device__ __forceinline__ T from_float(typename Elem<T>::acc v) { return Elem<T>::store(v); }

#ifndef __CUDACC_RTC__
/* device.cu: a stream beside the context's.  fork: it waits for what the
 * context's stream has queued; join: the context's stream waits for it. */
extern "C" fa_status fa_cuda_fork(fa_context *ctx, cudaStream_t *side);
extern "C" fa_status fa_cuda_join(fa_context *ctx);

/* memory.cu: fa_cuda_free on the context's stream (a call's temporaries:
 * capturable into a CUDA graph). */
extern "C" void fa_cuda_free_on(fa_context *ctx, void *p, size_t nbytes);

/* The context's stream (NULL ctx or stream: the legacy default stream). */
static inline cudaStream_t fa_cuda_stream(const fa_context *ctx) {
  return ctx ? (cudaStream_t)ctx->stream : (cudaStream_t)0;
}
#endif

#endif
