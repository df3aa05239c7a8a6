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
#include "attention_nonfinite.cuh"
#include "attention_registry.h"
#include "online_state.cuh"

#include <cublas_v2.h>
#include <float.h>

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

#define NAIVE_THREADS 256    /* a block: 8 rows (a warp each), or one long row */
/* Longer rows take a block each: with a warp each, the grid that keeps
 * their S within L2 would leave too few warps per SM to keep the memory
 * busy (at 2048 keys it still has about 24). */
#define NAIVE_LONG_ROW 2048

/* e^x is fa_exp (online_state.cuh, on the SFU; weights below 2^-126
 * flushed to 0): the tests' f32 tolerance (1e-5) leaves room for it, so
 * every dtype uses it.  x is always a difference s - m taken in f32 first,
 * so that the rounding of the log2 e product does not grow with the scores'
 * size. */

/* The score of key j, -inf when masked.  Without extras it is the key
 * range and the scale: no int64 mask offset per element, and the same
 * bits as attn_score (a call with an all-true mask gives the same P). */
template <bool EXTRAS>
static __device__ __forceinline__ float naive_score(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i, int j,
                                                    float dot, int lo, int hi, float scale) {
  if (EXTRAS) return attn_score(p, b, h, i, j, dot, lo, hi);
  return j >= lo && j < hi ? dot * scale : -INFINITY;
}

/* One score into the running (max m, sum d), one exponential: x =
 * e^-|s-m| rescales d when s is the new max (d·x + 1), else is s's weight
 * (d·1 + x).  A masked key (-inf) gets x = 0 (m is clamped to finite for
 * the difference, so that an empty m gives no (-inf) - (-inf) = NaN); a
 * NaN score is dropped by the max but reaches d.  No branches: the
 * unrolled loop's loads can all be issued before its arithmetic. */
static __device__ __forceinline__ void md_add(float s, float &m, float &d) {
  const bool up = s > m;
  const float x = fa_exp(-fabsf(s - fmaxf(m, -FLT_MAX)));
  d = fmaf(d, up ? x : 1.f, up ? 1.f : x);
  m = fmaxf(m, s);
}

/* P of one score, e^(s-m)/d, or -0 for a masked key.  mc is m clamped to
 * finite, so that the exponential is taken for every key without a NaN
 * from (-inf) - (-inf) and the select needs no branch. */
static __device__ __forceinline__ float p_of(float s, float mc, float inv) {
  const float w = fa_exp(s - mc) * inv;
  return s == -INFINITY ? -0.f : w;
}

/* Four P values, stored at once (8 bytes for f16/bf16, 16 for f32). */
template <typename T> struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

/* P = softmax(score rule(S)) per query row, 32·WPR threads a row (WPR = 1:
 * a warp per row, 8 rows a block; WPR = 8: a block per row, for rows past
 * NAIVE_LONG_ROW keys).  Pass 1 reads the row for its online (max, sum),
 * merged across the warp by shuffles and, with a block per row, across its
 * warps through shared memory (one barrier a row); pass 2 re-reads it (the
 * last use: streamed) and writes P = e^(s-m)/d.  Short rows keep a warp
 * each: they would not repay a barrier (an earlier block-per-row kernel ran
 * at a quarter of the bandwidth).  Long rows take a block each so that few
 * are in flight per SM and, with the launcher's grid, their S is still in
 * L2 for pass 2.  When Lk % 4 == 0 every row of S (of P) is 16-byte
 * (8-byte) aligned and is read (written) in chunks of 4; otherwise the
 * tail loops do the whole row one element at a time. */
