/* Merging two partial attentions over disjoint key sets (the seeds'
 * rescale-and-add in log space):
 *   lse = log(e^lse1 + e^lse2) = m + log1p(e^-|lse1-lse2|),  m = max(lse1, lse2)
 *   o   = e^(lse1-lse)·o1 + e^(lse2-lse)·o2
 * An empty side (lse = -inf) leaves the other side exactly as it was; two
 * empty sides give o = 0, lse = -inf; a NaN lse makes its row NaN.  The
 * weights and lse are computed in double; o1 and o2 (f32 or f64) are read at
 * their rows (fa_state_rows), o is contiguous rows x dv. */
#include "cpu/par_rows.h"
#include "cpu/stage.h"
#include "internal.h"
#include "merge_weights.h"

#include <math.h>
#include <string.h>

#define FA_MERGE_PAR_MIN 65536 /* elements below which threads cost more than they give */

#define FA_MERGE_DEFINE(T, S)                                                                               \
  void fa_cpu_merge_row_##S(const T *o1, double l1, const T *o2, double l2, T *o, double *lse, int64_t dv) {  \
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

/* fa_cpu_merge_row_f32 of states of dtypes t1, t2 (f32, or f16/bf16 read
 * as they lie), in chunks of MERGE_CHUNK elements widened on the stack: the same
 * bits as merging their f32 copies. */
enum { MERGE_CHUNK = 256 };
static void merge_row_widened(const void *o1, fa_dtype t1, double l1, const void *o2, fa_dtype t2, double l2, float *o,
                              double *lse, int64_t dv) {
  float b1[MERGE_CHUNK], b2[MERGE_CHUNK];
  if (dv == 0) { /* the lse alone */
    const float none = 0;
    fa_cpu_merge_row_f32(&none, l1, &none, l2, o, lse, 0);
  }
  for (int64_t c = 0; c < dv; c += MERGE_CHUNK) {
    const int64_t n = dv - c < MERGE_CHUNK ? dv - c : MERGE_CHUNK;
    const float *p1 = (const float *)fa_cpu_elem(o1, t1, c), *p2 = (const float *)fa_cpu_elem(o2, t2, c);
    if (t1 != FA_F32) fa_cpu_stage_rows(FA_F32, b1, n, t1, p1, n, 1, n), p1 = b1;
    if (t2 != FA_F32) fa_cpu_stage_rows(FA_F32, b2, n, t2, p2, n, 1, n), p2 = b2;
    fa_cpu_merge_row_f32(p1, l1, p2, l2, o + c, lse, n);
  }
}

void fa_cpu_merge_states(fa_dtype dt, const fa_merge_operands *g) {
  if (dt != FA_F32 && dt != FA_F64) return; /* the dispatch passes the compute dtype only (the states': dt1, dt2) */
  const int64_t rows = g->rows, dv = g->dv;
  int par = rows > 1 && rows * dv >= FA_MERGE_PAR_MIN;
  FA_PAR_ROWS(par, r, rows, {
    const double l1 = g->lse1[r], l2 = g->lse2[r];
    const int64_t a = fa_state_row(&g->rows1, r), b = fa_state_row(&g->rows2, r);
    if (dt == FA_F32 && (g->dt1 != FA_F32 || g->dt2 != FA_F32))
      merge_row_widened(fa_cpu_elem(g->o1, g->dt1, a), g->dt1, l1, fa_cpu_elem(g->o2, g->dt2, b), g->dt2, l2,
                        (float *)g->o + r * dv, g->lse + r, dv);
    else if (dt == FA_F32)
      fa_cpu_merge_row_f32((const float *)g->o1 + a, l1, (const float *)g->o2 + b, l2, (float *)g->o + r * dv,
                           g->lse + r, dv);
    else
      fa_cpu_merge_row_f64((const double *)g->o1 + a, l1, (const double *)g->o2 + b, l2, (double *)g->o + r * dv,
                           g->lse + r, dv);
  });
}
