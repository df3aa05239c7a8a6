/* The CPU backward pass of attention (attention_backward.h).
 *
 * fa_cpu_attention_backward: FlashAttention's recomputation scheme.  The
 * row sums delta_i = rowsum(dO_i ∘ O_i) first; then, per key tile and per
 * query tile that may attend to it, S = Q·Kᵀ and dO·Vᵀ by BLAS, the scores
 * by the forward's own routine, P = e^(s − lse), dS, and the tile's shares
 * of dV, dK and dQ by BLAS.  Nothing of size Lq·Lk is stored (three Br·Bc
 * tiles a thread).  One task per (batch, KV
 * head) owns that head's dk, dv and the dq rows of the query heads sharing
 * it (GQA), so no two threads write one element and the order of every sum
 * is fixed: the result is bit-identical from run to run and whatever the
 * number of threads (opts.deterministic is always honoured).  With fewer
 * such tasks than threads, two passes (a key tile's dk, dv; a query tile's
 * dq) keep each element's order (bw_run).
 *
 * fa_cpu_attention_backward_reference: the plainest code in f64.  Per
 * (batch, query head) it materialises the raw products X = scale·QKᵀ, the
 * probabilities P and dP = dO·Vᵀ, then dS = P∘(dP − delta) and the chain
 * rule through the score rule of the forward (score_mod's derivative, from
 * its traced expression; softcap's 1 − tanh²; alibi and the float mask add
 * constants; mask_mod masks as the forward does). */
#include "cpu/attention_backward.h"

#include "attn_range.h"
#include "cpu/attention_scores.h"
#include "cpu/stage.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

/* Row-major C(m,n) = op(A)·op(B) + beta·C, single-threaded BLAS (the
 * engine threads with OpenMP itself). */
static inline void bw_gemm_f32(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                               const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k,
              1.0f, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}
static inline void bw_gemm_f64(int ta, int tb, int64_t m, int64_t n, int64_t k, const double *a, int64_t lda,
                               const double *b, int64_t ldb, double beta, double *c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k,
              1.0, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

#define FA_IMPL "cpu/attention_backward_impl.h"
#include "cpu/attention_instantiate.h"

fa_status fa_cpu_attention_backward(fa_context *ctx, const fa_attn_backward *g) {
  return g->p->compute == FA_F64 ? bw_run_f64(ctx, g) : bw_run_f32(ctx, g);
}

/* ---- the reference ---- */

static int ref_allowed(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
  int64_t lo, hi;
  fa_attn_range_of(p, b, i, &lo, &hi);
  if (j < lo || j >= hi) return 0;
  const int64_t *ms = p->mask_strides;
  if (p->mask_b && !p->mask_b[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]]) return 0;
  double keep = 1;
  if (p->mask_mod) fa_expr_eval_row(p->mask_mod, NULL, b, h, i, j, 1, NULL, &keep);
  return keep != 0; /* NaN (a fault) attends, as in the forward */
}

static double ref_dot(const double *a, const double *b, int64_t n) {
  double s = 0;
  for (int64_t e = 0; e < n; e++) s += a[e] * b[e];
  return s;
}

/* Query head h of batch b; x, pm, dp: Lq·Lk scratch each. */
static void ref_head(const fa_attn_backward *g, int64_t b, int64_t h, double *x, double *pm, double *dp) {
  const fa_attn_problem *p = g->p;
  const int64_t Lq = p->Lq, Lk = p->Lk, D = p->D, Dv = p->Dv, hk = h / (p->Hq / p->Hkv);
  const int64_t row0 = (b * p->Hq + h) * Lq, kv0 = (b * p->Hkv + hk) * Lk;
  const double *q = (const double *)p->q + row0 * D, *k = (const double *)p->k + kv0 * D;
  const double *v = (const double *)p->v + kv0 * Dv, *o = (const double *)g->o + row0 * Dv;
  const double *dout = (const double *)g->dout + row0 * Dv, *lse = (const double *)g->lse + row0;
  double *dq = (double *)g->dq + row0 * D, *dk = (double *)g->dk + kv0 * D, *dv = (double *)g->dv + kv0 * Dv;
  const double c = p->softcap;
  for (int64_t i = 0; i < Lq; i++)
    for (int64_t j = 0; j < Lk; j++) {
      const int allowed = ref_allowed(p, b, h, i, j);
      double y = p->scale * ref_dot(q + i * D, k + j * D, D), chain = 1; /* chain: d(score) / d(y) */
      if (p->score_mod && allowed) {
        const uint8_t on = 1;
        const double y0 = y;
        fa_expr_eval_row_grad(p->score_mod, &y0, b, h, i, j, 1, &on, &y, &chain);
      }
      double s = y;
      if (c > 0) {
        const double t = tanh(y / c);
        s = c * t;
        chain *= 1 - t * t;
      }
      if (p->alibi) s -= p->alibi[h] * fabs((double)(i + Lk - Lq - j));
      if (p->mask_f) {
        const int64_t *ms = p->mask_strides;
        s += ((const double *)p->mask_f)[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]];
      }
      x[i * Lk + j] = chain;
      /* -1: the pair passes nothing back (masked by the range, a mask or mask_mod, or a score of -inf from the
       * float mask or score_mod, whatever the values: as in the forward) */
      pm[i * Lk + j] = allowed && s != -INFINITY && lse[i] != -INFINITY ? exp(s - lse[i]) : -1;
      dp[i * Lk + j] = ref_dot(dout + i * Dv, v + j * Dv, Dv);
    }
  for (int64_t i = 0; i < Lq; i++) {
    if (lse[i] == -INFINITY) continue; /* a row with no key */
    const double delta = ref_dot(dout + i * Dv, o + i * Dv, Dv);
    for (int64_t j = 0; j < Lk; j++) {
      const double pij = pm[i * Lk + j];
      if (pij < 0) continue;
      /* a weight of 0 passes nothing (not 0 · NaN), as in the kernels */
      if (pij != 0)
        for (int64_t e = 0; e < Dv; e++) dv[j * Dv + e] += pij * dout[i * Dv + e];
      const double ds = pij * (dp[i * Lk + j] - delta) * x[i * Lk + j] * p->scale;
      if (ds == 0) continue;
      for (int64_t e = 0; e < D; e++) dq[i * D + e] += ds * k[j * D + e];
      for (int64_t e = 0; e < D; e++) dk[j * D + e] += ds * q[i * D + e];
    }
  }
}

fa_status fa_cpu_attention_backward_reference(fa_context *ctx, const fa_attn_backward *g) {
  const fa_attn_problem *p = g->p;
  const int64_t tasks = p->B * p->Hkv, G = p->Hq / p->Hkv;
  const int threads = fa_cpu_threads_for(tasks, 2.5 * fa_attn_flops(p));
  const double cells = (double)p->Lq * (double)p->Lk;
  if (cells * 3 * (double)threads * sizeof(double) > (double)SIZE_MAX / 2)
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: attention_backward_reference: Lq·Lk = %g is too large",
                   cells);
  const size_t each = (size_t)cells * 3, bytes = (each ? each : 1) * (size_t)threads * sizeof(double);
  fa_status st = FA_OK;
  double *scratch = fa_host_alloc(ctx, bytes, &st);
  if (!scratch) return st;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; t++) {
    double *x = scratch + (size_t)omp_get_thread_num() * each, *pm = x + each / 3, *dp = pm + each / 3;
    for (int64_t h = t % p->Hkv * G; h < (t % p->Hkv + 1) * G; h++) ref_head(g, t / p->Hkv, h, x, pm, dp);
  }
  fa_host_free(scratch, bytes);
  return FA_OK;
}