template <typename T, bool EXTRAS, int WPR>
__global__ void __launch_bounds__(NAIVE_THREADS)
    naive_softmax_kernel(fa_attn_problem p, const float *__restrict__ S, T *__restrict__ P, int64_t rows) {
  static_assert(WPR == 1 || 32 * WPR == NAIVE_THREADS, "the barrier needs every thread of a block on one row");
  const int nt = 32 * WPR, t = threadIdx.x % nt, rpb = NAIVE_THREADS / nt; /* threads a row, place, rows a block */
  const int lane = threadIdx.x & 31;
  const int64_t Lk = p.Lk;
  const int nv = Lk % 4 ? 0 : (int)(Lk / 4); /* float4 chunks a row (Lk <= INT32_MAX) */
  const float scale = p.scale_f;
  constexpr int U = EXTRAS ? 2 : 4; /* chunks a thread has in flight (fewer with attn_score's registers) */
  __shared__ float2 part[2][WPR]; /* the warps' states, two rows' worth: one barrier a row */
  int buf = 0;
  for (int64_t row = (int64_t)blockIdx.x * rpb + threadIdx.x / nt; row < rows;
       row += (int64_t)gridDim.x * rpb, buf ^= 1) {
    const int64_t i = row % p.Lq, bh = row / p.Lq, b = bh / p.Hq, h = bh % p.Hq;
    const float *srow = S + row * Lk;
    T *prow = P + row * Lk;
    int64_t lo64, hi64;
    fa_attn_range_of(&p, b, i, &lo64, &hi64);
    const int lo = (int)lo64, hi = (int)hi64; /* both in [0, Lk] */

    float m = -INFINITY, d = 0.f;
#pragma unroll(U)
    for (int c = t; c < nv; c += nt) {
      const float4 s = ((const float4 *)srow)[c];
      md_add(naive_score<EXTRAS>(p, b, h, i, 4 * c, s.x, lo, hi, scale), m, d);
      md_add(naive_score<EXTRAS>(p, b, h, i, 4 * c + 1, s.y, lo, hi, scale), m, d);
      md_add(naive_score<EXTRAS>(p, b, h, i, 4 * c + 2, s.z, lo, hi, scale), m, d);
      md_add(naive_score<EXTRAS>(p, b, h, i, 4 * c + 3, s.w, lo, hi, scale), m, d);
    }
#pragma unroll(U)
    for (int64_t j = 4 * (int64_t)nv + t; j < Lk; j += nt)
      md_add(naive_score<EXTRAS>(p, b, h, i, (int)j, srow[j], lo, hi, scale), m, d);
    MD<float> st = warp_reduce_md(MD<float>{m, d});
    if (WPR > 1) { /* each warp merges all the warps' states alike, so every thread gets the same (m, d) */
      if (lane == 0) part[buf][threadIdx.x >> 5] = make_float2(st.m, st.d);
      __syncthreads();
      const float2 w = part[buf][lane % WPR];
      st = md_reduce_lanes(MD<float>{w.x, w.y}, WPR);
    }
    m = st.m, d = st.d;

    const float inv = row_inv(d), mc = fmaxf(m, -FLT_MAX);
    /* a masked key's weight is -0: the same product in cuBLAS, and a mark
     * for the path that must skip masked keys (non-finite values in v).
     * U chunks are loaded before any is stored: a store between two loads
     * would hold the second back (the compiler cannot tell S from P). */
    for (int c0 = t; c0 < nv; c0 += U * nt) {
      float4 s[U];
#pragma unroll
      for (int q = 0; q < U; q++)
        if (c0 + q * nt < nv) s[q] = __ldcs((const float4 *)srow + c0 + q * nt);
#pragma unroll
      for (int q = 0; q < U; q++) {
        const int c = c0 + q * nt;
        if (c >= nv) break;
        Vec4<T> w;
        w.v[0] = from_float<T>(p_of(naive_score<EXTRAS>(p, b, h, i, 4 * c, s[q].x, lo, hi, scale), mc, inv));
        w.v[1] = from_float<T>(p_of(naive_score<EXTRAS>(p, b, h, i, 4 * c + 1, s[q].y, lo, hi, scale), mc, inv));
        w.v[2] = from_float<T>(p_of(naive_score<EXTRAS>(p, b, h, i, 4 * c + 2, s[q].z, lo, hi, scale), mc, inv));
        w.v[3] = from_float<T>(p_of(naive_score<EXTRAS>(p, b, h, i, 4 * c + 3, s[q].w, lo, hi, scale), mc, inv));
        ((Vec4<T> *)prow)[c] = w;
      }
    }
    for (int64_t j = 4 * (int64_t)nv + t; j < Lk; j += nt)
      prow[j] = from_float<T>(p_of(naive_score<EXTRAS>(p, b, h, i, (int)j, __ldcs(&srow[j]), lo, hi, scale), mc, inv));
    if (p.lse && t == 0) attn_lse_at(p, b, h, i) = row_lse(m, d);
  }
}

/* The grid: at most one block per row group (and 2^18), and, for rows
 * whose S (4·Lk bytes) would not stay in L2 between the two passes, only
 * as many blocks as keep the rows in flight to half of L2, at least one a
 * SM (a row longer than that misses L2 whatever the schedule). */
template <typename T, bool EXTRAS, int WPR>
static fa_status launch_softmax_as(fa_context *ctx, const fa_attn_problem *p, const float *S, T *P, int64_t rows) {
  const int64_t rpb = NAIVE_THREADS / (32 * WPR);
  fa_cuda_props dp;
  if (fa_status st = fa_cuda_device_props(ctx, &dp)) return st;
  const int64_t fit = (int64_t)dp.l2_bytes / 2 / (4 * fa_max64(p->Lk, 1)) / rpb;
  int64_t grid = (rows + rpb - 1) / rpb;
  grid = fa_min64(grid, fa_min64(fa_max64(fit, dp.sms), 65536 * 4));
  if (grid <= 0) return FA_OK;
  naive_softmax_kernel<T, EXTRAS, WPR><<<(unsigned)grid, NAIVE_THREADS, 0, fa_cuda_stream(ctx)>>>(*p, S, P, rows);
  FA_CUDA_CHECK_LAUNCH(ctx, "naive_softmax_kernel");
  return FA_OK;
}

template <typename T>
static fa_status launch_softmax(fa_context *ctx, const fa_attn_problem *p, const float *S, T *P, int64_t rows) {
  const bool extras = attn_has_extras(p), block_rows = p->Lk > NAIVE_LONG_ROW;
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

template <typename T> static fa_status naive_typed(fa_context *ctx, const fa_attn_problem *p) {
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
    if ((st = launch_softmax<T>(ctx, p, (const float *)S, (T *)P, rows))) goto done;
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
    fa_cuda_free_on(ctx, flag, sizeof(int)); /* stream-ordered: after the kernel */
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

static fa_status naive_queue(fa_context *ctx, const attn_params *p, fa_attention_algo, bool, int **v_flag) {
  *v_flag = NULL;
  if (p->compute == FA_F16) return naive_typed<__half>(ctx, p);
  if (p->compute == FA_BF16) return naive_typed<__nv_bfloat16>(ctx, p);
  return naive_typed<float>(ctx, p);
}

const attn_entry attn_entry_naive = {FA_KERNEL_NAIVE, ATTN_ALGO(FA_ATTN_NAIVE), false, NULL, NULL, naive_takes,
                                     naive_queue,     false};
