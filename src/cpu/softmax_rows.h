/* Softmax row kernels and their drivers for one element type: included by
 * softmax.c once per type with FA_T (float or double), FA_S (the name
 * suffix) and FA_EXP(x) (e^x in FA_T) defined.  No include guard on purpose.
 *
 * Conventions shared by every algorithm except NAIVE:
 *  - the max ignores NaN, so a NaN reaches the sum and turns the row's
 *    denominator, hence the whole row, into NaN (and only that row);
 *  - a row whose max is -inf (fully masked) gives zeros, not 0/0;
 *  - exponentials are summed in FA_T over FA_SM_SUM_CHUNK elements at a
 *    time (vector lanes), the chunk sums carried in double, so rounding
 *    does not grow with the row length. */

#define FA_SM_CAT2(a, b) a##_##b
#define FA_SM_CAT(a, b) FA_SM_CAT2(a, b)
#define FA_SM_FN(name) FA_SM_CAT(name, FA_S)

static inline FA_T FA_SM_FN(sm_max)(const FA_T *x, int64_t n) {
  FA_T m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

static inline int FA_SM_FN(sm_has_nan)(const FA_T *x, int64_t n) {
  int r = 0;
  for (int64_t i = 0; i < n; i++) r |= x[i] != x[i];
  return r;
}

/* Σ e^(x_i - m). */
static inline double FA_SM_FN(sm_expsum)(const FA_T *x, int64_t n, FA_T m) {
  double total = 0;
  for (int64_t c = 0; c < n; c += FA_SM_SUM_CHUNK) {
    int64_t e = n - c < FA_SM_SUM_CHUNK ? n : c + FA_SM_SUM_CHUNK;
    FA_T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = c; i < e; i++) s += FA_EXP(x[i] - m);
    total += s;
  }
  return total;
}

/* The denominator of a row (or block) with max m; see the conventions. */
static inline double FA_SM_FN(sm_denominator)(const FA_T *x, int64_t n, FA_T m) {
  if (m == -INFINITY) return FA_SM_FN(sm_has_nan)(x, n) ? NAN : 0.0;
  return FA_SM_FN(sm_expsum)(x, n, m);
}

/* y = e^(x - m) / d, the last pass of every stable algorithm. */
static inline void FA_SM_FN(sm_normalise)(const FA_T *x, FA_T *y, int64_t n, double m, double d) {
  if (m == -INFINITY) { /* fully masked: zeros, or NaN when the row held one */
    FA_T v = d == d ? (FA_T)0 : (FA_T)NAN;
    for (int64_t i = 0; i < n; i++) y[i] = v;
    return;
  }
  FA_T mm = (FA_T)m, inv = (FA_T)(1.0 / d); /* d >= 1: the max term is e^0 */
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = FA_EXP(x[i] - mm) * inv;
}

/* ---- one row (or a range of one) per call; y may equal x ---- */

/* e^x / Σe^x exactly as written: overflows past e^88 (f32) / e^709 (f64),
 * and a row of very negative values underflows the sum to 0 (0/0 = NaN). */
FA_CPU_CLONES static void FA_SM_FN(sm_row_naive)(const FA_T *x, FA_T *y, int64_t n) {
  FA_T d = (FA_T)FA_SM_FN(sm_expsum)(x, n, 0);
#pragma omp simd
  for (int64_t i = 0; i < n; i++) y[i] = FA_EXP(x[i]) / d;
}

/* Three passes over x: max, Σe^(x-m), normalise. */
FA_CPU_CLONES static void FA_SM_FN(sm_row_safe)(const FA_T *x, FA_T *y, int64_t n) {
  FA_T m = FA_SM_FN(sm_max)(x, n);
  double d = FA_SM_FN(sm_denominator)(x, n, m);
  FA_SM_FN(sm_normalise)(x, y, n, m, d);
}

/* x read once into buf (the "on-chip" row) while taking the max; the sum
 * and the normalisation read buf; y written once. */
FA_CPU_CLONES static void FA_SM_FN(sm_row_fused)(const FA_T *x, FA_T *y, int64_t n, FA_T *buf) {
  FA_T m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; i++) {
    FA_T v = x[i];
    buf[i] = v;
    m = v > m ? v : m;
  }
  double d = FA_SM_FN(sm_denominator)(buf, n, m);
  FA_SM_FN(sm_normalise)(buf, y, n, m, d);
}

/* Online pass 1 over a range of a row: blocks of `block` elements, each
 * block's local (max, Σe^(x-max)) merged into the running (m, d).  *m, *d
 * are the range's stats, to be merged with fa_sm_merge. */
FA_CPU_CLONES static void FA_SM_FN(sm_online_stats)(const FA_T *x, int64_t n, int64_t block, double *m,
                                                    double *d) {
  double rm = -INFINITY, rd = 0;
  for (int64_t b = 0; b < n; b += block) {
    int64_t len = n - b < block ? n - b : block;
    FA_T mb = FA_SM_FN(sm_max)(x + b, len);
    fa_sm_merge(&rm, &rd, mb, FA_SM_FN(sm_denominator)(x + b, len, mb));
  }
  *m = rm;
  *d = rd;
}

