/* "naive" attention on the GPU, the unfused method users would otherwise
 * write: S = Q·Kᵀ through cuBLAS (batched over batch × head, f32 scores),
 * a row kernel that applies the score rule and the softmax and writes P in
 * the inputs' dtype, then O = P·V through cuBLAS.  S and P are materialised
 * in device memory.
 * The softmax kernel is meant to run at memory bandwidth: the score rule
 * per element is only the key range and the scale unless the call has
 * masks, alibi or softcap (EXTRAS), S is read as float4 when Lk % 4 == 0,
 * exponentials are ex2.approx (one per element and pass), and rows past
 * NAIVE_LONG_ROW keys take a block each, with a grid sized so that the
 * rows in flight fit in L2 and the second pass over S reads it from there. */
#include "attention_naive.cuh"
#include "attention_nonfinite.cuh"
#include "attention_registry.h"

#include <cublas_v2.h>

static fa_status cublas_error(fa_context *ctx, cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return FA_OK;
  return fa_fail(ctx, s == CUBLAS_STATUS_ALLOC_FAILED ? FA_ERR_OUT_OF_MEMORY : FA_ERR_BACKEND,
                 "flashattn: cuBLAS error in %s: %s", what, cublasGetStatusString(s));
}

/* The context's cuBLAS handle, made on first use, bound to its stream. */
static fa_status handle_of(fa_context *ctx, cublasHandle_t *h) {
  if (!ctx->cublas) {
    cublasHandle_t made;
    fa_status st = cublas_error(ctx, cublasCreate(&made), "cublasCreate");
    if (st) return st;
    ctx->cublas = (void *)made;
  }
  *h = (cublasHandle_t)ctx->cublas;
  return cublas_error(ctx, cublasSetStream(*h, fa_cuda_stream(ctx)), "cublasSetStream");
}

extern "C" fa_status fa_cuda_cublas_handle(fa_context *ctx, void **handle) {
  cublasHandle_t h = NULL;
  fa_status st = handle_of(ctx, &h);
  *handle = (void *)h;
  return st;
}

extern "C" void fa_cuda_cublas_release(fa_context *ctx) {
  if (ctx->cublas) cublasDestroy((cublasHandle_t)ctx->cublas);
  ctx->cublas = NULL;
}

template <typename T, bool EXTRAS, int WPR>
static fa_status launch_softmax_as(fa_context *ctx, const fa_attn_problem *p, const float *S, T *P, int64_t rows) {
  int64_t grid = 0;
  if (fa_status st = naive_softmax_grid(ctx, p, WPR, rows, &grid)) return st;
  if (grid <= 0) return FA_OK;
  naive_softmax_kernel<T, EXTRAS, WPR><<<(unsigned)grid, NAIVE_THREADS, 0, fa_cuda_stream(ctx)>>>(*p, S, P, rows);
  FA_CUDA_CHECK_LAUNCH(ctx, "naive_softmax_kernel");
  return FA_OK;
}

template <typename T>
static fa_status launch_softmax(fa_context *ctx, const fa_attn_problem *p, const float *S, T *P, int64_t rows) {
  const bool extras = attn_has_extras(p), block_rows = naive_softmax_wpr(p) > 1;
  if (extras)
    return block_rows ? launch_softmax_as<T, true, NAIVE_THREADS / 32>(ctx, p, S, P, rows)
                      : launch_softmax_as<T, true, 1>(ctx, p, S, P, rows);
  return block_rows ? launch_softmax_as<T, false, NAIVE_THREADS / 32>(ctx, p, S, P, rows)
                    : launch_softmax_as<T, false, 1>(ctx, p, S, P, rows);
}

static __device__ __forceinline__ bool is_masked(float w) { return __float_as_uint(w) == 0x80000000u; }
static __device__ __forceinline__ bool is_masked(__half w) { return __half_as_ushort(w) == 0x8000u; }
static __device__ __forceinline__ bool is_masked(__nv_bfloat16 w) { return __bfloat16_as_ushort(w) == 0x8000u; }

/* O = P·V skipping masked keys, for values holding NaN or inf (where
 * 0·NaN in a matrix product would reach rows that mask the key): queued
 * behind the cuBLAS product, it overwrites O only when *flag says so, so
 * that the common case waits for nothing (a small grid that returns). */
template <typename T> __global__ void naive_pv_skipping_kernel(fa_attn_problem p, const T *P, const int *flag) {
  if (!*flag) return;
  for (int64_t row = blockIdx.x; row < p.B * p.Hq * p.Lq; row += gridDim.x) {
    const int64_t bh = row / p.Lq, b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
    const T *prow = P + row * p.Lk, *v = (const T *)p.v + attn_at(p.v_st, b, hk, 0);
    T *orow = (T *)p.o + attn_at(p.o_st, b, h, row % p.Lq);
    for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) {
      float acc = 0.f;
      for (int64_t j = 0; j < p.Lk; j++)
        if (!is_masked(prow[j])) acc = fmaf(to_float(prow[j]), to_float(v[j * p.v_st.s + c]), acc);
      orow[c] = from_float<T>(acc);
    }
  }
}

template <typename T> static cudaDataType_t cuda_type();
template <> cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }
template <> cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

