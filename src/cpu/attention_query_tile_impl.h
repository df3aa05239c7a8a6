/* What flash, two_pass and naive share, for one compute type: a work item
 * is a query tile (Br = tile_q rows of one batch and head, or, packed, the
 * few query rows of every head that shares a key head: qtile_packs); each
 * thread owns a workspace of the tile's size; key tiles of Bc = tile_k keys
 * cover only the union of the rows' key ranges.  Included by their
 * _impl.h. */

#include "cpu/all_finite_impl.h"
#include "cpu/attention_tiles.h"

typedef struct {
  REAL *s;              /* Br x Bc: scores, then probabilities */
  REAL *m, *l, *alpha;  /* per row: running max, denominator, rescale factor */
  int64_t *lo, *hi;     /* per row: key range */
  /* operands of another dtype (p->storage, stage.h): the tile's query rows
   * (Br x D), the key tile's keys (Bc x D) and values (Bc x Dv) widened;
   * NULL when p->storage is REAL (the query rows also staged for packed
   * tiles, the keys and values, page by page, when they lie in a paged
   * cache: p->pages).  The running output rows (Br x Dv) when p->o_dtype is
   * another or the tiles are packed; else NULL */
  REAL *qs, *ks, *vs, *os;
} FA_R(qtile_ws);

/* The operands' rows lie p->q_st.s, p->k_st.s, ... elements apart (they
 * may be views of the caller's tensors): the gemms take these as their
 * leading dimensions; the workspace's staged rows are dense. */
typedef struct {
  /* rows: heads·per_head, row r being query i0 + r % per_head of head h + r / per_head (one head unless packed) */
  int64_t b, h, i0, rows, per_head;
  int64_t ulo, uhi; /* union of the rows' key ranges (ulo >= uhi: none) */
  const REAL *q;    /* the tile's first query row (in place, or staged), rows ldq apart */
  int64_t ldq;
  const void *k, *v; /* the head's keys, values where they lie (dtype p->storage) */
  REAL *o;           /* the tile's running output (in place, or staged), rows ldo apart */
  int64_t ldo;
  void *out;         /* where head h's output rows lie: o itself unless staged */
  fa_lse_rows lse;   /* head h's first lse entries */
} FA_R(qtile);

typedef void (*FA_R(qtile_fn))(const fa_attn_problem *p, const FA_R(qtile) *t, const FA_R(qtile_ws) *w);

static inline int FA_R(qtile_staged)(const fa_attn_problem *p) { return p->storage != p->compute; }
static inline int FA_R(qtile_staged_kv)(const fa_attn_problem *p) { return FA_R(qtile_staged)(p) || p->pages; }
/* Whether "auto" may cut the call's keys into chunks (qtile_chunks): a
 * call of one query tile a head (decoding; longer queries have tiles to
 * share out) and keys long enough. */
static inline int FA_R(qtile_may_split)(const fa_attn_problem *p) {
  return p->key_chunks == 0 && p->Lq <= p->tile_q && p->Lk >= 2 * FA_CPU_SPLIT_MIN_KEYS;
}
/* GQA packing: the query heads that share a key head in one tile (its keys
 * and values then read once for all of them, as a gemm of all their rows),
 * for calls whose query rows of all of them fit a default tile (decoding),
 * without the rules that decide per tile (mask_mod's and a block mask's
 * empty and full tiles are a head's) or a tile the caller named (opts.tile:
 * its Br rows of one head, as asked).  Where the key heads are fewer than
 * the threads, only if key chunks give the threads work or the rows are
 * too few to hide the reads packing saves (FA_CPU_PACK_ANY_ROWS; one
 * thread packing 8 heads at Lq 1 took a quarter of the time of two threads
 * a head each).  The heads a tile packs: Hq / Hkv, or 1. */
static inline int64_t FA_R(qtile_packs)(const fa_attn_problem *p) {
  const int64_t g = p->Hkv > 0 ? p->Hq / p->Hkv : 1;
  if (g <= 1 || p->Lq > FA_CPU_DEFAULT_TILE_Q / g || p->mask_mod || p->block_mask || p->tile_given) return 1;
  if (p->B * p->Hkv < omp_get_max_threads() && p->Lq > FA_CPU_PACK_ANY_ROWS && !FA_R(qtile_may_split)(p)) return 1;
  return g;
}
/* What follows takes the call's qtile_packs, decided once before the
 * threads start (a decision that read the thread count inside a thread,
 * with a nested count, once carved a workspace larger than allocated). */
