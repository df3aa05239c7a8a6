/* Body of attention_backward.c's fast path for one compute type
 * (attention_instantiate.h includes it once per type).  No include guard
 * on purpose. */

#include "cpu/all_finite_impl.h"

#define FA_LANES 8

#ifndef BW_SHARE_KV
#define BW_SHARE_KV 1 /* bw_tile's shares: dV and dK */
#define BW_SHARE_Q 2  /* dQ */
#endif

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

/* c += Σ_r w[r][j] · x[r] over the r of w's m rows whose weight is not 0
 * (w: m × n, rows n apart; x: m rows of len, ldx apart; c: n rows of len),
 * or with trans the transpose: c[r] += Σ_j w[r][j] · x[j] (x: n rows).  The products of
 * bw_tile when an operand of the call holds NaN or inf: a weight of 0 (a
 * masked key, a row that takes none) then passes nothing, as in the
 * reference, where the tile product's 0 · NaN would be NaN. */
static void FA_R(bw_skip_zeros)(int trans, int64_t m, int64_t n, int64_t len, const REAL *w, const REAL *x, int64_t ldx,
                                REAL *c) {
  for (int64_t r = 0; r < m; r++)
    for (int64_t j = 0; j < n; j++) {
      const REAL a = w[r * n + j];
      if (a == 0) continue;
      const REAL *src = trans ? x + j * ldx : x + r * ldx;
      REAL *dst = trans ? c + r * len : c + j * len;
      for (int64_t e = 0; e < len; e++) dst[e] += a * src[e];
    }
}

/* A thread's scratch: delta (G·Lq: the task's rows), sp, dp, th (Br·Bc
 * each); and where p->storage is another dtype than REAL (stage.h), room
 * for a query tile's q and dout rows (Br·D, Br·Dv) and a key tile's keys and
 * values (Bc·D, Bc·Dv) widened, and one row each of o and dout (Dv); those
 * are NULL otherwise. */
typedef struct {
  REAL *delta, *sp, *dp, *th;
  REAL *qs, *dos, *ks, *vs, *o1, *d1;
} FA_R(bw_ws);

/* Entries of a thread's scratch (bw_ws), as a double (checked against
 * size_t's range by the caller). */
static double FA_R(bw_ws_entries)(const fa_attn_problem *p) {
  const double br = (double)p->tile_q, bc = (double)p->tile_k, dd = (double)(p->D + p->Dv);
  double n = (double)(p->Hq / p->Hkv) * (double)p->Lq + 3.0 * br * bc;
  if (p->storage != p->compute) n += (br + bc) * dd + 2.0 * (double)p->Dv;
  return n;
}

static FA_R(bw_ws) FA_R(bw_ws_carve)(const fa_attn_problem *p, REAL *at) {
  const int64_t br = p->tile_q, bc = p->tile_k, D = p->D, Dv = p->Dv;
  FA_R(bw_ws) w = {0};
  w.delta = at, at += p->Hq / p->Hkv * p->Lq;
  w.sp = at, at += br * bc;
  w.dp = at, at += br * bc;
  w.th = at, at += br * bc;
  if (p->storage != p->compute) {
    w.qs = at, at += br * D;
    w.dos = at, at += br * Dv;
    w.ks = at, at += bc * D;
    w.vs = at, at += bc * Dv;
    w.o1 = at, at += Dv;
    w.d1 = at;
  }
  return w;
}

/* Rows r0..r0+rows-1 (of `width` elements) of head h of batch b of an
 * operand at st (dtype p->storage) as REAL rows *ld apart: where they lie,
 * or widened into buf. */
static const REAL *FA_R(bw_rows)(const fa_attn_problem *p, const void *base, fa_attn_strides st, int64_t b, int64_t h,
                                 int64_t r0, int64_t rows, int64_t width, REAL *buf, int64_t *ld) {
  const void *at = fa_cpu_elem(base, p->storage, b * st.b + h * st.h + r0 * st.s);
  if (!buf) {
    *ld = st.s;
    return at;
  }
  fa_cpu_stage_rows(p->compute, buf, width, p->storage, at, st.s, rows, width);
  *ld = width;
  return buf;
}

