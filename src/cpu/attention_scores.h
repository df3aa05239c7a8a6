/* The per-score and per-row steps every CPU attention algorithm shares, so
 * that the semantics of docs/lua-api.md §2 exist once:
 *   - fa_attn_scores_*: raw dot products -> final scores (scale, softcap,
 *     alibi, float mask, then -inf for keys a row may not attend);
 *   - fa_attn_online_*: the online-softmax step over a block of score rows
 *     (running max m, denominator l, rescale factor alpha);
 *   - fa_attn_finish_*: o /= l and lse = m + log l, empty rows -> 0 / -inf.
 * The f32 exp is fast_exp.h's fa_expf_fast, which GCC vectorises. */
#ifndef FA_CPU_ATTENTION_SCORES_H
#define FA_CPU_ATTENTION_SCORES_H

#include "expr.h"
#include "internal.h"

#include <stdint.h>

/* s[0..n) holds q_i . k_j for keys j0..j0+n-1 of query row i, head h,
 * batch b; it becomes the final scores, -inf outside [lo, hi) (the row's
 * fa_attn_key_range) and where the bool mask is false. */
void fa_attn_scores_f32(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                        int64_t lo, int64_t hi, float *s);
void fa_attn_scores_f64(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                        int64_t lo, int64_t hi, double *s);

/* s[j] <- e^(s[j] - m) for j < n; returns the sum.  m must not be -inf. */
/* The same, and chain[j] = d(final score) / d(scaled product) of key j
 * (the backward's chain rule through score_mod and softcap). */
void fa_attn_scores_chain_f32(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                              int64_t lo, int64_t hi, float *s, float *chain);
void fa_attn_scores_chain_f64(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                              int64_t lo, int64_t hi, double *s, double *chain);

float fa_attn_exp_sum_f32(float *s, int64_t n, float m);
double fa_attn_exp_sum_f64(double *s, int64_t n, double m);

/* One online-softmax step for `rows` score rows of n entries (row stride
 * ld): m[r] becomes max(m[r], max_j s), s becomes e^(s - m_new) (zero when
 * nothing is allowed yet), alpha[r] = e^(m_old - m_new) is the factor the
 * caller's running output must be rescaled by, and l[r] = l[r]*alpha + sum.
 * Start from m = -inf, l = 0.  A NaN score makes its row NaN for good. */
void fa_attn_online_f32(float *s, int64_t ld, int64_t rows, int64_t n, float *m, float *l, float *alpha);
void fa_attn_online_f64(double *s, int64_t ld, int64_t rows, int64_t n, double *m, double *l, double *alpha);

/* Where a tile's lse rows go: f32 (fa_attn_problem's lse), f64 (its
 * lse64: the reference's, and an opts.splits piece's), or nowhere
 * (both NULL). */
typedef struct {
  float *f32;
  double *f64;
} fa_lse_rows;

/* The problem's lse rows from element offset `at`. */
static inline fa_lse_rows fa_lse_rows_at(const fa_attn_problem *p, int64_t at) {
  fa_lse_rows r = {p->lse ? p->lse + at : NULL, p->lse64 ? p->lse64 + at : NULL};
  return r;
}

/* lse[r·ldl] = m[r] + log l[r], or -inf where l[r] == 0 (nothing
 * attended); ldl is the lse's row stride (opts.lse_out may be a view). */
void fa_attn_lse_f32(const float *m, const float *l, int64_t rows, fa_lse_rows lse, int64_t ldl);
void fa_attn_lse_f64(const double *m, const double *l, int64_t rows, fa_lse_rows lse, int64_t ldl);

/* Final step for `rows` output rows of dv entries (row stride ldo):
 * o /= l and lse = m + log l (lse may go nowhere; row stride ldl); a row with
 * l == 0 (no key attended) becomes zeros with lse = -inf. */
void fa_attn_finish_f32(float *o, int64_t ldo, int64_t rows, int64_t dv, const float *m, const float *l,
                        fa_lse_rows lse, int64_t ldl);
void fa_attn_finish_f64(double *o, int64_t ldo, int64_t rows, int64_t dv, const double *m, const double *l,
                        fa_lse_rows lse, int64_t ldl);

#endif