/* The rows a tile holds: tile_q (fitted to Lq), or a packed tile's. */
static inline int64_t FA_R(qtile_rows_max)(const fa_attn_problem *p, int64_t heads) {
  return heads > 1 ? heads * p->Lq : p->tile_q;
}
static inline int FA_R(qtile_staged_q)(const fa_attn_problem *p, int64_t heads) {
  return FA_R(qtile_staged)(p) || heads > 1;
}
static inline int FA_R(qtile_staged_out)(const fa_attn_problem *p, int64_t heads) {
  return p->o_dtype != p->compute || heads > 1;
}

/* 0 when it does not fit a size_t (naive's tiles are whole heads). */
static size_t FA_R(qtile_ws_bytes)(const fa_attn_problem *p, int64_t heads) {
  const size_t br = (size_t)FA_R(qtile_rows_max)(p, heads), bc = (size_t)p->tile_k;
  if (bc > SIZE_MAX / 4 / sizeof(REAL) / br) return 0;
  size_t bytes = fa_attn_bytes(br * bc, sizeof(REAL)) + 3 * fa_attn_bytes(br, sizeof(REAL)) +
                 2 * fa_attn_bytes(br, sizeof(int64_t));
  const double staged = ((double)br + (double)bc) * (double)(p->D + p->Dv) * sizeof(REAL) + 4 * 64;
  if ((FA_R(qtile_staged_q)(p, heads) || FA_R(qtile_staged_kv)(p) || FA_R(qtile_staged_out)(p, heads)) &&
      staged > (double)(SIZE_MAX / 4))
    return 0;
  if (FA_R(qtile_staged_q)(p, heads)) bytes += fa_attn_bytes(br * (size_t)p->D, sizeof(REAL));
  if (FA_R(qtile_staged_kv)(p))
    bytes += fa_attn_bytes(bc * (size_t)p->D, sizeof(REAL)) + fa_attn_bytes(bc * (size_t)p->Dv, sizeof(REAL));
  if (FA_R(qtile_staged_out)(p, heads)) bytes += fa_attn_bytes(br * (size_t)p->Dv, sizeof(REAL));
  return bytes;
}

static FA_R(qtile_ws) FA_R(qtile_ws_carve)(const fa_attn_problem *p, int64_t heads, char *at) {
  const size_t br = (size_t)FA_R(qtile_rows_max)(p, heads), bc = (size_t)p->tile_k;
  FA_R(qtile_ws) w = {0};
  w.s = (REAL *)at, at += fa_attn_bytes(br * bc, sizeof(REAL));
  w.m = (REAL *)at, at += fa_attn_bytes(br, sizeof(REAL));
  w.l = (REAL *)at, at += fa_attn_bytes(br, sizeof(REAL));
  w.alpha = (REAL *)at, at += fa_attn_bytes(br, sizeof(REAL));
  w.lo = (int64_t *)at, at += fa_attn_bytes(br, sizeof(int64_t));
  w.hi = (int64_t *)at, at += fa_attn_bytes(br, sizeof(int64_t));
  if (FA_R(qtile_staged_q)(p, heads)) w.qs = (REAL *)at, at += fa_attn_bytes(br * (size_t)p->D, sizeof(REAL));
  if (FA_R(qtile_staged_kv)(p)) {
    w.ks = (REAL *)at, at += fa_attn_bytes(bc * (size_t)p->D, sizeof(REAL));
    w.vs = (REAL *)at, at += fa_attn_bytes(bc * (size_t)p->Dv, sizeof(REAL));
  }
  if (FA_R(qtile_staged_out)(p, heads)) w.os = (REAL *)at;
  return w;
}

/* Rows per_head of heads h.. h + heads - 1 from query i0: key ranges
 * (within the chunk [k0, k1)) and their union, m = -inf, l = 0, output
 * rows zeroed. */
