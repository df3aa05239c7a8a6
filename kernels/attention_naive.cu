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

/* One block per query row: scores from S, the row's max and sum, P = e^(s-m)/l. */
template <typename T> __global__ void naive_softmax_kernel(fa_attn_problem p, const float *S, T *P) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x, i = row % p.Lq, bh = row / p.Lq, b = bh / p.Hq, h = bh % p.Hq;
  const float *srow = S + row * p.Lk;
  T *prow = P + row * p.Lk;
  int64_t lo, hi;
  fa_attn_range_of(&p, b, i, &lo, &hi);
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < p.Lk; j += blockDim.x) mx = fmaxf(mx, attn_score(p, b, h, i, j, srow[j], lo, hi));
  mx = warp_max(mx);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = warp_max((threadIdx.x & 31) < blockDim.x / 32 ? red[threadIdx.x & 31] : -INFINITY); /* every warp */
  __syncthreads();
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < p.Lk; j += blockDim.x) {
    float s = attn_score(p, b, h, i, j, srow[j], lo, hi);
    sum += s == -INFINITY ? 0.f : expf(s - mx);
  }
  sum = warp_sum(sum);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
  __syncthreads();
  sum = warp_sum((threadIdx.x & 31) < blockDim.x / 32 ? red[threadIdx.x & 31] : 0.f);
  float inv = sum > 0.f ? 1.f / sum : (sum == sum ? 0.f : sum);
  /* a masked key's weight is -0: the same product in cuBLAS, and a mark
   * for the path that must skip masked keys (non-finite values in v) */
  for (int64_t j = threadIdx.x; j < p.Lk; j += blockDim.x) {
    float s = attn_score(p, b, h, i, j, srow[j], lo, hi);
    prow[j] = from_float<T>(s == -INFINITY ? -0.f : expf(s - mx) * inv);
  }
  if (p.lse && threadIdx.x == 0) p.lse[row] = row_lse(mx, sum);
}

static __device__ __forceinline__ bool is_masked(float w) { return __float_as_uint(w) == 0x80000000u; }
static __device__ __forceinline__ bool is_masked(__half w) { return __half_as_ushort(w) == 0x8000u; }
static __device__ __forceinline__ bool is_masked(__nv_bfloat16 w) { return __bfloat16_as_ushort(w) == 0x8000u; }

/* O = P·V skipping masked keys, for values holding NaN or inf (where
 * 0·NaN in a matrix product would reach rows that mask the key). */
template <typename T> __global__ void naive_pv_skipping_kernel(fa_attn_problem p, const T *P) {
  const int64_t row = blockIdx.x, bh = row / p.Lq, b = bh / p.Hq, hk = (bh % p.Hq) / (p.Hq / p.Hkv);
  const T *prow = P + row * p.Lk, *v = (const T *)p.v + ((b * p.Hkv + hk) * p.Lk) * p.Dv;
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < p.Lk; j++)
      if (!is_masked(prow[j])) acc = fmaf(to_float(prow[j]), to_float(v[j * p.Dv + c]), acc);
    ((T *)p.o)[row * p.Dv + c] = from_float<T>(acc);
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
    naive_softmax_kernel<T><<<(unsigned)(BH * p->Lq), 256, 0, fa_cuda_stream(ctx)>>>(*p, (const float *)S, (T *)P);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      st = fa_cuda_error(ctx, err, "launch of naive_softmax_kernel");
      goto done;
    }
    int nonfinite = 0;
    if ((st = values_nonfinite(ctx, p, &nonfinite))) goto done;
    if (nonfinite) { /* values hold NaN or inf: the skipping product */
      naive_pv_skipping_kernel<T><<<(unsigned)(BH * p->Lq), 128, 0, fa_cuda_stream(ctx)>>>(*p, (const T *)P);
      st = fa_cuda_error(ctx, cudaGetLastError(), "launch of naive_pv_skipping_kernel");
      goto done;
    }
    /* row-major O (Lq×Dv) is column-major Oᵀ = Vᵀ·Pᵀ: m = Dv, n = Lq, k = Lk */
    st = cublas_error(ctx,
                      cublasGemmBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)p->Dv, (int)p->Lq, (int)p->Lk, &one,
                                          d + 3 * BH, cuda_type<T>(), (int)p->Dv, d + 4 * BH, cuda_type<T>(),
                                          (int)p->Lk, &zero, (void **)(d + 5 * BH), cuda_type<T>(), (int)p->Dv, (int)BH,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmBatchedEx (P·V)");
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
