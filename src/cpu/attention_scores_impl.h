/* Body of attention_scores.c for one compute type (attention_instantiate.h
 * includes it once per type).  No include guard on purpose.
 * FA_CPU_CLONES (fast_exp.h) builds the per-score loops for AVX-512, AVX2
 * and the baseline, picked at load time. */

/* Independent partial sums let GCC vectorise the sum without reassociating
 * floating point (which it may not do at -O3). */
#define FA_LANES 16

/* Element `at` of the float mask: of the compute dtype, or f16/bf16 read
 * where it lies (fa_attn_cpu_mask). */
static inline REAL FA_R(mask_value)(const fa_attn_problem *p, int64_t at) {
  if (p->mask_dtype == p->compute) return ((const REAL *)p->mask_f)[at];
  return (REAL)fa_cpu_half_value(p->mask_dtype, ((const uint16_t *)p->mask_f)[at]);
}

/* fa_attn_scores with a variant (API §9), in chunks of keys: a key is
 * masked (-inf) outside [lo, hi), where the bool mask is false and where
 * mask_mod is false; the others get the scale, score_mod, then softcap,
 * alibi and the float mask as below.  The expressions are evaluated for a
 * whole chunk (src/expr.h: fa_expr_eval_row), but only the keys the row
 * attends can fault: mask_mod's for the keys the rest leaves, score_mod's
 * for the keys mask_mod leaves too, as in the reference. */
static void FA_R(variant_scores)(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                                 int64_t lo, int64_t hi, REAL *s, REAL *chain) {
  enum { CHUNK = 64 };
  const REAL scale = (REAL)p->scale, c = (REAL)p->softcap;
  const int64_t *ms = p->mask_strides;
  const int64_t mrow = b * ms[0] + h * ms[1] + i * ms[2] + j0 * ms[3];
  const int64_t diag = i + p->Lk - p->Lq - j0;
  double x[CHUNK], keep[CHUNK], dx[CHUNK];
  uint8_t act[CHUNK];
  for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
    const int64_t m = n - c0 < CHUNK ? n - c0 : CHUNK;
    for (int64_t u = 0; u < m; u++) {
      const int64_t j = c0 + u, key = j0 + j;
      act[u] = key >= lo && key < hi && (!p->mask_b || p->mask_b[mrow + j * ms[3]]);
      x[u] = (double)(s[j] * scale);
    }
    if (p->mask_mod) {
      fa_expr_eval_row(p->mask_mod, NULL, b, h, i, p->key_base + j0 + c0, m, act, keep);
      for (int64_t u = 0; u < m; u++) act[u] = act[u] && keep[u] != 0; /* NaN (a fault) attends */
    }
    const int64_t k0 = p->key_base + j0 + c0; /* the variants' k: the whole call's numbering */
    if (p->score_mod && chain) fa_expr_eval_row_grad(p->score_mod, x, b, h, i, k0, m, act, x, dx);
    else if (p->score_mod) fa_expr_eval_row(p->score_mod, x, b, h, i, k0, m, act, x);
    for (int64_t u = 0; u < m; u++) {
      const int64_t j = c0 + u;
      if (chain) chain[j] = p->score_mod ? (REAL)dx[u] : 1;
      if (!act[u]) {
        s[j] = -(REAL)INFINITY;
        continue;
      }
      REAL y = (REAL)x[u];
      if (p->softcap > 0) {
        const REAL th = FA_TANH(y / c);
        y = c * th;
        if (chain) chain[j] *= 1 - th * th;
      }
      if (p->alibi) y -= (REAL)(p->alibi[h] * (double)(diag > j ? diag - j : j - diag));
      if (p->mask_f) y += FA_R(mask_value)(p, mrow + j * ms[3]);
      s[j] = y;
    }
  }
}

FA_CPU_CLONES
static void FA_R(scores_cloned)(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                                int64_t lo, int64_t hi, REAL *s) {
  if (p->score_mod || p->mask_mod) {
    FA_R(variant_scores)(p, b, h, i, j0, n, lo, hi, s, NULL);
    return;
  }
  const REAL scale = (REAL)p->scale;
  for (int64_t j = 0; j < n; j++) s[j] *= scale;
  if (p->softcap > 0) { /* fitted to f32 when REAL is (resolve_options) */
    const REAL c = (REAL)p->softcap;
    for (int64_t j = 0; j < n; j++) s[j] = c * FA_TANH(s[j] / c);
  }
  if (p->alibi) {
    const double slope = p->alibi[h];
    const int64_t diag = i + p->Lk - p->Lq - j0; /* distance = |diag - j| */
    for (int64_t j = 0; j < n; j++) {
      const int64_t d = diag > j ? diag - j : j - diag;
      s[j] -= (REAL)(slope * (double)d);
    }
  }
  const int64_t *ms = p->mask_strides;
  const int64_t mrow = b * ms[0] + h * ms[1] + i * ms[2] + j0 * ms[3];
  if (p->mask_f && p->mask_dtype != p->compute) { /* an f16/bf16 mask read where it lies */
    const uint16_t *mh = (const uint16_t *)p->mask_f + mrow;
    for (int64_t j = 0; j < n; j++) s[j] += (REAL)fa_cpu_half_value(p->mask_dtype, mh[j * ms[3]]);
  } else if (p->mask_f) {
    const REAL *mf = (const REAL *)p->mask_f + mrow;
    for (int64_t j = 0; j < n; j++) s[j] += mf[j * ms[3]];
  }
  /* Disallowed scores are replaced, not added to, so a NaN there is dropped. */
  int64_t a = lo - j0, e = hi - j0;
  a = a < 0 ? 0 : (a > n ? n : a);
  e = e < a ? a : (e > n ? n : e);
  for (int64_t j = 0; j < a; j++) s[j] = -(REAL)INFINITY;
  for (int64_t j = e; j < n; j++) s[j] = -(REAL)INFINITY;
  if (p->mask_b) {
    const uint8_t *mb = p->mask_b + mrow;
    for (int64_t j = a; j < e; j++)
      if (!mb[j * ms[3]]) s[j] = -(REAL)INFINITY;
  }
}