static FA_R(qtile) FA_R(qtile_begin)(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i0, int64_t per_head,
                                     int64_t heads, int64_t k0, int64_t k1, const FA_R(qtile_ws) *w) {
  const int64_t hk = fa_attn_kv_head(p, h), rows = per_head * heads;
  const fa_dtype at = p->storage;
  const void *q = fa_cpu_elem(p->q, at, fa_attn_row_at(p->q_st, b, h, i0));
  FA_R(qtile) t = {b, h, i0, rows, per_head, p->Lk, 0,
                   w->qs ? w->qs : (const REAL *)q, w->qs ? p->D : p->q_st.s,
                   fa_cpu_elem(p->k, at, fa_attn_row_at(p->k_st, b, hk, 0)),
                   fa_cpu_elem(p->v, at, fa_attn_row_at(p->v_st, b, hk, 0)),
                   NULL, 0,
                   (void *)fa_cpu_elem(p->o, p->o_dtype, fa_attn_row_at(p->o_st, b, h, i0)),
                   fa_lse_rows_at(p, fa_attn_row_at(p->lse_st, b, h, i0))};
  t.o = w->os ? w->os : (REAL *)t.out;
  t.ldo = w->os ? p->Dv : p->o_st.s;
  for (int64_t e = 0; w->qs && e < heads; e++)
    fa_cpu_stage_rows(p->compute, w->qs + e * per_head * p->D, p->D, at,
                      fa_cpu_elem(p->q, at, fa_attn_row_at(p->q_st, b, h + e, i0)), p->q_st.s, per_head, p->D);
  for (int64_t r = 0; r < rows; r++) {
    fa_attn_key_range(p, b, i0 + r % per_head, &w->lo[r], &w->hi[r]);
    if (w->lo[r] < k0) w->lo[r] = k0;
    if (w->hi[r] > k1) w->hi[r] = k1;
    if (w->lo[r] < w->hi[r]) {
      t.ulo = w->lo[r] < t.ulo ? w->lo[r] : t.ulo;
      t.uhi = w->hi[r] > t.uhi ? w->hi[r] : t.uhi;
    }
    w->m[r] = -(REAL)INFINITY;
    w->l[r] = 0;
    memset(t.o + r * t.ldo, 0, (size_t)p->Dv * sizeof *t.o);
  }
  return t;
}

/* Keys (values: width Dv) j0..j0+n-1 of the tile's head as REAL rows *ld
 * apart: where they lie, or widened into the workspace's buf (which holds
 * them until the next call for that buffer); from a paged cache, where
 * they lie when they are REAL within one page, else copied into buf a run
 * of rows a page. */
static const REAL *FA_R(qtile_rows)(const fa_attn_problem *p, const FA_R(qtile) *t, int values, REAL *buf, int64_t j0,
                                    int64_t n, int64_t *ld) {
  const void *x = values ? t->v : t->k;
  const int64_t ldx = values ? p->v_st.s : p->k_st.s, width = values ? p->Dv : p->D;
  const fa_attn_pages *pg = p->pages;
  if (pg) {
    const int64_t *page = pg->table + t->b * pg->max_pages, page_elems = values ? pg->v_page : pg->k_page;
    if (p->storage == p->compute && j0 / pg->page_size == (j0 + n - 1) / pg->page_size) {
      *ld = ldx;
      return fa_cpu_elem(x, p->storage, page[j0 / pg->page_size] * page_elems + j0 % pg->page_size * ldx);
    }
    for (int64_t j = j0; j < j0 + n;) {
      const int64_t off = j % pg->page_size, left = pg->page_size - off, run = left < j0 + n - j ? left : j0 + n - j;
      const void *rows = fa_cpu_elem(x, p->storage, page[j / pg->page_size] * page_elems + off * ldx);
      fa_cpu_stage_rows(p->compute, buf + (j - j0) * width, width, p->storage, rows, ldx, run, width);
      j += run;
    }
    *ld = width;
    return buf;
  }
  const void *at = fa_cpu_elem(x, p->storage, j0 * ldx);
  if (!buf) {
    *ld = ldx;
    return at;
  }
  fa_cpu_stage_rows(p->compute, buf, width, p->storage, at, ldx, n, width);
  *ld = width;
  return buf;
}