/* Query rows i0..i0+m-1 of head h against keys j0..j0+n-1 (k, v: the key
 * tile's rows, ldk and ldv apart, bw_task's): recompute
 * S = Q·Kᵀ and P = e^(s − lse) (the forward's own score routine), then
 * dV += Pᵀ·dO, dS = P∘(dO·Vᵀ − delta)·scale' (scale' = scale times
 * softcap's 1 − tanh²), dK += dSᵀ·Q, dQ += dS·K, the products by BLAS.
 * w's sp, dp, th: m·n entries each.  Returns without work when no row of the
 * tile may attend to these keys.  skip_zeros: the products skip zero
 * weights (bw_skip_zeros; the call's q, k or dout hold NaN or inf).  what:
 * the shares it adds, BW_SHARE_KV (dV, dK), BW_SHARE_Q (dQ) or both; each share's
 * products are the same whichever others are asked. */
FA_CPU_CLONES
static void FA_R(bw_tile)(const fa_attn_backward *g, int64_t b, int64_t h, int64_t i0, int64_t m, int64_t j0,
                          int64_t n, const REAL *delta, const FA_R(bw_ws) *w, const REAL *k, int64_t ldk,
                          const REAL *v, int64_t ldv, int skip_zeros, int what) {
  const fa_attn_problem *p = g->p;
  const int64_t D = p->D, Dv = p->Dv, hk = h / (p->Hq / p->Hkv), row0 = (b * p->Hq + h) * p->Lq + i0;
  const int64_t kv = (b * p->Hkv + hk) * p->Lk + j0; /* the dense outputs' rows (and lse's) */
  REAL *sp = w->sp, *dp = w->dp, *th = w->th;
  const REAL *lse = (const REAL *)g->lse + row0;
  REAL *dq = (REAL *)g->dq + row0 * D, *dk = (REAL *)g->dk + kv * D, *dv = (REAL *)g->dv + kv * Dv;
  const REAL scale = (REAL)p->scale;
  int any = 0;
  for (int64_t r = 0; r < m && !any; r++) {
    int64_t lo, hi;
    fa_attn_range_of(p, b, i0 + r, &lo, &hi);
    any = hi > j0 && lo < j0 + n && lse[r] != -(REAL)INFINITY;
  }
  if (!any) return;
  /* mask_mod decided for the whole tile where it can tell (fa_expr_tile):
   * nothing flows from an empty tile, a full one needs no mask_mod */
  fa_attn_problem full;
  const fa_attn_problem *use = p;
  if (p->mask_mod) {
    const int whole = fa_expr_tile(p->mask_mod, b, h, i0, i0 + m - 1, j0, j0 + n - 1);
    if (whole == FA_BLOCK_EMPTY) return;
    if (whole == FA_BLOCK_FULL) full = *p, full.mask_mod = NULL, use = &full;
  }
  int64_t ldq, ldd; /* the operands' strides (API §6), or the staged rows' */
  const REAL *q = FA_R(bw_rows)(p, p->q, p->q_st, b, h, i0, m, D, w->qs, &ldq);
  const REAL *dout = FA_R(bw_rows)(p, g->dout, g->dout_st, b, h, i0, m, Dv, w->dos, &ldd);
  FA_R(bw_gemm)(0, 1, m, n, D, q, ldq, k, ldk, 0, sp, n);       /* S = Q·Kᵀ */
  FA_R(bw_gemm)(0, 1, m, n, Dv, dout, ldd, v, ldv, 0, dp, n); /* dP = dO·Vᵀ */
  for (int64_t r = 0; r < m; r++) {
    REAL *s = sp + r * n, *d = dp + r * n, *t = th + r * n;
    int64_t lo, hi;
    fa_attn_range_of(p, b, i0 + r, &lo, &hi);
    if (hi <= j0 || lo >= j0 + n || lse[r] == -(REAL)INFINITY) { /* nothing flows from this row */
      memset(s, 0, (size_t)n * sizeof *s);
      memset(d, 0, (size_t)n * sizeof *d);
      continue;
    }
    FA_R(fa_attn_scores_chain)(use, b, h, i0 + r, j0, n, lo, hi, s, t); /* t: the rule's derivative */
    const REAL l = lse[r], dl = delta[r];
    /* no branch, so that the loop vectorises; t keeps the score */
    for (int64_t j = 0; j < n; j++) {
      const REAL x = s[j], pj = FA_EXP(x - l);
      d[j] = pj * (d[j] - dl) * scale * t[j];
      s[j] = pj, t[j] = x;
    }
    /* a masked pair (score -inf, also where lse is NaN) or a weight of 0 (underflowed) passes nothing,
     * also where dP or the derivative is not finite */
    for (int64_t j = 0; j < n; j++)
      if (t[j] == -(REAL)INFINITY || s[j] == 0) s[j] = d[j] = 0;
  }
  if (!skip_zeros) {
    if (what & BW_SHARE_KV) {
      FA_R(bw_gemm)(1, 0, n, Dv, m, sp, n, dout, ldd, 1, dv, Dv); /* dV += Pᵀ·dO */
      FA_R(bw_gemm)(1, 0, n, D, m, dp, n, q, ldq, 1, dk, D);       /* dK += dSᵀ·Q */
    }
    if (what & BW_SHARE_Q) FA_R(bw_gemm)(0, 0, m, D, n, dp, n, k, ldk, 1, dq, D); /* dQ += dS·K */
    return;
  }
  if (what & BW_SHARE_KV) {
    FA_R(bw_skip_zeros)(0, m, n, Dv, sp, dout, ldd, dv);
    FA_R(bw_skip_zeros)(0, m, n, D, dp, q, ldq, dk);
  }
  if (what & BW_SHARE_Q) FA_R(bw_skip_zeros)(1, m, n, D, dp, k, ldk, dq);
}

