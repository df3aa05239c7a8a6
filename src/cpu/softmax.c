/* CPU softmax over rows read where they lie (each row contiguous, the rows
 * at any strides: fa_state_rows), written to contiguous rows: the seeds'
 * four algorithms.
 *
 *  NAIVE   e^x / Σe^x, no max subtracted (overflows on purpose);
 *  SAFE    three passes over x: max, Σe^(x-m), normalise;
 *  ONLINE  two passes: blocks of `block` elements (the seeds' Triton
 *          BLOCK_SIZE), each block's local (max, sum) merged into a running
 *          (m, d) by d = e^(m_old-m_new)·d + e^(m_blk-m_new)·ℓ_blk; then
 *          normalise;
 *  FUSED   the row copied once into a per-thread buffer the size of on-chip
 *          memory (256 KiB), max/sum/normalise from there, written once;
 *  AUTO    FUSED when the row fits, else ONLINE.
 *
 * f32 is computed in f32 with a vectorised polynomial exp (fast_exp.h);
 * f64 in f64 with libm's exp.  `storage` (the tensor's own dtype) matters
 * to NAIVE only.  See softmax_rows.h for NaN and fully masked rows. */
#include "internal.h"

#include "fast_exp.h"
#include "par_rows.h"

#include <math.h>
#include <omp.h>

#ifdef __clang__ /* clang vectorises fewer of the omp simd loops (GCC does all); slower, not wrong */
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

#define FA_SM_DEFAULT_BLOCK 1024
#define FA_SM_FUSED_BYTES (256 * 1024) /* per-thread row buffer */
#define FA_SM_SUM_CHUNK 256            /* exps summed in the element type, then in double */
#define FA_SM_ONLINE_CHUNK 65536       /* elements per independently merged range of a row */
#define FA_SM_PAR_MIN 32768            /* below this many elements, threads cost more than they give */

int64_t fa_cpu_softmax_fused_max_n(fa_dtype dt) {
  return FA_SM_FUSED_BYTES / (dt == FA_F64 ? (int64_t)sizeof(double) : (int64_t)sizeof(float));
}

/* Merges a block's stats (mb, lb) into the running (m, d): the seeds'
 * ℓ = e^(m1-m)·ℓ1 + e^(m2-m)·ℓ2 with m = max(m1, m2), one factor being 1. */
static inline void fa_sm_merge(double *m, double *d, double mb, double lb) {
  if (mb == -INFINITY) { /* empty (fully masked) block: lb is 0, or NaN if it held one */
    *d += lb;
    return;
  }
  if (mb > *m) {
    *d = *d * exp(*m - mb) + lb; /* *m = -inf: e^-inf = 0 */
    *m = mb;
  } else {
    *d += lb * exp(mb - *m); /* NaN when both are +inf: such a row is NaN */
  }
}

#define FA_T float
#define FA_S f32
#define FA_EXP(v) fa_expf_fast(v)
#include "softmax_rows.h"
#undef FA_T
#undef FA_S
#undef FA_EXP

#define FA_T double
#define FA_S f64
#define FA_EXP(v) exp(v)
#include "softmax_rows.h"
#undef FA_T
#undef FA_S
#undef FA_EXP

/* NAIVE for f16/bf16 tensors: each e^x is held in the storage dtype, as a
 * kernel working in that dtype would hold it, so f16 overflows to inf past
 * e^11.09 (65504) as the seeds say; sums are accumulated in f32 (docs/lua-api.md).
 * Scalar: this algo exists to show the overflow, not to be fast. */
static float sm_held(fa_dtype storage, float v) {
  return storage == FA_F16 ? fa_f16_to_f32(fa_f32_to_f16(v)) : fa_bf16_to_f32(fa_f32_to_bf16(v));
}

static void sm_run_naive_held(const float *x, const fa_state_rows *rows_at, float *y, int64_t rows, int64_t n,
                              fa_dtype storage) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * n >= FA_SM_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + fa_state_row(rows_at, r);
    float *yr = y + r * n;
    double total = 0;
    for (int64_t c = 0; c < n; c += FA_SM_SUM_CHUNK) {
      int64_t e = n - c < FA_SM_SUM_CHUNK ? n : c + FA_SM_SUM_CHUNK;
      float s = 0;
      for (int64_t i = c; i < e; i++) s += sm_held(storage, fa_expf_fast(xr[i]));
      total += s;
    }
    float d = (float)total;
    for (int64_t i = 0; i < n; i++) yr[i] = sm_held(storage, fa_expf_fast(xr[i])) / d;
  }
}

fa_status fa_cpu_softmax(fa_context *ctx, fa_softmax_algo algo, int64_t block, fa_dtype dt, fa_dtype storage,
                         const void *x, const fa_state_rows *xr, void *y, int64_t rows, int64_t n) {
  if (dt != FA_F32 && dt != FA_F64)
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: softmax on the cpu computes in f32 or f64, got %s",
                   fa_dtype_name(dt));
  int64_t max_n = fa_cpu_softmax_fused_max_n(dt);
  if (algo == FA_SOFTMAX_AUTO) algo = n <= max_n ? FA_SOFTMAX_FUSED : FA_SOFTMAX_ONLINE;
  if (algo == FA_SOFTMAX_FUSED && n > max_n)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: softmax algo 'fused' holds a row of at most %lld %s elements on the cpu "
                   "(a 256 KiB buffer per thread), got rows of %lld; use 'online' or 'auto'",
                   (long long)max_n, fa_dtype_name(dt), (long long)n);
  if ((int)algo < (int)FA_SOFTMAX_AUTO || (int)algo > (int)FA_SOFTMAX_FUSED)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: softmax algo: unknown value %d", (int)algo);
  if (rows <= 0 || n <= 0) return FA_OK;
  if (block <= 0) block = FA_SM_DEFAULT_BLOCK;
  if (block > n) block = n; /* one block: same result, no oversized loops */

  if (algo == FA_SOFTMAX_ONLINE)
    return dt == FA_F32 ? sm_run_online_f32(ctx, block, x, xr, y, rows, n)
                        : sm_run_online_f64(ctx, block, x, xr, y, rows, n);
  if (algo == FA_SOFTMAX_NAIVE && dt == FA_F32 && (storage == FA_F16 || storage == FA_BF16)) {
    sm_run_naive_held(x, xr, y, rows, n, storage);
    return FA_OK;
  }
  return dt == FA_F32 ? sm_run_rows_f32(ctx, algo, x, xr, y, rows, n) : sm_run_rows_f64(ctx, algo, x, xr, y, rows, n);
}