/* Whether some row attends a key in [j0, j0 + n). */
static inline int FA_R(qtile_attends)(const FA_R(qtile) *t, const FA_R(qtile_ws) *w, int64_t j0, int64_t n) {
  for (int64_t r = 0; r < t->rows; r++)
    if (w->lo[r] < j0 + n && w->hi[r] > j0) return 1;
  return 0;
}

/* What opts.block_mask (API §9) says of keys [j0, j0 + n) for the tile,
 * else mask_mod itself where it can tell for the whole tile
 * (fa_expr_tile): FA_BLOCK_EMPTY (skip them), FA_BLOCK_FULL (mask_mod is
 * true on every pair: *use is p without it) or FA_BLOCK_PARTIAL (*use is
 * p).  full is the tile's copy of p without mask_mod.  (Tiles of one head:
 * such calls are not packed.) */
static inline int FA_R(qtile_block)(const fa_attn_problem *p, const FA_R(qtile) *t, int64_t j0, int64_t n,
                                    const fa_attn_problem *full, const fa_attn_problem **use) {
  *use = p;
  int s = FA_BLOCK_PARTIAL;
  if (p->block_mask) s = fa_block_mask_span(p->block_mask, t->b, t->h, t->i0 / p->tile_q, j0, n);
  else if (p->mask_mod)
    s = fa_expr_tile(p->mask_mod, t->b, t->h, t->i0, t->i0 + t->rows - 1, p->key_base + j0, p->key_base + j0 + n - 1);
  if (s == 2) s = FA_BLOCK_PARTIAL;
  if (s == FA_BLOCK_FULL) *use = full;
  return s;
}

/* w->s = the final scores of keys [j0, j0 + n) for the tile's rows. */
static void FA_R(qtile_scores)(const fa_attn_problem *p, const FA_R(qtile) *t, const FA_R(qtile_ws) *w, int64_t j0,
                               int64_t n) {
  int64_t ldk;
  const REAL *k = FA_R(qtile_rows)(p, t, 0, w->ks, j0, n, &ldk);
  FA_GEMM(1, t->rows, n, p->D, t->q, t->ldq, k, ldk, 0, w->s, p->tile_k);
  for (int64_t r = 0; r < t->rows; r++)
    FA_R(fa_attn_scores)(p, t->b, t->h + r / t->per_head, t->i0 + r % t->per_head, j0, n, w->lo[r], w->hi[r],
                         w->s + r * p->tile_k);
}

/* The same for `rows` rows of n (row stride ld): one run when they are
 * back to back, as in the engine's own buffers. */
static int FA_R(rows_finite)(const REAL *x, int64_t rows, int64_t n, int64_t ld) {
  if (ld == n) return FA_R(all_finite)(x, rows * n);
  for (int64_t r = 0; r < rows; r++)
    if (!FA_R(all_finite)(x + r * ld, n)) return 0;
  return 1;
}

/* Whether row r's final score for key j (its row at kj) is not -inf, i.e.
 * whether the reference lets key j's value into the row (recomputed: rare
 * path). */
static int FA_R(qtile_touches)(const fa_attn_problem *p, const FA_R(qtile) *t, const FA_R(qtile_ws) *w, int64_t r,
                               int64_t j, const REAL *kj) {
  const REAL *q = t->q + r * t->ldq;
  REAL s = 0;
  for (int64_t e = 0; e < p->D; e++) s += q[e] * kj[e];
  FA_R(fa_attn_scores)(p, t->b, t->h + r / t->per_head, t->i0 + r % t->per_head, j, 1, w->lo[r], w->hi[r], &s);
  return s != -(REAL)INFINITY;
}

/* Output rows += P·V for keys [j0, j0 + n), P in w->s (row stride ld);
 * after the qtile_scores of the same keys (the rare path takes them again). */
