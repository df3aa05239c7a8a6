/* Sharding a sequence and ring attention over the shards (API §11; see
 * docs/ring.md).  This version runs the ring on one device: shard i's
 * queries attend the key/value shard (i - r) mod n at step r, as they
 * would arrive over an NCCL ring, and the partial states (o, lse) are
 * merged in f32 (f64 for f64) with fa_merge_states_n.  Every error path
 * releases what it made. */
#include "check.h"
#include "splits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- chunks ------------------------------------------------------------------------ */

/* Chunk j of m chunks over L positions: sizes differing by at most one,
 * the larger first. */
static int64_t chunk_len(int64_t L, int64_t m, int64_t j) { return L / m + (j < L % m); }
static int64_t chunk_start(int64_t L, int64_t m, int64_t j) { return j * (L / m) + (j < L % m ? j : L % m); }

/* The pieces of shard i of n over L positions: (global chunk index, start
 * in the full sequence, length), 1 for contiguous, 2 for zigzag (chunks i
 * and 2n-1-i, in that order).  Returns how many. */
typedef struct {
  int64_t chunk, start, len;
} piece;
static int shard_pieces(int64_t L, int64_t n, int64_t i, fa_shard_layout layout, piece p[2]) {
  if (layout == FA_SHARD_CONTIGUOUS) {
    p[0] = (piece){i, chunk_start(L, n, i), chunk_len(L, n, i)};
    return 1;
  }
  const int64_t m = 2 * n, j = m - 1 - i;
  p[0] = (piece){i, chunk_start(L, m, i), chunk_len(L, m, i)};
  p[1] = (piece){j, chunk_start(L, m, j), chunk_len(L, m, j)};
  return 2;
}

static fa_status check_layout(fa_context *ctx, const char *fname, int layout) {
  if (layout != FA_SHARD_CONTIGUOUS && layout != FA_SHARD_ZIGZAG)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: %s: layout: expected FA_SHARD_CONTIGUOUS (0) or FA_SHARD_ZIGZAG (1), got %d", fname,
                   layout);
  return FA_OK;
}

/* A 0-based dimension of t (negative: from the end) into *out. */
static fa_status resolve_dim(fa_context *ctx, const char *fname, const fa_tensor *t, int dim, int *out) {
  const int d = dim < 0 ? dim + t->ndim : dim;
  if (d < 0 || d >= t->ndim)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: %s: dim %d is out of range for a %d-D tensor", fname,
                   dim >= 0 ? dim + 1 : dim, t->ndim); /* counted from 1 (or from the end), as every message */
  *out = d;
  return FA_OK;
}

static void drop_all(fa_tensor **ts, int64_t n) {
  for (int64_t i = 0; i < n; i++) fa_tensor_drop(&ts[i]);
}

/* dst's positions [at, at + src's length) along dim <- src. */
static fa_status copy_into(fa_context *ctx, fa_tensor *dst, int dim, int64_t at, fa_tensor *src) {
  fa_tensor *view = NULL;
  fa_status st = fa_tensor_narrow(ctx, dst, dim, at, src->shape[dim], &view);
  if (!st) st = fa_tensor_copy(ctx, view, src);
  fa_tensor_drop(&view);
  return st;
}

/* ---- fa_shard / fa_unshard ------------------------------------------------------- */

fa_status fa_shard(fa_context *ctx, fa_tensor *t, int n, int dim, fa_shard_layout layout, fa_tensor **shards) {
  FA_NEED(ctx);
  FA_NEED(shards);
  fa_status st;
  if ((st = fa_check_tensor(ctx, t, "shard: t")) || (st = check_layout(ctx, "shard", (int)layout))) return st;
  int d = 0;
  if ((st = resolve_dim(ctx, "shard", t, dim, &d))) return st;
  const int64_t L = t->shape[d], m = layout == FA_SHARD_ZIGZAG ? 2 * (int64_t)n : n;
  if (n < 1 || m > L)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: shard: n = %d: expected 1 <= n <= %lld (%s, dim %d of length %lld)",
                   n, (long long)(layout == FA_SHARD_ZIGZAG ? L / 2 : L),
                   layout == FA_SHARD_ZIGZAG ? "zigzag needs 2n <= L" : "contiguous needs n <= L", d + 1,
                   (long long)L);
  for (int i = 0; i < n; i++) shards[i] = NULL;
  for (int i = 0; i < n && !st; i++) {
    piece p[2];
    const int np = shard_pieces(L, n, i, layout, p);
    if (np == 1) {
      st = fa_tensor_narrow(ctx, t, d, p[0].start, p[0].len, &shards[i]);
      continue;
    }
    int64_t shape[FA_MAX_DIMS];
    for (int k = 0; k < t->ndim; k++) shape[k] = t->shape[k];
    shape[d] = p[0].len + p[1].len;
    if ((st = fa_tensor_new(ctx, t->ndim, shape, t->dtype, t->storage->device, &shards[i]))) break;
    int64_t at = 0;
    for (int k = 0; k < 2 && !st; at += p[k].len, k++) {
      fa_tensor *src = NULL;
      if (!(st = fa_tensor_narrow(ctx, t, d, p[k].start, p[k].len, &src))) st = copy_into(ctx, shards[i], d, at, src);
      fa_tensor_drop(&src);
    }
  }
  if (st) drop_all(shards, n);
  return st;
}