/* The gradients' rows a thread owns are zeroed by it before it adds into
 * them (first touched there, not by one thread for all): bw_task's dq
 * rows, bw_key_tile's dk and dv rows, bw_query_tile's dq rows. */
static inline void FA_R(bw_zero)(REAL *x, int64_t n) { memset(x, 0, (size_t)n * sizeof *x); }

/* delta_i = rowsum(dO_i ∘ O_i) for the rows of heads h0..h0+heads-1 of
 * batch b, into delta (heads·Lq entries). */
static void FA_R(bw_delta)(const fa_attn_backward *g, int64_t b, int64_t h0, int64_t heads, const FA_R(bw_ws) *w,
                           REAL *delta) {
  const fa_attn_problem *p = g->p;
  const int64_t Lq = p->Lq, Dv = p->Dv;
  for (int64_t r = 0; r < heads * Lq; r++) {
    const int64_t h = h0 + r / Lq, i = r % Lq;
    int64_t ld; /* one row: its stride is not needed */
    const REAL *d1 = FA_R(bw_rows)(p, g->dout, g->dout_st, b, h, i, 1, Dv, w->d1, &ld);
    const REAL *o1 = FA_R(bw_rows)(p, g->o, p->o_st, b, h, i, 1, Dv, w->o1, &ld);
    delta[r] = FA_R(bw_dot)(d1, o1, Dv);
  }
}

/* Key tile j0 of KV head hk of batch b against every query tile of the
 * query heads that share it (delta: their G·Lq rows), adding the shares
 * `what` (bw_tile); its keys and values staged once for all of them.  With
 * BW_SHARE_KV it owns the tile's dk, dv rows and zeroes them first. */