static void FA_R(qtile_pv)(const fa_attn_problem *p, const FA_R(qtile) *t, const FA_R(qtile_ws) *w, int64_t ld,
                           int64_t j0, int64_t n) {
  const int64_t Dv = p->Dv, ldo = t->ldo;
  int64_t ldv;
  const REAL *v = FA_R(qtile_rows)(p, t, 1, w->vs, j0, n, &ldv);
  if (FA_R(rows_finite)(v, n, Dv, ldv)) {
    FA_GEMM(0, t->rows, Dv, n, w->s, ld, v, ldv, 1, t->o, ldo);
    return;
  }
  /* A NaN or inf value must reach exactly the rows that attend its key,
   * but in a gemm a masked key's zero weight times NaN is NaN too: loops
   * that skip the zero weights of keys the row does not attend. */
  int64_t ldk;
  const REAL *k = FA_R(qtile_rows)(p, t, 0, w->ks, j0, n, &ldk);
  for (int64_t r = 0; r < t->rows; r++)
    for (int64_t j = 0; j < n; j++) {
      const REAL pj = w->s[r * ld + j];
      if (pj == 0 && !FA_R(qtile_touches)(p, t, w, r, j0 + j, k + j * ldk)) continue;
      for (int64_t d = 0; d < Dv; d++) t->o[r * ldo + d] += pj * v[j * ldv + d];
    }
}

/* The tile's rows finished (o /= l, lse: finish) or their lse alone, head
 * by head: each of a packed tile's heads has its own lse rows. */
static void FA_R(qtile_finish)(const fa_attn_problem *p, const FA_R(qtile) *t, const FA_R(qtile_ws) *w, int finish) {
  for (int64_t r0 = 0; r0 < t->rows; r0 += t->per_head) {
    const int64_t h = t->h + r0 / t->per_head;
    const fa_lse_rows lse = r0 ? fa_lse_rows_at(p, fa_attn_row_at(p->lse_st, t->b, h, t->i0)) : t->lse;
    if (finish)
      FA_R(fa_attn_finish)(t->o + r0 * t->ldo, t->ldo, t->per_head, p->Dv, w->m + r0, w->l + r0, lse, p->lse_st.s);
    else
      FA_R(fa_attn_lse)(w->m + r0, w->l + r0, t->per_head, lse, p->lse_st.s);
  }
}

/* Key chunks (opts.splits, p->key_chunks): each work item's keys cut into
 * chunks, each chunk the item's tile over its keys alone, its output rows
 * and lse (f64) in a buffer of the call's (B, Hq, Lq) rows a chunk; then
 * each row's chunks are merged in order as fa.merge_states merges (an
 * empty chunk, lse = -inf, takes nothing; a NaN lse makes the row NaN).
 * s > 1 asked: s chunks (never more than Lk) at Lk·c/s, as the pieces of
 * src/splits.c cut them.  "auto": a call of one query tile a head with
 * fewer work items than threads (decoding: few heads) takes chunks of
 * whole key tiles, at least FA_CPU_SPLIT_MIN_KEYS long, enough to give
 * every thread one.  Returns the chunks; *span: the auto chunks' keys (0:
 * at Lk·c/chunks). */
static int64_t FA_R(qtile_chunks)(const fa_attn_problem *p, int64_t items, int64_t *span) {
  *span = 0;
  if (p->key_chunks >= 1) return p->key_chunks < p->Lk ? p->key_chunks : p->Lk;
  const int threads = fa_cpu_threads_for(INT64_MAX, fa_attn_flops(p));
  if (!FA_R(qtile_may_split)(p) || items >= threads) return 1;
  int64_t chunks = (threads + items - 1) / items;
  if (chunks > p->Lk / FA_CPU_SPLIT_MIN_KEYS) chunks = p->Lk / FA_CPU_SPLIT_MIN_KEYS;
  const int64_t each = (p->Lk + chunks - 1) / chunks;
  *span = (each + p->tile_k - 1) / p->tile_k * p->tile_k;
  return (p->Lk + *span - 1) / *span;
}

/* Chunk c's keys [*k0, *k1) (one chunk: all of them). */
static inline void FA_R(qtile_chunk_at)(const fa_attn_problem *p, int64_t chunks, int64_t span, int64_t c, int64_t *k0,
                                        int64_t *k1) {
  if (span) {
    *k0 = c * span, *k1 = c * span + span < p->Lk ? c * span + span : p->Lk;
  } else {
    *k0 = p->Lk * c / chunks, *k1 = p->Lk * (c + 1) / chunks;
  }
}