fa_status fa_unshard(fa_context *ctx, int n, fa_tensor *const *shards, int dim, fa_shard_layout layout,
                     fa_tensor **out) {
  FA_NEED(ctx);
  FA_NEED(out);
  *out = NULL;
  FA_NEED(shards);
  fa_status st;
  if ((st = check_layout(ctx, "unshard", (int)layout))) return st;
  if (n < 1) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: unshard: expected at least 1 shard, got %d", n);
  for (int i = 0; i < n; i++)
    if (!shards[i]) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: unshard: shards[%d] is NULL", i + 1);
  const fa_tensor *t0 = shards[0];
  int d = 0;
  if ((st = resolve_dim(ctx, "unshard", t0, dim, &d))) return st;
  int64_t L = 0;
  for (int i = 0; i < n; i++) {
    const fa_tensor *s = shards[i];
    int same = s->ndim == t0->ndim;
    for (int k = 0; same && k < s->ndim; k++) same = k == d || s->shape[k] == t0->shape[k];
    if (!same) {
      char a[64], b[64];
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: unshard: shards[%d] has shape %s, shards[1] %s: only dim %d may differ",
                     i + 1, fa_shape_str(s, a, sizeof a), fa_shape_str(t0, b, sizeof b), d + 1);
    }
    if (s->dtype != t0->dtype || s->storage->device != t0->storage->device)
      return fa_fail(ctx, s->dtype != t0->dtype ? FA_ERR_DTYPE : FA_ERR_DEVICE,
                     "flashattn: unshard: shards[%d] is %s on %s, shards[1] %s on %s", i + 1, fa_dtype_name(s->dtype),
                     fa_device_name(s->storage->device), fa_dtype_name(t0->dtype),
                     fa_device_name(t0->storage->device));
    L += s->shape[d];
  }
  if (layout == FA_SHARD_ZIGZAG) { /* the lengths fa_shard makes, and 2n <= L */
    if (2 * (int64_t)n > L)
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: unshard: %d zigzag shards need 2n <= L, got L = %lld", n,
                     (long long)L);
    for (int i = 0; i < n; i++) {
      piece p[2];
      shard_pieces(L, n, i, layout, p);
      if (shards[i]->shape[d] != p[0].len + p[1].len)
        return fa_fail(ctx, FA_ERR_SHAPE,
                       "flashattn: unshard: shards[%d] has length %lld along dim %d, expected %lld (zigzag shard of "
                       "%d over L = %lld)",
                       i + 1, (long long)shards[i]->shape[d], d + 1, (long long)(p[0].len + p[1].len), n,
                       (long long)L);
    }
  }
  int64_t shape[FA_MAX_DIMS];
  for (int k = 0; k < t0->ndim; k++) shape[k] = t0->shape[k];
  shape[d] = L;
  if ((st = fa_tensor_new(ctx, t0->ndim, shape, t0->dtype, t0->storage->device, out))) return st;
  for (int64_t i = 0, at = 0; i < n && !st; i++) {
    if (layout == FA_SHARD_CONTIGUOUS) {
      st = copy_into(ctx, *out, d, at, shards[i]);
      at += shards[i]->shape[d];
      continue;
    }
    piece p[2];
    shard_pieces(L, n, i, layout, p);
    int64_t from = 0;
    for (int k = 0; k < 2 && !st; from += p[k].len, k++) {
      fa_tensor *src = NULL;
      if (!(st = fa_tensor_narrow(ctx, shards[i], d, from, p[k].len, &src))) st = copy_into(ctx, *out, d, p[k].start, src);
      fa_tensor_drop(&src);
    }
  }
  if (st) fa_tensor_drop(out);
  return st;
}

