/* fa_cpu_attention_reference: attention in f64 by the plainest code, to
 * check the other algorithms against.  Written apart from them on purpose:
 * it tests each key against causal / window / kv_lens / mask / mask_mod
 * itself rather than using fa_attn_key_range or the shared score routine;
 * score_mod is evaluated only for the keys a row attends.  Per row: the
 * scores of the allowed keys, their max, e^(s - max), the sum, o = Σ p v. */
#include "expr.h"
#include "internal.h"

#include <math.h>
#include <omp.h>
#include <string.h>

/* Element offset of row i of head h of batch b of an operand laid out by
 * st (a view of the caller's tensor, or the engine's own buffer). */
static int64_t row_at(fa_attn_strides st, int64_t b, int64_t h, int64_t i) { return b * st.b + h * st.h + i * st.s; }

static int key_allowed(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t diag = i + p->Lk - p->Lq; /* the key aligned with query i (bottom-right) */
  if (p->kv_lens && j >= p->kv_lens[b]) return 0;
  if (p->causal == FA_CAUSAL_BOTTOM_RIGHT && j > diag) return 0;
  if (p->causal == FA_CAUSAL_TOP_LEFT && j > i) return 0;
  if (p->has_window && p->win_left >= 0 && j < diag && diag - j > p->win_left) return 0;
  if (p->has_window && p->win_right >= 0 && j > diag && j - diag > p->win_right) return 0;
  if (p->mask_b) {
    const int64_t *ms = p->mask_strides;
    if (!p->mask_b[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]]) return 0;
  }
  if (p->mask_mod && fa_expr_value(p->mask_mod, 0, b, h, i, j) == 0) return 0; /* API §9; NaN (a fault) attends */
  return 1;
}

static double score(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t D = p->D, hk = h / (p->Hq / p->Hkv);
  const double *q = (const double *)p->q + row_at(p->q_st, b, h, i);
  const double *k = (const double *)p->k + row_at(p->k_st, b, hk, j);
  double s = 0;
  for (int64_t e = 0; e < D; e++) s += q[e] * k[e];
  s *= p->scale;
  if (p->score_mod) s = fa_expr_value(p->score_mod, s, b, h, i, j); /* API §9: the scaled score, before the rest */
  if (p->softcap > 0) s = p->softcap * tanh(s / p->softcap);
  if (p->alibi) s -= p->alibi[h] * fabs((double)(i + p->Lk - p->Lq - j));
  if (p->mask_f) {
    const int64_t *ms = p->mask_strides;
    s += ((const double *)p->mask_f)[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]];
  }
  return s;
}

/* One output row; s is scratch for Lk scores (-inf where not allowed). */
static void reference_row(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, double *s) {
  const int64_t Lk = p->Lk, Dv = p->Dv, hk = h / (p->Hq / p->Hkv);
  const double *v = (const double *)p->v + row_at(p->v_st, b, hk, 0);
  double *o = (double *)p->o + row_at(p->o_st, b, h, i);
  double *lse = p->lse64 ? p->lse64 + row_at(p->lse_st, b, h, i) : NULL;
  double mx = -INFINITY;
  int has_nan = 0;
  for (int64_t j = 0; j < Lk; j++) {
    s[j] = key_allowed(p, b, h, i, j) ? score(p, b, h, i, j) : -INFINITY;
    if (isnan(s[j])) has_nan = 1;
    else if (s[j] > mx) mx = s[j];
  }
  for (int64_t e = 0; e < Dv; e++) o[e] = 0;
  if (has_nan || mx == -INFINITY) { /* NaN in, NaN out; nothing allowed: zeros */
    for (int64_t e = 0; e < Dv; e++) o[e] = has_nan ? NAN : 0;
    if (lse) *lse = has_nan ? NAN : -INFINITY;
    return;
  }
  double sum = 0;
  for (int64_t j = 0; j < Lk; j++) {
    if (s[j] == -INFINITY) continue;
    const double w = exp(s[j] - mx);
    sum += w;
    for (int64_t e = 0; e < Dv; e++) o[e] += w * v[j * p->v_st.s + e];
  }
  for (int64_t e = 0; e < Dv; e++) o[e] /= sum;
  if (lse) *lse = mx + log(sum);
}

fa_status fa_cpu_attention_reference(fa_context *ctx, const fa_attn_problem *p) {
  const int64_t rows = p->B * p->Hq * p->Lq;
  const int threads = fa_cpu_threads_for(rows, fa_attn_flops(p));
  const size_t lk = p->Lk > 0 ? (size_t)p->Lk : 1;
  if (lk > SIZE_MAX / sizeof(double) / (size_t)threads)
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: attention_reference: Lk = %lld is too large",
                   (long long)p->Lk);
  const size_t bytes = lk * sizeof(double) * (size_t)threads;
  fa_status st = FA_OK;
  double *scratch = fa_host_alloc(ctx, bytes, &st);
  if (!scratch) return st;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 4)
  for (int64_t r = 0; r < rows; r++)
    reference_row(p, r / (p->Hq * p->Lq), r / p->Lq % p->Hq, r % p->Lq, scratch + (size_t)omp_get_thread_num() * lk);
  fa_host_free(scratch, bytes);
  return FA_OK;
}