static void FA_R(bw_key_tile)(const fa_attn_backward *g, int64_t b, int64_t hk, int64_t j0, const REAL *delta,
                              const FA_R(bw_ws) *w, int skip_zeros, int what) {
  const fa_attn_problem *p = g->p;
  const int64_t G = p->Hq / p->Hkv, Lq = p->Lq, br = p->tile_q, h0 = hk * G;
  const int64_t n = p->Lk - j0 < p->tile_k ? p->Lk - j0 : p->tile_k, kv0 = (b * p->Hkv + hk) * p->Lk + j0;
  if (what & BW_SHARE_KV) {
    FA_R(bw_zero)((REAL *)g->dk + kv0 * p->D, n * p->D);
    FA_R(bw_zero)((REAL *)g->dv + kv0 * p->Dv, n * p->Dv);
  }
  int64_t ldk, ldv;
  const REAL *k = FA_R(bw_rows)(p, p->k, p->k_st, b, hk, j0, n, p->D, w->ks, &ldk);
  const REAL *v = FA_R(bw_rows)(p, p->v, p->v_st, b, hk, j0, n, p->Dv, w->vs, &ldv);
  for (int64_t h = h0; h < h0 + G; h++)
    for (int64_t i0 = 0; i0 < Lq; i0 += br)
      FA_R(bw_tile)(g, b, h, i0, Lq - i0 < br ? Lq - i0 : br, j0, n, delta + (h - h0) * Lq + i0, w, k, ldk, v, ldv,
                    skip_zeros, what);
}

/* The task of (b, hk): the dk, dv of that KV head and the dq rows of its
 * query heads, key tile by key tile. */
static void FA_R(bw_task)(const fa_attn_backward *g, int64_t b, int64_t hk, const FA_R(bw_ws) *w, int skip_zeros) {
  const fa_attn_problem *p = g->p;
  const int64_t G = p->Hq / p->Hkv, row0 = (b * p->Hq + hk * G) * p->Lq;
  FA_R(bw_zero)((REAL *)g->dq + row0 * p->D, G * p->Lq * p->D); /* its query heads' dq rows */
  FA_R(bw_delta)(g, b, hk * G, G, w, w->delta);
  for (int64_t j0 = 0; j0 < p->Lk; j0 += p->tile_k)
    FA_R(bw_key_tile)(g, b, hk, j0, w->delta, w, skip_zeros, BW_SHARE_Q | BW_SHARE_KV);
}

/* dQ of query tile i0 of head h of batch b (delta: its rows; its dq rows
 * zeroed first), key tile by key tile in the order bw_task takes them, so
 * with the same bits. */
static void FA_R(bw_query_tile)(const fa_attn_backward *g, int64_t b, int64_t h, int64_t i0, const REAL *delta,
                                const FA_R(bw_ws) *w, int skip_zeros) {
  const fa_attn_problem *p = g->p;
  const int64_t m = p->Lq - i0 < p->tile_q ? p->Lq - i0 : p->tile_q, hk = h / (p->Hq / p->Hkv);
  FA_R(bw_zero)((REAL *)g->dq + ((b * p->Hq + h) * p->Lq + i0) * p->D, m * p->D);
  for (int64_t j0 = 0; j0 < p->Lk; j0 += p->tile_k) {
    const int64_t n = p->Lk - j0 < p->tile_k ? p->Lk - j0 : p->tile_k;
    int64_t ldk, ldv;
    const REAL *k = FA_R(bw_rows)(p, p->k, p->k_st, b, hk, j0, n, p->D, w->ks, &ldk);
    const REAL *v = FA_R(bw_rows)(p, p->v, p->v_st, b, hk, j0, n, p->Dv, w->vs, &ldv);
    FA_R(bw_tile)(g, b, h, i0, m, j0, n, delta, w, k, ldk, v, ldv, skip_zeros, BW_SHARE_Q);
  }
}

/* Whether the B·H·L rows of X elements at st from base (dtype
 * p->storage) are all finite (one pass where they are dense). */
static int FA_R(bw_run_finite)(const fa_attn_problem *p, const void *x, int64_t n) {
  return p->storage == p->compute ? FA_R(all_finite)(x, n) : fa_cpu_all_finite(p->storage, x, n);
}
static int FA_R(bw_rows_finite)(const fa_attn_problem *p, const void *base, fa_attn_strides st, int64_t B, int64_t H,
                                int64_t L, int64_t X) {
  if (st.s == X && (H == 1 || st.h == L * X) && (B == 1 || st.b == H * L * X))
    return FA_R(bw_run_finite)(p, base, B * H * L * X);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < L; i++)
        if (!FA_R(bw_run_finite)(p, fa_cpu_elem(base, p->storage, b * st.b + h * st.h + i * st.s), X)) return 0;
  return 1;
}