/* ---- ring attention ------------------------------------------------------------- */

/* Options that need the global positions of the whole sequence (or name
 * outputs of the whole call): refused in this version. */
static fa_status check_ring_opts(fa_context *ctx, const fa_attention_opts *o) {
  const char *what = o->has_window ? "opts.window"
                     : o->mask ? "opts.mask"
                     : o->kv_lens ? "opts.kv_lens"
                     : o->alibi ? "opts.alibi"
                     : o->splits > 1 ? "opts.splits"
                     : (o->kernel && *o->kernel) ? "opts.kernel"
                     : o->score_mod ? "opts.score_mod"
                     : o->mask_mod ? "opts.mask_mod"
                     : o->out ? "opts.out"
                     : o->lse_out ? "opts.lse_out"
                                  : NULL;
  if (what)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                   "flashattn: ring_attention: %s is not in this version (it needs the global positions or "
                   "outputs of the whole sequence)",
                   what);
  if ((unsigned)o->causal > FA_CAUSAL_TOP_LEFT)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: ring_attention: opts.causal: unknown value %d", (int)o->causal);
  return FA_OK;
}

/* One array of shards: none NULL, float, on dev in dtype of ref, rank of
 * ref, every dimension but the sequence's (rank - 2) equal to shard 1's;
 * length >= 1. */
static fa_status check_shards(fa_context *ctx, int n, fa_tensor *const *ts, const char *name, const fa_tensor *q0) {
  if (!ts) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: ring_attention: the %s array is NULL", name);
  for (int i = 0; i < n; i++) {
    const fa_tensor *t = ts[i];
    if (!t) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: ring_attention: %s[%d] is NULL", name, i + 1);
    if (!fa_is_float_dtype(t->dtype) || t->dtype != q0->dtype)
      return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: ring_attention: %s[%d]: expected dtype %s (as qs[1]), got %s", name,
                     i + 1, fa_is_float_dtype(q0->dtype) ? fa_dtype_name(q0->dtype) : "f32, f16, bf16 or f64",
                     fa_dtype_name(t->dtype));
    if (t->storage->device != q0->storage->device)
      return fa_fail(ctx, FA_ERR_DEVICE,
                     "flashattn: ring_attention: %s[%d]: expected device %s (as qs[1]: the ring runs on one device in "
                     "this version), got %s",
                     name, i + 1, fa_device_name(q0->storage->device), fa_device_name(t->storage->device));
    if (t->ndim < 2 || t->ndim != q0->ndim)
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: ring_attention: %s[%d]: expected %d dimensions (as qs[1]), got %d",
                     name, i + 1, q0->ndim < 2 ? 4 : q0->ndim, t->ndim);
    const fa_tensor *t0 = ts[0];
    for (int k = 0; k < t->ndim; k++)
      if (k != t->ndim - 2 && t->shape[k] != t0->shape[k]) {
        char a[64], b[64];
        return fa_fail(ctx, FA_ERR_SHAPE,
                       "flashattn: ring_attention: %s[%d] has shape %s, %s[1] %s: only the sequence dimension may "
                       "differ",
                       name, i + 1, fa_shape_str(t, a, sizeof a), name, fa_shape_str(t0, b, sizeof b));
      }
    if (t->shape[t->ndim - 2] < 1)
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: ring_attention: %s[%d] is empty along its sequence dimension", name,
                     i + 1);
  }
  return FA_OK;
}

/* The running state of one query piece: o in the merge's dtype, lse. */
typedef struct {
  fa_tensor *o, *lse;
} state;

/* (o, lse) of one (query piece, key piece) pair, in the merge's dtypes:
 * an opts.splits-style piece (src/splits.c) from its own first key, whose
 * lse comes in f64 (fa_attention_piece) rather than rounded to f32 at the
 * scores' magnitude. */
static fa_status attend_piece(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *po,
                              int reference, fa_dtype odt, fa_dtype ldt, fa_device dev, state *out) {
  fa_tensor *o = NULL, *lse = NULL;
  fa_status st = reference ? fa_attention_reference(ctx, q, k, v, po, &o, &lse)
                           : fa_attention_piece(ctx, q, k, v, po, 0, &o, &lse);
  if (!st) st = fa_tensor_to(ctx, o, odt, dev, &out->o);
  if (!st) st = fa_tensor_to(ctx, lse, ldt, dev, &out->lse);
  if (st) fa_tensor_drop(&out->o), fa_tensor_drop(&out->lse);
  fa_tensor_drop(&o), fa_tensor_drop(&lse);
  return st;
}