/* Online pass 2 over a range, with the whole row's (m, d). */
FA_CPU_CLONES static void FA_SM_FN(sm_online_norm)(const FA_T *x, FA_T *y, int64_t n, double m, double d) {
  FA_SM_FN(sm_normalise)(x, y, n, m, d);
}

/* ---- drivers: OpenMP over rows ---- */

/* x's row r at fa_state_row(xr, r) (API §6), y's at r·n. */
static fa_status FA_SM_FN(sm_run_rows)(fa_context *ctx, fa_softmax_algo algo, const FA_T *x, const fa_state_rows *xr,
                                       FA_T *y, int64_t rows, int64_t n) {
  int par = rows > 1 && rows * n >= FA_SM_PAR_MIN;
  if (algo == FA_SOFTMAX_NAIVE) {
    FA_PAR_ROWS(par, r, rows, FA_SM_FN(sm_row_naive)(x + fa_state_row(xr, r), y + r * n, n););
    return FA_OK;
  }
  if (algo == FA_SOFTMAX_SAFE) {
    FA_PAR_ROWS(par, r, rows, FA_SM_FN(sm_row_safe)(x + fa_state_row(xr, r), y + r * n, n););
    return FA_OK;
  }
  /* FUSED: one row buffer per thread, n elements each (padded to 64 B) */
  int64_t ld = (n + 63) & ~(int64_t)63;
  int nt = par ? omp_get_max_threads() : 1;
  size_t bytes = (size_t)nt * (size_t)ld * sizeof(FA_T);
  fa_status st;
  FA_T *buf = fa_host_alloc(ctx, bytes, &st);
  if (!buf) return st;
  FA_PAR_ROWS(par, r, rows,
              FA_SM_FN(sm_row_fused)(x + fa_state_row(xr, r), y + r * n, n, buf + (int64_t)omp_get_thread_num() * ld););
  fa_host_free(buf, bytes);
  return FA_OK;
}

/* ONLINE.  A row's stats are always merged chunk by chunk (chunk = a whole
 * number of blocks), so results do not depend on the thread count; when
 * there are fewer rows than threads the chunks of a row run in parallel
 * (the merge is associative: the seeds' ℓ = e^(m1-m)ℓ1 + e^(m2-m)ℓ2). */
static fa_status FA_SM_FN(sm_run_online)(fa_context *ctx, int64_t block, const FA_T *x, const fa_state_rows *xr,
                                         FA_T *y, int64_t rows, int64_t n) {
  int64_t chunk = block * ((FA_SM_ONLINE_CHUNK + block - 1) / block);
  int64_t nc = (n + chunk - 1) / chunk;
  int nt = omp_get_max_threads();
  int par = rows * n >= FA_SM_PAR_MIN;
  if (nc == 1 || rows >= nt || !par) {
    FA_PAR_ROWS(par && rows > 1, r, rows, {
      const FA_T *row = x + fa_state_row(xr, r);
      double m = -INFINITY, d = 0;
      for (int64_t c = 0; c < n; c += chunk) {
        double cm, cd;
        FA_SM_FN(sm_online_stats)(row + c, n - c < chunk ? n - c : chunk, block, &cm, &cd);
        fa_sm_merge(&m, &d, cm, cd);
      }
      FA_SM_FN(sm_online_norm)(row, y + r * n, n, m, d);
    });
    return FA_OK;
  }
  int64_t tasks = rows * nc;
  size_t bytes = (size_t)tasks * 2 * sizeof(double);
  fa_status st;
  double *stats = fa_host_alloc(ctx, bytes, &st);
  if (!stats) return st;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
      int64_t r = t / nc, c = (t % nc) * chunk;
      FA_SM_FN(sm_online_stats)(x + fa_state_row(xr, r) + c, n - c < chunk ? n - c : chunk, block, &stats[2 * t],
                                &stats[2 * t + 1]);
    }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      double m = -INFINITY, d = 0;
      for (int64_t c = 0; c < nc; c++) fa_sm_merge(&m, &d, stats[2 * (r * nc + c)], stats[2 * (r * nc + c) + 1]);
      stats[2 * r * nc] = m; /* the row's stats replace its first chunk's */
      stats[2 * r * nc + 1] = d;
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
      int64_t r = t / nc, c = (t % nc) * chunk;
      FA_SM_FN(sm_online_norm)(x + fa_state_row(xr, r) + c, y + r * n + c, n - c < chunk ? n - c : chunk,
                               stats[2 * r * nc], stats[2 * r * nc + 1]);
    }
  }
  fa_host_free(stats, bytes);
  return FA_OK;
}

#undef FA_SM_FN
#undef FA_SM_CAT
#undef FA_SM_CAT2
