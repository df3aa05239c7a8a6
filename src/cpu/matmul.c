/* CPU matmul, row-major C(m,n) = A(m,k)·B(k,n), f32 or f64.
 *
 *  NAIVE  the seeds' triple loop (i, j, k);
 *  TILED  the seeds' six loops: ii, jj, kk over tiles, then i, j, k inside;
 *  BLAS   cblas_?gemm on blocks of C, the blocks spread over OpenMP threads
 *         (each call runs one BLAS thread: see fa_cpu_blas_init);
 *  AUTO   BLAS.
 *
 * NAIVE and TILED add the products of C[i,j] in the same k order, so they
 * give bit-identical results: tiling changes only which data is reused
 * from cache.  Both spread C over threads (rows / tiles of C), which
 * changes no arithmetic. */
#include "internal.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <string.h>

#define FA_MM_DEFAULT_TILE 64
#define FA_MM_TILE_MAX 1024
#define FA_MM_PAR_MIN 262144.0 /* m·n·k below which threads cost more than they give */
#define FA_MM_BLAS_ROWS 32     /* smallest row block worth a BLAS call of its own */
#define FA_MM_BLAS_COLS 128

#define FA_MM_DEFINE(T, S)                                                                                   \
  static void mm_naive_##S(const T *restrict a, const T *restrict b, T *restrict c, int64_t m, int64_t k,   \
                           int64_t n, int64_t lda, int64_t ldb) {                                            \
    _Pragma("omp parallel for schedule(static) if ((double)m * n * k >= FA_MM_PAR_MIN)")                     \
    for (int64_t i = 0; i < m; i++)                                                                          \
      for (int64_t j = 0; j < n; j++) {                                                                      \
        T s = 0; /* C[i,j] starts at 0 and gets A[i,k]·B[k,j] added for k = 0..k-1 */                       \
        for (int64_t p = 0; p < k; p++) s += a[i * lda + p] * b[p * ldb + j];                                \
        c[i * n + j] = s;                                                                                    \
      }                                                                                                      \
  }                                                                                                          \
  static void mm_tiled_##S(const T *restrict a, const T *restrict b, T *restrict c, int64_t m, int64_t k,   \
                           int64_t n, int64_t lda, int64_t ldb, int64_t t) {                                 \
    memset(c, 0, (size_t)(m * n) * sizeof(T));                                                               \
    _Pragma("omp parallel for collapse(2) schedule(static) if ((double)m * n * k >= FA_MM_PAR_MIN)")         \
    for (int64_t ii = 0; ii < m; ii += t)                                                                    \
      for (int64_t jj = 0; jj < n; jj += t)                                                                  \
        for (int64_t kk = 0; kk < k; kk += t) { /* one thread per C tile: k order kept */                    \
          int64_t ie = ii + t < m ? ii + t : m, je = jj + t < n ? jj + t : n, ke = kk + t < k ? kk + t : k;  \
          for (int64_t i = ii; i < ie; i++)                                                                  \
            for (int64_t j = jj; j < je; j++) {                                                              \
              T s = c[i * n + j];                                                                            \
              for (int64_t p = kk; p < ke; p++) s += a[i * lda + p] * b[p * ldb + j];                        \
              c[i * n + j] = s;                                                                              \
            }                                                                                                \
        }                                                                                                    \
  }

FA_MM_DEFINE(float, f32)
FA_MM_DEFINE(double, f64)

/* One BLAS call for the block rows [i0,i1) x cols [j0,j1) of C. */
static void mm_blas_block(fa_dtype dt, const fa_mm_operands *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int rows = (int)(i1 - i0), cols = (int)(j1 - j0), kk = (int)g->k, lda = (int)g->lda, ldb = (int)g->ldb,
            ldc = (int)g->n;
  if (dt == FA_F32)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, cols, kk, 1.0f, (const float *)g->a + i0 * g->lda,
                lda, (const float *)g->b + j0, ldb, 0.0f, (float *)g->c + i0 * g->n + j0, ldc);
  else
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, cols, kk, 1.0, (const double *)g->a + i0 * g->lda,
                lda, (const double *)g->b + j0, ldb, 0.0, (double *)g->c + i0 * g->n + j0, ldc);
}