template <typename T>
static fa_status naive_typed(fa_context *ctx, const fa_attn_problem *p, naive_softmax_launch launch, void *user) {
  const int64_t BH = p->B * p->Hq, n_s = BH * p->Lq * p->Lk;
  if (p->Lq > INT32_MAX || p->Lk > INT32_MAX || BH > INT32_MAX || p->q_st.s > INT32_MAX || p->k_st.s > INT32_MAX ||
      p->v_st.s > INT32_MAX || p->o_st.s > INT32_MAX)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: naive attention on cuda: sizes above cuBLAS's int range");
  cublasHandle_t handle;
  fa_status st = handle_of(ctx, &handle);
  if (st) return st;
  size_t s_bytes = sizeof(float) * (size_t)n_s, p_bytes = sizeof(T) * (size_t)n_s, ptr_bytes = sizeof(void *) * 6 * BH;
  void *S = NULL, *P = NULL, *ptrs = NULL;
  const void **host = (const void **)malloc(ptr_bytes);
  if (!host) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: out of host memory");
  if ((st = fa_cuda_malloc(ctx, &S, s_bytes)) || (st = fa_cuda_malloc(ctx, &P, p_bytes)) ||
      (st = fa_cuda_malloc(ctx, &ptrs, ptr_bytes)))
    goto done;
  for (int64_t bh = 0; bh < BH; bh++) { /* per (batch, head): K, Q, S, V, P, O; GQA shares K and V */
    const int64_t b = bh / p->Hq, h = bh % p->Hq, hk = h / (p->Hq / p->Hkv);
    host[bh] = (const T *)p->k + attn_at(p->k_st, b, hk, 0);
    host[BH + bh] = (const T *)p->q + attn_at(p->q_st, b, h, 0);
    host[2 * BH + bh] = (float *)S + bh * p->Lq * p->Lk;
    host[3 * BH + bh] = (const T *)p->v + attn_at(p->v_st, b, hk, 0);
    host[4 * BH + bh] = (T *)P + bh * p->Lq * p->Lk;
    host[5 * BH + bh] = (T *)p->o + attn_at(p->o_st, b, h, 0);
  }
  if ((st = fa_cuda_memcpy(ctx, ptrs, host, ptr_bytes, FA_COPY_H2D))) goto done;
  {
    const void **d = (const void **)ptrs;
    const float one = 1.f, zero = 0.f;
    /* row-major S (Lq×Lk) is column-major Sᵀ = Kᵀ·Q: m = Lk, n = Lq, k = D */
    st = cublas_error(ctx,
                      cublasGemmBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)p->Lk, (int)p->Lq, (int)p->D, &one, d,
                                          cuda_type<T>(), (int)p->k_st.s, d + BH, cuda_type<T>(), (int)p->q_st.s, &zero,
                                          (void **)(d + 2 * BH), CUDA_R_32F, (int)p->Lk, (int)BH, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
                      "cublasGemmBatchedEx (Q·Kᵀ)");
    if (st) goto done;
    const int64_t rows = BH * p->Lq;
    st = launch ? launch(ctx, p, (const float *)S, P, rows, user) : launch_softmax<T>(ctx, p, (const float *)S, (T *)P, rows);
    if (st) goto done;
    /* row-major O (Lq×Dv) is column-major Oᵀ = Vᵀ·Pᵀ: m = Dv, n = Lq, k = Lk */
    st = cublas_error(ctx,
                      cublasGemmBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)p->Dv, (int)p->Lq, (int)p->Lk, &one,
                                          d + 3 * BH, cuda_type<T>(), (int)p->v_st.s, d + 4 * BH, cuda_type<T>(),
                                          (int)p->Lk, &zero, (void **)(d + 5 * BH), cuda_type<T>(), (int)p->o_st.s, (int)BH,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmBatchedEx (P·V)");
    if (st) goto done;
    int *flag = NULL; /* values hold NaN or inf: the skipping product replaces O */
    if ((st = values_nonfinite_flag(ctx, p, &flag))) goto done;
    naive_pv_skipping_kernel<T><<<(unsigned)(rows < 1024 ? rows : 1024), 128, 0, fa_cuda_stream(ctx)>>>(
        *p, (const T *)P, flag);
    st = fa_cuda_error(ctx, cudaGetLastError(), "launch of naive_pv_skipping_kernel");
    fa_cuda_free_on(ctx, flag, FA_FLAG_BYTES); /* stream-ordered: after the kernel */
  }
done:
  free(host);
  fa_cuda_free_on(ctx, S, s_bytes); /* stream-ordered frees: after the work above */
  fa_cuda_free_on(ctx, P, p_bytes);
  fa_cuda_free_on(ctx, ptrs, ptr_bytes);
  return st;
}

/* ---- its registry entry: "naive", every call (the dispatch checked the dtype) ---- */

static bool naive_takes(const fa_attn_problem *, fa_attention_algo, bool) { return true; }

extern "C" fa_status fa_cuda_attention_naive_with(fa_context *ctx, const fa_attn_problem *p, naive_softmax_launch launch,
                                                  void *user) {
  if (p->compute == FA_F16) return naive_typed<__half>(ctx, p, launch, user);
  if (p->compute == FA_BF16) return naive_typed<__nv_bfloat16>(ctx, p, launch, user);
  return naive_typed<float>(ctx, p, launch, user);
}

static fa_status naive_queue(fa_context *ctx, const attn_params *p, fa_attention_algo, bool, int **v_flag) {
  *v_flag = NULL;
  return fa_cuda_attention_naive_with(ctx, p, NULL, NULL);
}

const attn_entry attn_entry_naive = {FA_KERNEL_NAIVE, ATTN_ALGO(FA_ATTN_NAIVE), false, NULL, NULL, naive_takes,
                                     naive_queue,     false};