typedef struct {
  REAL *o;      /* chunks x rows x Dv (the allocation: NULL when none) */
  double *lse;  /* chunks x rows, after o */
  int64_t rows; /* B * Hq * Lq */
  size_t bytes;
} FA_R(qtile_parts);

static fa_status FA_R(qtile_parts_init)(fa_context *ctx, const fa_attn_problem *p, int64_t chunks,
                                        FA_R(qtile_parts) *parts) {
  parts->rows = p->B * p->Hq * p->Lq;
  if ((double)chunks * (double)parts->rows * (double)(p->Dv + 1) * sizeof(double) > (double)(SIZE_MAX / 4))
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: attention: %lld key chunks of %lld rows are too large",
                   (long long)chunks, (long long)parts->rows);
  const size_t o_bytes = fa_attn_bytes((size_t)(chunks * parts->rows * p->Dv), sizeof(REAL));
  fa_status st = FA_OK;
  parts->bytes = o_bytes + fa_attn_bytes((size_t)(chunks * parts->rows), sizeof(double));
  if (!(parts->o = fa_host_alloc(ctx, parts->bytes, &st))) return st != FA_OK ? st : FA_ERR_OUT_OF_MEMORY;
  parts->lse = (double *)((char *)parts->o + o_bytes);
  return FA_OK;
}

/* p with its outputs chunk c's part: o rows of compute dtype, lse in f64. */
static fa_attn_problem FA_R(qtile_part_problem)(const fa_attn_problem *p, const FA_R(qtile_parts) *parts,
                                               int64_t c) {
  fa_attn_problem part = *p;
  part.o = parts->o + c * parts->rows * p->Dv, part.o_dtype = p->compute;
  part.o_st = fa_attn_strides_dense(p->Hq, p->Lq, p->Dv);
  part.lse = NULL, part.lse64 = parts->lse + c * parts->rows;
  part.lse_st = fa_attn_strides_dense(p->Hq, p->Lq, 1);
  return part;
}

/* Row r of the call: its chunks merged in order, written to p's o and lse. */
static void FA_R(qtile_merge_row)(const fa_attn_problem *p, const FA_R(qtile_parts) *parts, int64_t chunks,
                                  int64_t r) {
  REAL *o = parts->o + r * p->Dv;
  double lse = parts->lse[r];
  for (int64_t c = 1; c < chunks; c++) {
    const int64_t at = c * parts->rows + r;
    FA_R(fa_cpu_merge_row)(o, lse, parts->o + at * p->Dv, parts->lse[at], o, &lse, p->Dv);
  }
  const int64_t b = r / (p->Hq * p->Lq), h = r / p->Lq % p->Hq, i = r % p->Lq;
  void *out = (void *)fa_cpu_elem(p->o, p->o_dtype, fa_attn_row_at(p->o_st, b, h, i));
  fa_cpu_stage_rows(p->o_dtype, out, p->o_st.s, p->compute, o, p->Dv, 1, p->Dv);
  const fa_lse_rows l = fa_lse_rows_at(p, fa_attn_row_at(p->lse_st, b, h, i));
  if (l.f32) *l.f32 = (float)lse;
  if (l.f64) *l.f64 = lse;
}

/* What every work item of a qtile_run shares. */
typedef struct {
  const fa_attn_problem *p;
  FA_R(qtile_fn) fn;
  int64_t heads, groups, Br, tiles, chunks, span;
  const FA_R(qtile_parts) *parts;
} FA_R(qtile_plan);

/* Work item `it` of the plan (a query tile, and its key chunk), in the
 * thread's workspace w. */