/* C split into pr x pc blocks, one per thread: rows first (each thread
 * then streams all of B, as BLAS would), columns too when rows run out. */
static void mm_blas(fa_dtype dt, const fa_mm_operands *g) {
  const int64_t m = g->m, k = g->k, n = g->n;
  int nt = omp_get_max_threads();
  if ((double)m * n * k < FA_MM_PAR_MIN || nt == 1) {
    mm_blas_block(dt, g, 0, m, 0, n);
    return;
  }
  int64_t pr = (m + FA_MM_BLAS_ROWS - 1) / FA_MM_BLAS_ROWS, pc = 1;
  if (pr > nt) pr = nt;
  if (pr < nt) {
    pc = nt / pr;
    int64_t max_pc = (n + FA_MM_BLAS_COLS - 1) / FA_MM_BLAS_COLS;
    if (pc > max_pc) pc = max_pc;
  }
  int64_t tasks = pr * pc;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tasks; t++) {
    int64_t r = t / pc, q = t % pc;
    mm_blas_block(dt, g, m * r / pr, m * (r + 1) / pr, n * q / pc, n * (q + 1) / pc);
  }
}

fa_status fa_cpu_matmul(fa_context *ctx, fa_matmul_algo algo, int64_t tile, fa_dtype dt, const fa_mm_operands *g) {
  const int64_t m = g->m, k = g->k, n = g->n, lda = g->lda, ldb = g->ldb;
  void *c = g->c;
  if (dt != FA_F32 && dt != FA_F64)
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: matmul on the cpu computes in f32 or f64, got %s",
                   fa_dtype_name(dt));
  if ((int)algo < (int)FA_MATMUL_AUTO || (int)algo > (int)FA_MATMUL_BLAS)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: matmul algo: unknown value %d", (int)algo);
  if (tile == 0) tile = FA_MM_DEFAULT_TILE;
  if (algo == FA_MATMUL_TILED && (tile < 1 || tile > FA_MM_TILE_MAX))
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: matmul tile: expected 1 to %d (0 = default %d), got %lld",
                   FA_MM_TILE_MAX, FA_MM_DEFAULT_TILE, (long long)tile);
  if (m <= 0 || n <= 0) return FA_OK;
  size_t es = fa_dtype_size(dt);
  if (k <= 0) { /* an empty sum: C = 0 (and BLAS rejects lda = 0) */
    memset(c, 0, (size_t)(m * n) * es);
    return FA_OK;
  }
  if (algo == FA_MATMUL_AUTO) algo = FA_MATMUL_BLAS;
  if (algo == FA_MATMUL_BLAS) {
    if (m > INT_MAX || k > INT_MAX || n > INT_MAX) /* BLAS takes int dimensions (lda, ldb are: fa_mm_operands) */
      return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                     "flashattn: matmul algo 'blas': m, k, n must be below 2^31, got %lld, %lld, %lld", (long long)m,
                     (long long)k, (long long)n);
    fa_cpu_blas_init();
    mm_blas(dt, g);
  } else if (dt == FA_F32) {
    if (algo == FA_MATMUL_NAIVE) mm_naive_f32(g->a, g->b, c, m, k, n, lda, ldb);
    else mm_tiled_f32(g->a, g->b, c, m, k, n, lda, ldb, tile);
  } else {
    if (algo == FA_MATMUL_NAIVE) mm_naive_f64(g->a, g->b, c, m, k, n, lda, ldb);
    else mm_tiled_f64(g->a, g->b, c, m, k, n, lda, ldb, tile);
  }
  return FA_OK;
}