/* Where the (batch, KV head) tasks leave threads idle (fewer than 5/8 of
 * them: a few heads), two passes instead: dK and dV a key tile at a time,
 * then dQ a query tile at a time, each recomputing its tiles' S and dP (7
 * products a tile pair instead of 5, spread over more threads).  Every
 * element is summed by one thread in the order of bw_task, so the bits are
 * the same whichever schedule runs. */
static fa_status FA_R(bw_run)(fa_context *ctx, const fa_attn_backward *g) {
  const fa_attn_problem *p = g->p;
  const int64_t tasks = p->B * p->Hkv, G = p->Hq / p->Hkv;
  const int64_t key_items = tasks * ((p->Lk + p->tile_k - 1) / p->tile_k);
  const int64_t query_items = p->B * p->Hq * ((p->Lq + p->tile_q - 1) / p->tile_q);
  const double flops = 2.5 * fa_attn_flops(p); /* the backward: 2.5 forwards */
  /* the second pass's products and staging cost 1.3-1.8x the one pass's time, measured (2 cores) */
  const int two = 8 * tasks < 5 * fa_cpu_threads_for(INT64_MAX, flops) && key_items > tasks;
  const int threads = fa_cpu_threads_for(two ? (key_items > query_items ? key_items : query_items) : tasks, flops);
  const double per = FA_R(bw_ws_entries)(p);
  const double rows = two ? (double)p->B * (double)p->Hq * (double)p->Lq : 0;
  if ((per * (double)threads + rows) * sizeof(REAL) > (double)SIZE_MAX / 2)
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: attention_backward: Lq = %lld is too large",
                   (long long)p->Lq);
  const size_t each = (size_t)per, bytes = (each * (size_t)threads + (size_t)rows) * sizeof(REAL);
  fa_status st = FA_OK;
  REAL *scratch = fa_host_alloc(ctx, bytes ? bytes : 1, &st);
  if (!scratch) return st;
  REAL *delta = scratch + each * (size_t)threads; /* two passes: every row's, (B, Hq, Lq) */
  /* one pass over the operands a call, not one a tile pair */
  const int skip_zeros = !(FA_R(bw_rows_finite)(p, p->q, p->q_st, p->B, p->Hq, p->Lq, p->D) &&
                           FA_R(bw_rows_finite)(p, p->k, p->k_st, p->B, p->Hkv, p->Lk, p->D) &&
                           FA_R(bw_rows_finite)(p, g->dout, g->dout_st, p->B, p->Hq, p->Lq, p->Dv));
#pragma omp parallel num_threads(threads)
  {
    const FA_R(bw_ws) w = FA_R(bw_ws_carve)(p, scratch + (size_t)omp_get_thread_num() * each);
    if (!two) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < tasks; t++) FA_R(bw_task)(g, t / p->Hkv, t % p->Hkv, &w, skip_zeros);
    } else {
      const int64_t ktiles = key_items / tasks, qtiles = query_items / (p->B * p->Hq);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < tasks; t++) FA_R(bw_delta)(g, t / p->Hkv, t % p->Hkv * G, G, &w, delta + t * G * p->Lq);
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < key_items; it++) {
        const int64_t t = it / ktiles;
        FA_R(bw_key_tile)(g, t / p->Hkv, t % p->Hkv, it % ktiles * p->tile_k, delta + t * G * p->Lq, &w, skip_zeros,
                          BW_SHARE_KV);
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < query_items; it++) {
        const int64_t bh = it / qtiles, i0 = it % qtiles * p->tile_q;
        FA_R(bw_query_tile)(g, bh / p->Hq, bh % p->Hq, i0, delta + bh * p->Lq + i0, &w, skip_zeros);
      }
    }
  }
  fa_host_free(scratch, bytes ? bytes : 1);
  return FA_OK;
}

#undef FA_LANES