static inline REAL FA_R(exp_sum)(REAL *s, int64_t n, REAL m) {
  for (int64_t j = 0; j < n; j++) s[j] = FA_EXP(s[j] - m);
  REAL lane[FA_LANES] = {0};
  int64_t j = 0;
  for (; j + FA_LANES <= n; j += FA_LANES)
    for (int k = 0; k < FA_LANES; k++) lane[k] += s[j + k];
  REAL sum = 0;
  for (; j < n; j++) sum += s[j];
  for (int k = 0; k < FA_LANES; k++) sum += lane[k];
  return sum;
}

FA_CPU_CLONES
static REAL FA_R(exp_sum_cloned)(REAL *s, int64_t n, REAL m) { return FA_R(exp_sum)(s, n, m); }

FA_CPU_CLONES
static void FA_R(online_cloned)(REAL *s, int64_t ld, int64_t rows, int64_t n, REAL *m, REAL *l, REAL *alpha) {
  for (int64_t r = 0; r < rows; r++) {
    REAL *row = s + r * ld;
    const REAL mt = FA_R(row_max)(row, n), m_old = m[r];
    REAL m_new = mt > m_old ? mt : m_old;
    if (mt != mt) m_new = mt; /* NaN sticks to its row */
    if (m_old != m_old) m_new = m_old;
    if (m_new == -(REAL)INFINITY) { /* nothing attended yet: e^(-inf - -inf) would be NaN */
      memset(row, 0, (size_t)n * sizeof *row);
      alpha[r] = 1;
      continue;
    }
    const REAL sum = FA_R(exp_sum)(row, n, m_new);
    const REAL a = FA_EXP(m_old - m_new); /* 0 when m_old = -inf, 1 when unchanged */
    alpha[r] = a;
    l[r] = l[r] * a + sum;
    m[r] = m_new;
  }
}

/* The entry points: plain functions (hidden by -fvisibility=hidden, which
 * GCC does not apply to a clone's ifunc and resolvers) over the clones. */
void FA_R(fa_attn_scores)(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                          int64_t lo, int64_t hi, REAL *s) {
  FA_R(scores_cloned)(p, b, h, i, j0, n, lo, hi, s);
}
REAL FA_R(fa_attn_exp_sum)(REAL *s, int64_t n, REAL m) { return FA_R(exp_sum_cloned)(s, n, m); }
void FA_R(fa_attn_online)(REAL *s, int64_t ld, int64_t rows, int64_t n, REAL *m, REAL *l, REAL *alpha) {
  FA_R(online_cloned)(s, ld, rows, n, m, l, alpha);
}

void FA_R(fa_attn_lse)(const REAL *m, const REAL *l, int64_t rows, fa_lse_rows lse, int64_t ldl) {
  for (int64_t r = 0; r < rows; r++) {
    /* f64 (the reference's, a split piece's for the merge): m + log l in f64, not rounded to f32 at |m| */
    if (lse.f32) lse.f32[r * ldl] = l[r] == 0 ? -INFINITY : (float)(m[r] + FA_LOG(l[r]));
    if (lse.f64) lse.f64[r * ldl] = l[r] == 0 ? -INFINITY : (double)m[r] + log((double)l[r]);
  }
}

void FA_R(fa_attn_finish)(REAL *o, int64_t ldo, int64_t rows, int64_t dv, const REAL *m, const REAL *l,
                          fa_lse_rows lse, int64_t ldl) {
  for (int64_t r = 0; r < rows; r++) {
    REAL *orow = o + r * ldo;
    if (l[r] == 0) { /* no key attended */
      memset(orow, 0, (size_t)dv * sizeof *orow);
      continue;
    }
    const REAL inv = 1 / l[r];
    for (int64_t d = 0; d < dv; d++) orow[d] *= inv;
  }
  FA_R(fa_attn_lse)(m, l, rows, lse, ldl);
}

#undef FA_LANES

/* fa_attn_scores, and in chain[j] the derivative of key j's final score by
 * its scaled product (the backward's chain rule): score_mod's derivative
 * times softcap's 1 - tanh², 1 without either. */
void FA_R(fa_attn_scores_chain)(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                                int64_t lo, int64_t hi, REAL *s, REAL *chain) {
  if (p->score_mod || p->mask_mod) {
    FA_R(variant_scores)(p, b, h, i, j0, n, lo, hi, s, chain);
    return;
  }
  const REAL scale = (REAL)p->scale, c = (REAL)p->softcap;
  for (int64_t j = 0; j < n; j++) chain[j] = 1;
  if (p->softcap > 0)
    for (int64_t j = 0; j < n; j++) {
      const REAL th = FA_TANH(s[j] * scale / c); /* as fa_attn_scores rounds it */
      chain[j] = 1 - th * th;
    }
  FA_R(fa_attn_scores)(p, b, h, i, j0, n, lo, hi, s);
}
