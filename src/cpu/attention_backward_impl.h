/* Body of attention_backward.c's fast path for one compute type
 * (attention_instantiate.h includes it once per type).  No include guard
 * on purpose. */

#define FA_LANES 8

/* Independent partial sums let GCC vectorise without reassociating. */
static inline REAL FA_R(bw_dot)(const REAL *a, const REAL *b, int64_t n) {
  REAL lane[FA_LANES] = {0};
  int64_t e = 0;
  for (; e + FA_LANES <= n; e += FA_LANES)
    for (int l = 0; l < FA_LANES; l++) lane[l] += a[e + l] * b[e + l];
  REAL sum = 0;
  for (; e < n; e++) sum += a[e] * b[e];
  for (int l = 0; l < FA_LANES; l++) sum += lane[l];
  return sum;
}

static inline void FA_R(bw_axpy)(REAL *y, REAL a, const REAL *x, int64_t n) {
  for (int64_t e = 0; e < n; e++) y[e] += a * x[e];
}

/* One query row i of head h against keys j0..j0+n-1 (the row's allowed
 * range [lo, hi) meets them): recompute its scores and P from lse, then
 * dV += Pᵀ·dO, dS = P∘(dO·Vᵀ − delta), dK += dSᵀ·Q·scale', dQ += dS·K·scale'
 * (scale' = scale times softcap's 1 − tanh²).  s, raw: n entries each. */
static void FA_R(bw_row)(const fa_attn_backward *g, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                         int64_t lo, int64_t hi, REAL delta, REAL *s, REAL *raw) {
  const fa_attn_problem *p = g->p;
  const int64_t D = p->D, Dv = p->Dv, hk = h / (p->Hq / p->Hkv), row = (b * p->Hq + h) * p->Lq + i;
  const int64_t kv = (b * p->Hkv + hk) * p->Lk + j0;
  const REAL *q = (const REAL *)p->q + row * D, *k = (const REAL *)p->k + kv * D;
  const REAL *v = (const REAL *)p->v + kv * Dv, *dout = (const REAL *)g->dout + row * Dv;
  REAL *dq = (REAL *)g->dq + row * D, *dk = (REAL *)g->dk + kv * D, *dv = (REAL *)g->dv + kv * Dv;
  const REAL lse = ((const REAL *)g->lse)[row], scale = (REAL)p->scale, c = (REAL)p->softcap;
  for (int64_t j = 0; j < n; j++) s[j] = FA_R(bw_dot)(q, k + j * D, D);
  if (p->softcap > 0)
    for (int64_t j = 0; j < n; j++) raw[j] = FA_TANH(s[j] * scale / c); /* as fa_attn_scores rounds it */
  FA_R(fa_attn_scores)(p, b, h, i, j0, n, lo, hi, s);
  for (int64_t j = 0; j < n; j++) {
    if (s[j] == -(REAL)INFINITY) continue; /* masked: nothing flows */
    const REAL pij = FA_EXP(s[j] - lse);
    FA_R(bw_axpy)(dv + j * Dv, pij, dout, Dv);
    REAL ds = pij * (FA_R(bw_dot)(dout, v + j * Dv, Dv) - delta) * scale;
    if (p->softcap > 0) ds *= 1 - raw[j] * raw[j];
    FA_R(bw_axpy)(dk + j * D, ds, q, D);
    FA_R(bw_axpy)(dq, ds, k + j * D, D);
  }
}

/* The task of (b, hk): the dk, dv of that KV head and the dq rows of its
 * query heads, key tile by key tile.  scratch: G·Lq + 2·Bc entries. */
static void FA_R(bw_task)(const fa_attn_backward *g, int64_t b, int64_t hk, REAL *scratch) {
  const fa_attn_problem *p = g->p;
  const int64_t G = p->Hq / p->Hkv, Lq = p->Lq, Lk = p->Lk, Dv = p->Dv, bc = p->tile_k, h0 = hk * G;
  REAL *delta = scratch, *s = scratch + G * Lq, *raw = s + bc;
  const REAL *o = (const REAL *)g->o, *dout = (const REAL *)g->dout, *lse = (const REAL *)g->lse;
  for (int64_t r = 0; r < G * Lq; r++) { /* delta_i = rowsum(dO_i ∘ O_i) */
    const int64_t row = (b * p->Hq + h0) * Lq + r;
    delta[r] = FA_R(bw_dot)(dout + row * Dv, o + row * Dv, Dv);
  }
  for (int64_t j0 = 0; j0 < Lk; j0 += bc) {
    const int64_t n = Lk - j0 < bc ? Lk - j0 : bc;
    for (int64_t h = h0; h < h0 + G; h++)
      for (int64_t i = 0; i < Lq; i++) {
        int64_t lo, hi;
        fa_attn_range_of(p, b, i, &lo, &hi);
        if (hi <= j0 || lo >= j0 + n || lse[(b * p->Hq + h) * Lq + i] == -(REAL)INFINITY) continue;
        FA_R(bw_row)(g, b, h, i, j0, n, lo, hi, delta[(h - h0) * Lq + i], s, raw);
      }
  }
}

static fa_status FA_R(bw_run)(fa_context *ctx, const fa_attn_backward *g) {
  const fa_attn_problem *p = g->p;
  const int64_t tasks = p->B * p->Hkv;
  int threads = omp_get_max_threads();
  if (tasks < threads) threads = tasks > 0 ? (int)tasks : 1;
  const double per = (double)(p->Hq / p->Hkv) * (double)p->Lq + 2.0 * (double)p->tile_k;
  if (per * (double)threads * sizeof(REAL) > (double)SIZE_MAX / 2)
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: attention_backward: Lq = %lld is too large",
                   (long long)p->Lq);
  const size_t each = (size_t)per, bytes = each * (size_t)threads * sizeof(REAL);
  fa_status st = FA_OK;
  REAL *scratch = fa_host_alloc(ctx, bytes ? bytes : 1, &st);
  if (!scratch) return st;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; t++)
    FA_R(bw_task)(g, t / p->Hkv, t % p->Hkv, scratch + (size_t)omp_get_thread_num() * each);
  fa_host_free(scratch, bytes ? bytes : 1);
  return FA_OK;
}

#undef FA_LANES