static void FA_R(qtile_item)(const FA_R(qtile_plan) *pl, const FA_R(qtile_ws) *w, int64_t it) {
  const fa_attn_problem *p = pl->p;
  const int64_t chunks = pl->chunks, tiles = pl->tiles, Br = pl->Br;
  /* Last tiles first: under a causal mask they hold the most keys, and
   * handing them out early evens out the dynamic schedule. */
  const int64_t c = it % chunks, item = it / chunks;
  const int64_t bg = item / tiles, b = bg / pl->groups, i0 = (tiles - 1 - item % tiles) * Br;
  fa_attn_problem seq;
  const fa_attn_problem *pb = p;
  if (chunks > 1) { /* its outputs chunk c's */
    seq = FA_R(qtile_part_problem)(p, pl->parts, c);
    pb = &seq;
  }
  if (p->pages) { /* a paged cache's sequence: a call of its own over its keys */
    if (pb == p) seq = *p;
    seq.Lk = p->pages->lens[b];
    pb = &seq;
  }
  int64_t k0, k1;
  FA_R(qtile_chunk_at)(p, chunks, pl->span, c, &k0, &k1);
  const FA_R(qtile) t = FA_R(qtile_begin)(pb, b, bg % pl->groups * pl->heads, i0, p->Lq - i0 < Br ? p->Lq - i0 : Br,
                                          pl->heads, k0, k1, w);
  pl->fn(pb, &t, w);
  for (int64_t r0 = 0; w->os && r0 < t.rows; r0 += t.per_head) {
    void *out = r0 ? (void *)fa_cpu_elem(pb->o, pb->o_dtype, fa_attn_row_at(pb->o_st, b, t.h + r0 / t.per_head, i0))
                   : t.out;
    fa_cpu_stage_rows(pb->o_dtype, out, pb->o_st.s, p->compute, t.o + r0 * t.ldo, t.ldo, t.per_head, p->Dv);
  }
}

/* Runs fn on every query tile (and key chunk), OpenMP-parallel with one
 * workspace per thread; a call of one thread runs them here, outside
 * OpenMP (an OpenMP region of one thread still cost 1.4-2.7 us a call in
 * its barriers' futex calls, a third of a tiny call's 9 us: 2 cores,
 * 2026-12-08). */
static fa_status FA_R(qtile_run)(fa_context *ctx, const fa_attn_problem *p, FA_R(qtile_fn) fn) {
  const int64_t heads = FA_R(qtile_packs)(p), groups = p->Hq / heads; /* query heads a tile, tiles a row of them */
  const int64_t Br = heads > 1 ? p->Lq : p->tile_q, tiles = (p->Lq + Br - 1) / Br, items = p->B * groups * tiles;
  int64_t span;
  const int64_t chunks = FA_R(qtile_chunks)(p, items, &span);
  FA_R(qtile_parts) parts = {0};
  fa_attn_workspace ws;
  fa_status st;
  if (chunks > 1 && (st = FA_R(qtile_parts_init)(ctx, p, chunks, &parts))) return st;
  st = fa_attn_workspace_init(ctx, &ws, items * chunks, fa_attn_flops(p), FA_R(qtile_ws_bytes)(p, heads));
  if (st) {
    if (parts.o) fa_host_free(parts.o, parts.bytes);
    return st;
  }
  const FA_R(qtile_plan) pl = {p, fn, heads, groups, Br, tiles, chunks, span, &parts};
  if (ws.threads == 1) {
    const FA_R(qtile_ws) w = FA_R(qtile_ws_carve)(p, heads, fa_attn_workspace_slice(&ws, 0));
    for (int64_t it = 0; it < items * chunks; it++) FA_R(qtile_item)(&pl, &w, it);
    for (int64_t r = 0; chunks > 1 && r < parts.rows; r++) FA_R(qtile_merge_row)(p, &parts, chunks, r);
  } else {
#pragma omp parallel num_threads(ws.threads)
    {
      const FA_R(qtile_ws) w = FA_R(qtile_ws_carve)(p, heads, fa_attn_workspace_slice(&ws, omp_get_thread_num()));
#pragma omp for schedule(dynamic)
      for (int64_t it = 0; it < items * chunks; it++) FA_R(qtile_item)(&pl, &w, it);
      if (chunks > 1) {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < parts.rows; r++) FA_R(qtile_merge_row)(p, &parts, chunks, r);
      }
    }
  }
  fa_attn_workspace_free(&ws);
  if (parts.o) fa_host_free(parts.o, parts.bytes);
  return FA_OK;
}
