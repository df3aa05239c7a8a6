/* Sharding a sequence and ring attention over the shards (API §11; see
 * docs/ring.md).  This version runs the ring on one device: shard i's
 * queries attend the key/value shard (i - r) mod n at step r, as they
 * would arrive over an NCCL ring, and the partial states (o, lse) are
 * merged in f32 (f64 for f64) with fa_merge_states_n.  Every error path
 * releases what it made. */
#include "check.h"
#include "expr.h"
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
  int64_t pos; /* ring attention: the piece's first position in the whole sequence */
} piece;
static int shard_pieces(int64_t L, int64_t n, int64_t i, fa_shard_layout layout, piece p[2]) {
  if (layout == FA_SHARD_CONTIGUOUS) {
    p[0] = (piece){i, chunk_start(L, n, i), chunk_len(L, n, i), chunk_start(L, n, i)};
    return 1;
  }
  const int64_t m = 2 * n, j = m - 1 - i;
  p[0] = (piece){i, chunk_start(L, m, i), chunk_len(L, m, i), chunk_start(L, m, i)};
  p[1] = (piece){j, chunk_start(L, m, j), chunk_len(L, m, j), chunk_start(L, m, j)};
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

/* Options the pieces cannot take in this version, or that name outputs
 * of the whole call.  (A variant's block mask, made for the whole
 * sequence, is checked as fa.attention checks it and left to the pieces'
 * own tiles.) */
static fa_status check_ring_opts(fa_context *ctx, const fa_attention_opts *o) {
  const char *what = NULL, *why = "it names outputs of the whole sequence";
  if (o->splits > 1 || (o->kernel && *o->kernel)) {
    what = o->splits > 1 ? "opts.splits" : "opts.kernel";
    why = "the ring chooses its pieces' calls";
  } else if (o->out || o->lse_out) {
    what = o->out ? "opts.out" : "opts.lse_out";
  }
  if (what) return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: ring_attention: %s is not in this version (%s)", what, why);
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

/* fa_check_attention's checks of the call, named as the ring's: the
 * shapes on shard 1 (the others differ from it only in length), then the
 * options against the whole sequence (Lq = Lk = L: kv_lens and a mask
 * count its positions).  d gets shard 1's dims with Lq = Lk = L and the
 * algo. */
static fa_status check_ring_call(fa_context *ctx, fa_tensor *const *qs, fa_tensor *const *ks, fa_tensor *const *vs,
                                 const fa_attention_opts *opts, int64_t L, fa_attn_dims *d) {
  fa_attention_opts shapes_only;
  fa_attention_opts_init(&shapes_only);
  const char *as = "qs[1], ks[1], vs[1] as q, k, v: ";
  fa_status st = fa_check_attention(ctx, qs[0], ks[0], vs[0], &shapes_only, 0, d);
  if (!st) {
    d->Lq = d->Lk = L;
    as = "";
    st = fa_check_attention_options(ctx, qs[0], opts, 0, d);
  }
  if (!st) return FA_OK;
  static const char prefix[] = "flashattn: ";
  char rest[FA_ERRMSG_LEN];
  const char *e = ctx->error;
  snprintf(rest, sizeof rest, "%s", strncmp(e, prefix, sizeof prefix - 1) ? e : e + sizeof prefix - 1);
  return fa_fail(ctx, st, "flashattn: ring_attention: %s%s", as, rest);
}

/* The running state of one query piece: o in the merge's dtype, lse. */
typedef struct {
  fa_tensor *o, *lse;
} state;

/* What the pair calls of one ring call share. */
typedef struct {
  const fa_attention_opts *opts; /* the call's */
  int64_t B, Hq, L;
  int reference;     /* f64: each pair by the f64 reference */
  fa_dtype odt, ldt; /* the states' dtypes */
  fa_device dev;     /* and device */
  int64_t *lens;     /* B entries: a pair's kv_lens */
} ring_call;

/* Whether mask_mod may leave some pair of qp's queries and kp's keys, for
 * some batch and head, where interval arithmetic can tell (fa_expr_tile,
 * after fa_expr_begin(host)): 0 lets the ring skip the pair. */
static int mask_mod_visible(const ring_call *rc, const piece *qp, const piece *kp) {
  const fa_expr *mm = rc->opts->mask_mod;
  for (int64_t b = 0; b < rc->B; b++)
    for (int64_t h = 0; h < rc->Hq; h++)
      if (fa_expr_tile(mm, b, h, qp->pos, qp->pos + qp->len - 1, kp->pos, kp->pos + kp->len - 1) != FA_BLOCK_EMPTY)
        return 1;
  return 0;
}

/* Whether some query of qp may attend some key of kp, at their positions
 * in the whole sequence (its diagonal is j = i).  Under causal and the
 * window the visible pairs (i, j) are the band i - left <= j <= i + right;
 * it meets the pair's box when the first query's lowest key is not past
 * the last key and the last query's highest key not before the first.
 * mask_mod: not empty by interval arithmetic (mask_mod_visible).  kv_lens:
 * some sequence has a key in kp. */
static int pair_visible(const ring_call *rc, const piece *qp, const piece *kp) {
  const fa_attention_opts *o = rc->opts;
  int64_t left = o->has_window ? o->window_left : -1, right = o->has_window ? o->window_right : -1;
  if (o->causal != FA_CAUSAL_NONE) right = 0;
  if (left > rc->L) left = -1; /* as wide as the sequence: no bound (and no overflow below) */
  if (right > rc->L) right = -1;
  if (left >= 0 && kp->pos + kp->len - 1 < qp->pos - left) return 0;
  if (right >= 0 && kp->pos > qp->pos + qp->len - 1 + right) return 0;
  if (o->mask_mod && !mask_mod_visible(rc, qp, kp)) return 0;
  if (!o->kv_lens) return 1;
  for (int64_t b = 0; b < rc->B; b++)
    if (o->kv_lens[b] > kp->pos) return 1;
  return 0;
}

/* shifted_expr: how many nodes node x of e becomes. */
enum { SHIFT_NODES = 5 }; /* the nodes a q or k becomes: itself, +, first, min, first + len */
static int shifted_nodes(const fa_expr_node *x) { return x->op == FA_X_Q || x->op == FA_X_K ? SHIFT_NODES : 1; }

/* A variant of a pair's call (API §9 in §11): e with its q and k the
 * positions in the whole sequence, q + qp's first position and k + kp's,
 * each held to the piece's last (the rows and keys past it are the pair's
 * padding, dropped or left out by kv_lens: read at a real position, they
 * cannot fault where the whole call would not).  NULL for NULL. */
static fa_status shifted_expr(fa_context *ctx, const fa_expr *e, const piece *qp, const piece *kp, fa_expr **out) {
  *out = NULL;
  if (!e) return FA_OK;
  int count = 0;
  for (int i = 0; i < e->n; i++) count += shifted_nodes(&e->nodes[i]);
  if (count > FA_EXPR_MAX_NODES)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: ring_attention: a variant of %d nodes is too large to count positions in the whole "
                   "sequence (at most %d with its q and k shifted)",
                   e->n, FA_EXPR_MAX_NODES);
  fa_expr_node *nodes = malloc((size_t)count * sizeof *nodes);
  int *map = malloc((size_t)e->n * sizeof *map);
  if (!nodes || !map) {
    free(nodes), free(map);
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: ring_attention: out of host memory");
  }
  int m = 0;
  for (int i = 0; i < e->n; i++) {
    const fa_expr_node *x = &e->nodes[i];
    if (shifted_nodes(x) == SHIFT_NODES) { /* a q or k: min(pos + first, first + len), 1-based */
      const piece *pc = x->op == FA_X_Q ? qp : kp;
      nodes[m] = *x;
      fa_expr_node_set(&nodes[m + 1], FA_X_CONST, 0, 0, 0, 0, (double)pc->pos);
      fa_expr_node_set(&nodes[m + 2], FA_X_ADD, 0, m, m + 1, 0, 0);
      fa_expr_node_set(&nodes[m + 3], FA_X_CONST, 0, 0, 0, 0, (double)(pc->pos + pc->len));
      fa_expr_node_set(&nodes[m + 4], FA_X_MIN, 0, m + 2, m + 3, 0, 0);
      map[i] = m + 4, m += SHIFT_NODES;
      continue;
    }
    nodes[m] = *x;
    for (int a = 0; a < fa_expr_operands(x); a++) nodes[m].a[a] = map[x->a[a]];
    map[i] = m++;
  }
  const char *names[FA_EXPR_MAX_TENSORS];
  for (int t = 0; t < e->ntensors; t++) names[t] = e->names[t];
  fa_status st = fa_expr_new(ctx, nodes, m, e->tensors, names, e->ntensors, out);
  free(nodes), free(map);
  return st;
}

/* The node of e that node f of its shifted_expr copies (-1: one it added). */
static int unshifted_node(const fa_expr *e, int f) {
  for (int i = 0, m = 0; i < e->n; m += shifted_nodes(&e->nodes[i]), i++)
    if (f < m + shifted_nodes(&e->nodes[i])) return shifted_nodes(&e->nodes[i]) == 1 ? i : -1;
  return -1;
}

/* A pair's failure from a read out of range in shifted (the copy of e that
 * the pair's call took) told as the whole call tells it: the read's text
 * e's, its index the position in the whole sequence. */
static fa_status unshifted_fault(fa_context *ctx, fa_status st, const fa_expr *e, const fa_expr *shifted,
                                 const char *what) {
  if (!shifted || !atomic_load(&((fa_expr *)shifted)->fault)) return st;
  const int node = unshifted_node(e, shifted->fault_node);
  if (node < 0) return st;
  fa_expr_clear_fault(e);
  fa_expr_set_fault(e, node, shifted->fault_dim, shifted->fault_index);
  fa_status f = fa_expr_fault(ctx, e, what);
  fa_expr_clear_fault(e);
  return f ? f : st;
}

/* *out <- positions [start, start + len) of t along dim, as a view; when
 * padded > len, a new tensor of padded positions there, zeros after the
 * len of t (keys that kv_lens leaves out, or query rows dropped). */
static fa_status narrow_padded(fa_context *ctx, fa_tensor *t, int dim, int64_t start, int64_t len, int64_t padded,
                               fa_tensor **out) {
  fa_tensor *view = NULL;
  fa_status st = fa_tensor_narrow(ctx, t, dim, start, len, &view);
  if (st || padded <= len) {
    *out = view;
    return st;
  }
  int64_t shape[FA_MAX_DIMS];
  for (int k = 0; k < t->ndim; k++) shape[k] = t->shape[k];
  shape[dim] = padded;
  if (!(st = fa_tensor_new(ctx, t->ndim, shape, t->dtype, t->storage->device, out)) &&
      !(st = fa_tensor_fill(ctx, *out, 0)))
    st = copy_into(ctx, *out, dim, 0, view);
  if (st) fa_tensor_drop(out);
  fa_tensor_drop(&view);
  return st;
}

/* The call's mask at the pair's queries and keys (its last two dimensions,
 * where not broadcast), padded to lq queries and lk keys. */
static fa_status mask_of_pair(fa_context *ctx, fa_tensor *m, const piece *qp, const piece *kp, int64_t lq, int64_t lk,
                              fa_tensor **out) {
  const int kd = m->ndim - 1, qd = m->ndim - 2;
  fa_tensor *keys = m;
  if (m->shape[kd] == 1)
    fa_tensor_retain(m); /* broadcast over the keys */
  else {
    fa_status st = narrow_padded(ctx, m, kd, kp->pos, kp->len, lk, &keys);
    if (st) return st;
  }
  if (qd < 0 || keys->shape[qd] == 1) {
    *out = keys;
    return FA_OK;
  }
  fa_status st = narrow_padded(ctx, keys, qd, qp->pos, qp->len, lq, out);
  fa_tensor_drop(&keys);
  return st;
}

/* (o, lse) of a pair's call, its first rows rows, in the states' dtypes:
 * an opts.splits-style piece (src/splits.c) from its own first key, whose
 * lse comes in f64 (fa_attention_piece) rather than rounded to f32 at the
 * scores' magnitude. */
static fa_status attend_piece(fa_context *ctx, const ring_call *rc, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                              const fa_attention_opts *po, int64_t rows, state *out) {
  fa_tensor *o = NULL, *lse = NULL, *ov = NULL, *lv = NULL;
  fa_status st = rc->reference ? fa_attention_reference(ctx, q, k, v, po, &o, &lse)
                               : fa_attention_piece(ctx, q, k, v, po, 0, &o, &lse);
  if (!st) st = fa_tensor_narrow(ctx, o, o->ndim - 2, 0, rows, &ov);
  if (!st) st = fa_tensor_narrow(ctx, lse, lse->ndim - 1, 0, rows, &lv);
  if (!st) st = fa_tensor_to(ctx, ov, rc->odt, rc->dev, &out->o);
  if (!st) st = fa_tensor_to(ctx, lv, rc->ldt, rc->dev, &out->lse);
  if (st) fa_tensor_drop(&out->o), fa_tensor_drop(&out->lse);
  fa_tensor_drop(&o), fa_tensor_drop(&lse), fa_tensor_drop(&ov), fa_tensor_drop(&lv);
  return st;
}

/* The state of qp's queries (of shard qsh) against kp's keys (of ksh, vsh),
 * every rule at the whole sequence's positions.  Causal alone needs no
 * positions: a pair off the diagonal is all visible (pair_visible skips
 * the others) and one on it (the same chunk) is its own diagonal.  The
 * window and alibi count from the diagonal, which fa_attention puts at key
 * i + Lk - Lq of query i: the shorter side is padded at its end until
 * Lk - Lq is the pieces' distance qp->pos - kp->pos (keys past kp's left
 * out by kv_lens, queries past qp's dropped from the state).  kv_lens
 * count keys from the sequence's start. */
static fa_status attend_pair(fa_context *ctx, const ring_call *rc, fa_tensor *qsh, fa_tensor *ksh, fa_tensor *vsh,
                             const piece *qp, const piece *kp, state *out) {
  const fa_attention_opts *o = rc->opts;
  const int same = qp->chunk == kp->chunk, shifted = !same && (o->has_window || o->alibi);
  const int causal = o->causal != FA_CAUSAL_NONE;
  fa_attention_opts po = *o;
  po.splits = 1, po.return_lse = 1;
  po.causal = !causal ? FA_CAUSAL_NONE : shifted ? FA_CAUSAL_BOTTOM_RIGHT : same ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_NONE;
  const int64_t dist = qp->pos - kp->pos, natural = kp->len - qp->len;
  const int64_t lq = shifted && dist < natural ? kp->len - dist : qp->len;
  const int64_t lk = shifted && dist > natural ? qp->len + dist : kp->len;
  if (o->kv_lens || lk > kp->len) {
    for (int64_t b = 0; b < rc->B; b++) {
      const int64_t e = o->kv_lens ? o->kv_lens[b] - kp->pos : kp->len;
      rc->lens[b] = e < 0 ? 0 : e > kp->len ? kp->len : e;
    }
    po.kv_lens = rc->lens, po.n_kv_lens = rc->B;
  }
  fa_tensor *q = NULL, *k = NULL, *v = NULL, *m = NULL;
  fa_expr *sm = NULL, *mm = NULL;
  const int sd = qsh->ndim - 2;
  fa_status st;
  if (!(st = narrow_padded(ctx, qsh, sd, qp->start, qp->len, lq, &q)) &&
      !(st = narrow_padded(ctx, ksh, sd, kp->start, kp->len, lk, &k)) &&
      !(st = narrow_padded(ctx, vsh, sd, kp->start, kp->len, lk, &v)) &&
      !(st = o->mask ? mask_of_pair(ctx, o->mask, qp, kp, lq, lk, &m) : FA_OK) &&
      !(st = shifted_expr(ctx, o->score_mod, qp, kp, &sm)) && !(st = shifted_expr(ctx, o->mask_mod, qp, kp, &mm))) {
    po.mask = m;
    po.score_mod = sm, po.mask_mod = mm, po.block_mask = NULL; /* the pair's call makes its own tiles */
    st = attend_piece(ctx, rc, q, k, v, &po, qp->len, out);
    if (st && mm && atomic_load(&mm->fault)) st = unshifted_fault(ctx, st, o->mask_mod, mm, "opts.mask_mod");
    else if (st && sm) st = unshifted_fault(ctx, st, o->score_mod, sm, "opts.score_mod");
  }
  fa_tensor_drop(&q), fa_tensor_drop(&k), fa_tensor_drop(&v), fa_tensor_drop(&m);
  fa_expr_free(sm), fa_expr_free(mm);
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
  fa_attn_dims d;
  if ((st = check_ring_call(ctx, qs, ks, vs, opts, L, &d))) return st;
  /* the pieces of each shard in the full sequence */
  piece *pcs = calloc(2 * (size_t)n, sizeof *pcs);
  state *acc = calloc(2 * (size_t)n, sizeof *acc);
  int *npc = calloc((size_t)n, sizeof *npc);
  int64_t *lens = calloc((size_t)(d.B > 0 ? d.B : 1), sizeof *lens); /* (B = 0: calloc(0) may be NULL) */
  if (!pcs || !acc || !npc || !lens) {
    free(pcs), free(acc), free(npc), free(lens);
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: ring_attention: out of host memory");
  }
  if (layout == FA_SHARD_ZIGZAG && 2 * (int64_t)n > L) {
    st = fa_fail(ctx, FA_ERR_SHAPE, "flashattn: ring_attention: %d zigzag shards need 2n <= L, got L = %lld", n,
                 (long long)L);
    goto done;
  }
  int64_t pos = 0; /* contiguous: the next shard's first position */
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
      pcs[2 * i] = (piece){i, 0, qs[i]->shape[sd], pos};
      pos += qs[i]->shape[sd];
    }
  }
  /* f64: each pair by the f64 reference (its lse is f64, the merge's
   * weights stay exact to f64); else fa_attention's pieces, their states
   * merged in f32 and their lse in f64 (an f32 lse near 8192 is off by up
   * to 5e-4 on a piece's weight: tests/lua/test_ring.lua) */
  /* mask_mod's host copies, for mask_mod_visible */
  if (opts->mask_mod && (st = fa_expr_begin(ctx, NULL, opts->mask_mod, 1))) goto done;
  const int reference = q0->dtype == FA_F64;
  const ring_call rc = {opts, d.B, d.Hq, L, reference, reference ? FA_F64 : FA_F32, FA_F64,
                        reference ? FA_CPU : q0->storage->device, lens};
  for (int r = 0; r < n && !st; r++)
    for (int i = 0; i < n && !st; i++) {
      const int j = ((i - r) % n + n) % n; /* the K/V shard that reaches shard i at step r */
      for (int a = 0; a < npc[i] && !st; a++)
        for (int b = 0; b < npc[j] && !st; b++) {
          const piece *qp = &pcs[2 * i + a], *kp = &pcs[2 * j + b];
          /* a query piece's own chunk always runs (its diagonal is in every band), so every state is made */
          if (qp->chunk != kp->chunk && !pair_visible(&rc, qp, kp)) continue;
          state s = {NULL, NULL};
          st = attend_pair(ctx, &rc, qs[i], ks[j], vs[j], qp, kp, &s);
          if (!st) st = merge_into(ctx, &acc[2 * i + a], &s);
          fa_tensor_drop(&s.o), fa_tensor_drop(&s.lse);
        }
    }
  /* the outputs: q's shape with v's last dimension, q's dtype; lse f32 */
  for (int i = 0; i < n && !st; i++) {
    fa_tensor *qi = qs[i];
    int64_t shape[FA_MAX_DIMS];
    for (int k = 0; k < qi->ndim; k++) shape[k] = qi->shape[k];
    shape[qi->ndim - 1] = vs[i]->shape[qi->ndim - 1];
    if ((st = fa_tensor_new(ctx, qi->ndim, shape, qi->dtype, q0->storage->device, &outs[i]))) break;
    if (lses && (st = fa_tensor_new(ctx, qi->ndim - 1, shape, FA_F32, q0->storage->device, &lses[i]))) break;
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
  free(pcs), free(acc), free(npc), free(lens);
  return st;
}
