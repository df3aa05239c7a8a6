/* Merging two partial attentions over disjoint key sets (the seeds'
 * rescale-and-add in log space):
 *   lse = log(e^lse1 + e^lse2) = m + log1p(e^-|lse1-lse2|),  m = max(lse1, lse2)
 *   o   = e^(lse1-lse)·o1 + e^(lse2-lse)·o2
 * An empty side (lse = -inf) leaves the other side exactly as it was; two
 * empty sides give o = 0, lse = -inf; a NaN lse makes its row NaN.  The
 * weights and lse are computed in double; o1, o2, o (f32 or f64) are contiguous
 * rows x dv and o may be o1 or o2 (lse may be lse1 or lse2). */
#include "internal.h"
#include "merge_weights.h"

#include <math.h>
#include <string.h>

#define FA_MERGE_PAR_MIN 65536 /* elements below which threads cost more than they give */

#define FA_MERGE_DEFINE(T, S)                                                                               \
  static void merge_row_##S(const T *o1, double l1, const T *o2, double l2, T *o, double *lse, int64_t dv) {  \
    if (l1 == -INFINITY && l2 == -INFINITY) {                                                                \
      for (int64_t i = 0; i < dv; i++) o[i] = 0;                                                             \
      *lse = -INFINITY;                                                                                      \
      return;                                                                                                \
    }                                                                                                        \
    if (l1 == -INFINITY || l2 == -INFINITY) { /* one side empty: the other, bit for bit */                  \
      const T *src = l2 == -INFINITY ? o1 : o2;                                                              \
      if (src != o) memmove(o, src, (size_t)dv * sizeof(T));                                                 \
      *lse = l2 == -INFINITY ? l1 : l2;                                                             \
      return;                                                                                                \
    }                                                                                                        \
    double w1, w2;                                                                                           \
    const double l = fa_merge_weights(l1, l2, &w1, &w2); /* NaN if either is NaN, or both +inf */           \
    for (int64_t i = 0; i < dv; i++) /* a weight of 0 takes nothing (inf·0 would be NaN), as on cuda */     \
      o[i] = (T)((w1 == 0 ? 0 : w1 * (double)o1[i]) + (w2 == 0 ? 0 : w2 * (double)o2[i]));                   \
    *lse = l;                                                                                         \
  }

FA_MERGE_DEFINE(float, f32)
FA_MERGE_DEFINE(double, f64)

void fa_cpu_merge_states(fa_dtype dt, const void *o1, const double *lse1, const void *o2, const double *lse2, void *o,
                         double *lse, int64_t rows, int64_t dv) {
  if (dt != FA_F32 && dt != FA_F64) return; /* the dispatch passes the compute dtype only */
  int par = rows > 1 && rows * dv >= FA_MERGE_PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t r = 0; r < rows; r++) {
    double l1 = lse1[r], l2 = lse2[r]; /* read before lse[r] (maybe lse1 + r) is written */
    if (dt == FA_F32)
      merge_row_f32((const float *)o1 + r * dv, l1, (const float *)o2 + r * dv, l2, (float *)o + r * dv, lse + r, dv);
    else
      merge_row_f64((const double *)o1 + r * dv, l1, (const double *)o2 + r * dv, l2, (double *)o + r * dv, lse + r,
                    dv);
  }
}