/* acc <- merge(acc, s); s consumed. */
static fa_status merge_into(fa_context *ctx, state *acc, state *s) {
  if (!acc->o) {
    *acc = *s;
    *s = (state){NULL, NULL};
    return FA_OK;
  }
  fa_tensor *os[2] = {acc->o, s->o}, *ls[2] = {acc->lse, s->lse}, *o = NULL, *lse = NULL;
  fa_status st = fa_merge_states_n(ctx, 2, os, ls, &o, &lse);
  fa_tensor_drop(&s->o), fa_tensor_drop(&s->lse);
  if (st) return st;
  fa_tensor_drop(&acc->o), fa_tensor_drop(&acc->lse);
  acc->o = o, acc->lse = lse;
  return FA_OK;
}

static fa_status narrow_seq(fa_context *ctx, fa_tensor *t, const piece *p, fa_tensor **out) {
  return fa_tensor_narrow(ctx, t, t->ndim - 2, p->start, p->len, out);
}

fa_status fa_ring_attention(fa_context *ctx, int n, fa_tensor *const *qs, fa_tensor *const *ks, fa_tensor *const *vs,
                            const fa_attention_opts *opts, int layout, fa_tensor **outs, fa_tensor **lses) {
  FA_NEED(ctx);
  FA_NEED(outs);
  if (n < 1) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: ring_attention: expected n >= 1 shards, got %d", n);
  for (int i = 0; i < n; i++) {
    outs[i] = NULL;
    if (lses) lses[i] = NULL;
  }
  fa_attention_opts defaults;
  if (!opts) {
    fa_attention_opts_init(&defaults);
    opts = &defaults;
  }
  fa_status st;
  if ((st = check_layout(ctx, "ring_attention", layout)) || (st = check_ring_opts(ctx, opts))) return st;
  if (!qs) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: ring_attention: the qs array is NULL");
  if (!qs[0]) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: ring_attention: qs[1] is NULL");
  const fa_tensor *q0 = qs[0];
  if ((st = check_shards(ctx, n, qs, "qs", q0)) || (st = check_shards(ctx, n, ks, "ks", q0)) ||
      (st = check_shards(ctx, n, vs, "vs", q0)))
    return st;
  const int sd = q0->ndim - 2;
  int64_t L = 0;
  for (int i = 0; i < n; i++) {
    const int64_t li = qs[i]->shape[sd];
    if (ks[i]->shape[sd] != li || vs[i]->shape[sd] != li)
      return fa_fail(ctx, FA_ERR_SHAPE,
                     "flashattn: ring_attention: shard %d: qs, ks and vs lengths %lld, %lld, %lld differ (the shards "
                     "of one sequence, Lq = Lk)",
                     i + 1, (long long)li, (long long)ks[i]->shape[sd], (long long)vs[i]->shape[sd]);
    L += li;
  }
  { /* the heads, batch and head dims as fa_attention checks them, on shard 1 (the others
     * differ from theirs only in length), named as the shards */
    fa_attn_dims d;
    if ((st = fa_check_attention(ctx, qs[0], ks[0], vs[0], opts, 0, &d))) {
      static const char prefix[] = "flashattn: ";
      char rest[FA_ERRMSG_LEN];
      const char *e = ctx->error;
      snprintf(rest, sizeof rest, "%s", strncmp(e, prefix, sizeof prefix - 1) ? e : e + sizeof prefix - 1);
      return fa_fail(ctx, st, "flashattn: ring_attention: qs[1], ks[1], vs[1] as q, k, v: %s", rest);
    }
  }
  /* the pieces of each shard in the full sequence */
  piece *pcs = calloc(2 * (size_t)n, sizeof *pcs);
  state *acc = calloc(2 * (size_t)n, sizeof *acc);
  int *npc = calloc((size_t)n, sizeof *npc);
  if (!pcs || !acc || !npc) {
    free(pcs), free(acc), free(npc);
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: ring_attention: out of host memory");
  }
  if (layout == FA_SHARD_ZIGZAG && 2 * (int64_t)n > L) {
    st = fa_fail(ctx, FA_ERR_SHAPE, "flashattn: ring_attention: %d zigzag shards need 2n <= L, got L = %lld", n,
                 (long long)L);
    goto done;
  }
  for (int i = 0; i < n; i++) {
    if (layout == FA_SHARD_ZIGZAG) {
      npc[i] = shard_pieces(L, n, i, FA_SHARD_ZIGZAG, &pcs[2 * i]);
      if (qs[i]->shape[sd] != pcs[2 * i].len + pcs[2 * i + 1].len) {
        st = fa_fail(ctx, FA_ERR_SHAPE,
                     "flashattn: ring_attention: qs[%d] has length %lld, expected %lld (zigzag shard %d of %d over L = "
                     "%lld, as fa.shard makes it)",
                     i + 1, (long long)qs[i]->shape[sd], (long long)(pcs[2 * i].len + pcs[2 * i + 1].len), i + 1, n,
                     (long long)L);
        goto done;
      }
      pcs[2 * i + 1].start = pcs[2 * i].len; /* start within the shard from here on */
      pcs[2 * i].start = 0;
    } else { /* contiguous: any lengths, the chunk index is the shard's */
      npc[i] = 1;
      pcs[2 * i] = (piece){i, 0, qs[i]->shape[sd]};
    }
  }
  /* f64: each piece by the f64 reference (its lse is f64, the merge's
   * weights stay exact to f64); else fa_attention's pieces, their states
   * merged in f32 and their lse in f64 (an f32 lse near 8192 is off by up
   * to 5e-4 on a piece's weight: tests/lua/test_ring.lua) */
  const int reference = q0->dtype == FA_F64;
  const fa_dtype odt = reference ? FA_F64 : FA_F32, ldt = FA_F64;
  const fa_device dev = q0->storage->device;
  fa_attention_opts full = *opts, diag = *opts;
  full.causal = FA_CAUSAL_NONE, diag.causal = FA_CAUSAL_TOP_LEFT;
  full.return_lse = diag.return_lse = 1;
  full.splits = diag.splits = 1;
  const int causal = opts->causal != FA_CAUSAL_NONE;
  for (int r = 0; r < n && !st; r++)
    for (int i = 0; i < n && !st; i++) {
      const int j = ((i - r) % n + n) % n; /* the K/V shard that reaches shard i at step r */
      for (int a = 0; a < npc[i] && !st; a++)
        for (int b = 0; b < npc[j] && !st; b++) {
          const piece *qp = &pcs[2 * i + a], *kp = &pcs[2 * j + b];
          if (causal && kp->chunk > qp->chunk) continue; /* above the diagonal */
          const fa_attention_opts *po = causal && kp->chunk == qp->chunk ? &diag : &full;
          fa_tensor *q = NULL, *k = NULL, *v = NULL;
          state s = {NULL, NULL};
          if (!(st = narrow_seq(ctx, qs[i], qp, &q)) && !(st = narrow_seq(ctx, ks[j], kp, &k)) &&
              !(st = narrow_seq(ctx, vs[j], kp, &v)) &&
              !(st = attend_piece(ctx, q, k, v, po, reference, odt, ldt, reference ? FA_CPU : dev, &s)))
            st = merge_into(ctx, &acc[2 * i + a], &s);
          fa_tensor_drop(&q), fa_tensor_drop(&k), fa_tensor_drop(&v);
          fa_tensor_drop(&s.o), fa_tensor_drop(&s.lse);
        }
    }
  /* the outputs: q's shape with v's last dimension, q's dtype; lse f32 */
  for (int i = 0; i < n && !st; i++) {
    fa_tensor *qi = qs[i];
    int64_t shape[FA_MAX_DIMS];
    for (int k = 0; k < qi->ndim; k++) shape[k] = qi->shape[k];
    shape[qi->ndim - 1] = vs[i]->shape[qi->ndim - 1];
    if ((st = fa_tensor_new(ctx, qi->ndim, shape, qi->dtype, dev, &outs[i]))) break;
    if (lses && (st = fa_tensor_new(ctx, qi->ndim - 1, shape, FA_F32, dev, &lses[i]))) break;
    for (int a = 0; a < npc[i] && !st; a++) {
      const piece *p = &pcs[2 * i + a];
      st = copy_into(ctx, outs[i], sd, p->start, acc[2 * i + a].o);
      if (!st && lses) st = copy_into(ctx, lses[i], sd, p->start, acc[2 * i + a].lse);
    }
  }
  if (st) {
    drop_all(outs, n);
    if (lses) drop_all(lses, n);
  }
done:
  for (int i = 0; i < 2 * n; i++) fa_tensor_drop(&acc[i].o), fa_tensor_drop(&acc[i].lse);
  free(pcs), free(acc), free(npc);
  return st;
}
