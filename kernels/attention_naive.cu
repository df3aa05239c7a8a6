/* "naive" attention on the GPU, the unfused method users would otherwise
 * write: S = Q·Kᵀ through cuBLAS (batched over batch × head, f32 scores),
 * a row kernel that applies the score rule and the softmax and writes P in
 * the inputs' dtype, then O = P·V through cuBLAS.  S and P are materialised
 * in device memory. */
#include "attention_common.cuh"

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

/* A warp per query row: one pass over S for the row's running (max, sum)
 * (the online rule per lane, merged across the warp), a second (from L2)
 * for P = e^(s-m)/l; the score rule applied to each raw product on the
 * way.  (A block per row with three passes over S ran at a quarter of the
 * bandwidth: its rows are too short to pay for two block-wide barriers.) */
template <typename T> __global__ void naive_softmax_kernel(fa_attn_problem p, const float *S, T *P, int64_t rows) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows; row += warps) {
    const int64_t i = row % p.Lq, bh = row / p.Lq, b = bh / p.Hq, h = bh % p.Hq;
    const float *srow = S + row * p.Lk;
    T *prow = P + row * p.Lk;
    int64_t lo, hi;
    fa_attn_range_of(&p, b, i, &lo, &hi);
    float m = -INFINITY, d = 0.f; /* a NaN score is dropped by the max but reaches d */
    for (int64_t j = lane; j < p.Lk; j += 32) {
      float s = attn_score(p, b, h, i, j, srow[j], lo, hi);
      if (s == -INFINITY) continue;
      if (s > m) d = d * expf(m - s) + 1.f, m = s;
      else d += expf(s - m);
    }
    for (int o = 16; o > 0; o >>= 1) {
      float mo = __shfl_xor_sync(0xffffffffu, m, o), dO = __shfl_xor_sync(0xffffffffu, d, o);
      float mn = fmaxf(m, mo);
      d = mn == -INFINITY ? d + dO : d * expf(m - mn) + dO * expf(mo - mn);
      m = mn;
    }
    float inv = d > 0.f ? 1.f / d : (d == d ? 0.f : d);
    /* a masked key's weight is -0: the same product in cuBLAS, and a mark
     * for the path that must skip masked keys (non-finite values in v) */
    for (int64_t j = lane; j < p.Lk; j += 32) {
      float s = attn_score(p, b, h, i, j, __ldcs(&srow[j]), lo, hi);
      prow[j] = from_float<T>(s == -INFINITY ? -0.f : expf(s - m) * inv);
    }
    if (p.lse && lane == 0) p.lse[row] = row_lse(m, d);
  }
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
    const int64_t bh = row / p.Lq, b = bh / p.Hq, hk = (bh % p.Hq) / (p.Hq / p.Hkv);
    const T *prow = P + row * p.Lk, *v = (const T *)p.v + ((b * p.Hkv + hk) * p.Lk) * p.Dv;
    for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) {
      float acc = 0.f;
      for (int64_t j = 0; j < p.Lk; j++)
        if (!is_masked(prow[j])) acc = fmaf(to_float(prow[j]), to_float(v[j * p.Dv + c]), acc);
      ((T *)p.o)[row * p.Dv + c] = from_float<T>(acc);
    }
  }
}

template <typename T> static cudaDataType_t cuda_type();
template <> cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <> cudaDataType_t cuda_type<__half>() { return CUDA_R_16F; }
template <> cudaDataType_t cuda_type<__nv_bfloat16>() { return CUDA_R_16BF; }

template <typename T> static fa_status naive_typed(fa_context *ctx, const fa_attn_problem *p) {
  const int64_t BH = p->B * p->Hq, n_s = BH * p->Lq * p->Lk;
  if (p->Lq > INT32_MAX || p->Lk > INT32_MAX || BH > INT32_MAX)
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
    int64_t b = bh / p->Hq, hk = (bh % p->Hq) / (p->Hq / p->Hkv), kv = b * p->Hkv + hk;
    host[bh] = (const T *)p->k + kv * p->Lk * p->D;
    host[BH + bh] = (const T *)p->q + bh * p->Lq * p->D;
    host[2 * BH + bh] = (float *)S + bh * p->Lq * p->Lk;
    host[3 * BH + bh] = (const T *)p->v + kv * p->Lk * p->Dv;
    host[4 * BH + bh] = (T *)P + bh * p->Lq * p->Lk;
    host[5 * BH + bh] = (T *)p->o + bh * p->Lq * p->Dv;
  }
  if ((st = fa_cuda_memcpy(ctx, ptrs, host, ptr_bytes, FA_COPY_H2D))) goto done;
  {
    const void **d = (const void **)ptrs;
    const float one = 1.f, zero = 0.f;
    /* row-major S (Lq×Lk) is column-major Sᵀ = Kᵀ·Q: m = Lk, n = Lq, k = D */
    st = cublas_error(ctx,
                      cublasGemmBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)p->Lk, (int)p->Lq, (int)p->D, &one, d,
                                          cuda_type<T>(), (int)p->D, d + BH, cuda_type<T>(), (int)p->D, &zero,
                                          (void **)(d + 2 * BH), CUDA_R_32F, (int)p->Lk, (int)BH, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
                      "cublasGemmBatchedEx (Q·Kᵀ)");
    if (st) goto done;
    const int64_t rows = BH * p->Lq, blocks = (rows + 7) / 8;
    naive_softmax_kernel<T><<<(unsigned)(blocks < 65536 * 4 ? blocks : 65536 * 4), 256, 0, fa_cuda_stream(ctx)>>>(
        *p, (const float *)S, (T *)P, rows);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      st = fa_cuda_error(ctx, err, "launch of naive_softmax_kernel");
      goto done;
    }
    /* row-major O (Lq×Dv) is column-major Oᵀ = Vᵀ·Pᵀ: m = Dv, n = Lq, k = Lk */
    st = cublas_error(ctx,
                      cublasGemmBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)p->Dv, (int)p->Lq, (int)p->Lk, &one,
                                          d + 3 * BH, cuda_type<T>(), (int)p->Dv, d + 4 * BH, cuda_type<T>(),
                                          (int)p->Lk, &zero, (void **)(d + 5 * BH), cuda_type<T>(), (int)p->Dv, (int)BH,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmBatchedEx (P·V)");
    if (st) goto done;
    int *flag = NULL; /* values hold NaN or inf: the skipping product replaces O */
    if ((st = values_nonfinite_flag(ctx, p, &flag))) goto done;
    naive_pv_skipping_kernel<T><<<(unsigned)(rows < 1024 ? rows : 1024), 128, 0, fa_cuda_stream(ctx)>>>(
        *p, (const T *)P, flag);
    st = fa_cuda_error(ctx, cudaGetLastError(), "launch of naive_pv_skipping_kernel");
    fa_cuda_free(flag, sizeof(int)); /* stream-ordered: after the kernel */
  }
done:
  free(host);
  fa_cuda_free(S, s_bytes); /* stream-ordered frees: after the work above */
  fa_cuda_free(P, p_bytes);
  fa_cuda_free(ptrs, ptr_bytes);
  return st;
}

extern "C" fa_status fa_cuda_attention_naive(fa_context *ctx, const fa_attn_problem *p) {
  switch (p->compute) {
  case FA_F32: return naive_typed<float>(ctx, p);
  case FA_F16: return naive_typed<__half>(ctx, p);
  case FA_BF16: return naive_typed<__nv_bfloat16>(ctx, p);
  default:
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: attention on cuda takes f32, f16 or bf16, got %s",
                   fa_dtype_name(p->compute));
  }
}
