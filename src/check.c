/* Argument checking for every operation (see check.h). */
#include "check.h"
#include "attn_kernels.h"
#include "expr.h"

#include "cpu/attention_tiles.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FA_MAX_HEAD_DIM 65536

int fa_is_float_dtype(fa_dtype d) { return d == FA_F32 || d == FA_F16 || d == FA_BF16 || d == FA_F64; }

fa_status fa_check_tensor(fa_context *ctx, const fa_tensor *t, const char *name) {
  if (!t) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: %s: expected a tensor, got NULL", name);
  return FA_OK;
}

static fa_status check_float(fa_context *ctx, const fa_tensor *t, const char *name) {
  fa_status st = fa_check_tensor(ctx, t, name);
  if (st) return st;
  if (!fa_is_float_dtype(t->dtype))
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: %s: expected a float dtype (f32, f16, bf16, f64), got %s", name,
                   fa_dtype_name(t->dtype));
  return FA_OK;
}

static fa_status check_like(fa_context *ctx, const fa_tensor *t, const char *name, const fa_tensor *ref,
                            const char *refname) {
  if (t->dtype != ref->dtype)
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: %s: expected dtype %s (as %s), got %s", name,
                   fa_dtype_name(ref->dtype), refname, fa_dtype_name(t->dtype));
  if (t->storage->device != ref->storage->device)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: %s: expected device %s (as %s), got %s", name,
                   fa_device_name(ref->storage->device), refname, fa_device_name(t->storage->device));
  return FA_OK;
}

static fa_status check_device_of(fa_context *ctx, const fa_tensor *t, const char *name, fa_device dev) {
  if (t->storage->device != dev)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: %s: expected device %s, got %s", name, fa_device_name(dev),
                   fa_device_name(t->storage->device));
  return FA_OK;
}

static int cmp_offset(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* 1 when two elements of t have one offset, 0 when none do, -1 when t is
 * too large to tell (strides that interleave, past 2^16 elements) or the
 * host is out of memory.  Strides that nest (fa_tensor_injective: every
 * layout a view of a dense tensor has) need no count. */
static int shares_elements(const fa_tensor *t) {
  if (fa_tensor_injective(t)) return 0;
  const int64_t n = fa_tensor_numel(t);
  if (n > ((int64_t)1 << 16)) return -1;
  int64_t *off = malloc(sizeof *off * (size_t)n), idx[FA_MAX_DIMS] = {0};
  if (!off) return -1;
  for (int64_t e = 0; e < n; e++) {
    int64_t o = 0;
    for (int d = 0; d < t->ndim; d++) o += idx[d] * t->strides[d];
    off[e] = o;
    for (int d = t->ndim - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
  }
  qsort(off, (size_t)n, sizeof *off, cmp_offset);
  int shared = 0;
  for (int64_t e = 1; e < n && !shared; e++) shared = off[e] == off[e - 1];
  free(off);
  return shared;
}

fa_status fa_check_writable(fa_context *ctx, const fa_tensor *out, const char *name) {
  if (fa_tensor_numel(out) == 0) return FA_OK;
  for (int i = 0; i < out->ndim; i++)
    if (out->strides[i] == 0 && out->shape[i] > 1)
      return fa_fail(ctx, FA_ERR_ARGUMENT,
                     "flashattn: %s: dimension %d has stride 0 over %lld elements; expected an output whose elements "
                     "do not share memory",
                     name, i + 1, (long long)out->shape[i]);
  const int shared = shares_elements(out);
  if (shared == 1)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: %s: its strides give two elements one address; expected an output whose elements do "
                   "not share memory",
                   name);
  if (shared < 0)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: %s: strides that interleave over more than 65536 elements (whether two elements share "
                   "memory is not checked that far); expected an output whose dimensions nest (any view of a dense "
                   "tensor)",
                   name);
  return FA_OK;
}

/* An output: fa_check_out, and writable. */
static fa_status check_output(fa_context *ctx, const fa_tensor *out, const char *name, int ndim, const int64_t *shape,
                              fa_dtype dtype, fa_device device) {
  fa_status st = fa_check_out(ctx, out, name, ndim, shape, dtype, device);
  return st ? st : fa_check_writable(ctx, out, name);
}

fa_status fa_check_out(fa_context *ctx, const fa_tensor *out, const char *name, int ndim, const int64_t *shape,
                       fa_dtype dtype, fa_device device) {
  int same = out->ndim == ndim;
  for (int i = 0; same && i < ndim; i++) same = out->shape[i] == shape[i];
  if (!same) {
    char want[64] = "", got[64];
    size_t u = 0;
    for (int i = 0; i < ndim && u < sizeof want; i++)
      u += (size_t)snprintf(want + u, sizeof want - u, i ? "x%lld" : "%lld", (long long)shape[i]);
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: expected shape %s, got %s", name, want,
                   fa_shape_str(out, got, sizeof got));
  }
  if (out->dtype != dtype)
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: %s: expected dtype %s, got %s", name, fa_dtype_name(dtype),
                   fa_dtype_name(out->dtype));
  return check_device_of(ctx, out, name, device);
}

/* (B, H, L, D) of a rank 2-4 attention operand. */
static void bhld(const fa_tensor *t, int64_t *b, int64_t *h, int64_t *l, int64_t *d) {
  int r = t->ndim;
  *b = r == 4 ? t->shape[0] : 1;
  *h = r >= 3 ? t->shape[r - 3] : 1;
  *l = t->shape[r - 2];
  *d = t->shape[r - 1];
}

static fa_status check_mask(fa_context *ctx, const fa_tensor *m, const fa_attn_dims *d) {
  if (m->dtype != FA_BOOL && !fa_is_float_dtype(m->dtype))
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: opts.mask: expected a bool or float tensor, got %s",
                   fa_dtype_name(m->dtype));
  fa_status st = check_device_of(ctx, m, "opts.mask", d->device);
  if (st) return st;
  const int64_t target[4] = {d->B, d->Hq, d->Lq, d->Lk};
  for (int i = 0; i < m->ndim; i++) {
    int64_t want = target[4 - m->ndim + i], got = m->shape[i];
    if (got != 1 && got != want) {
      char buf[64];
      return fa_fail(ctx, FA_ERR_SHAPE,
                     "flashattn: opts.mask: shape %s does not broadcast to (B, Hq, Lq, Lk) = (%lld, %lld, %lld, "
                     "%lld): dimension %d is %lld, expected 1 or %lld",
                     fa_shape_str(m, buf, sizeof buf), (long long)d->B, (long long)d->Hq, (long long)d->Lq,
                     (long long)d->Lk, i + 1, (long long)got, (long long)want);
    }
  }
  return FA_OK;
}

/* opts.score_mod and opts.mask_mod (API §9): both backends and the
 * reference take them, with every algo (on cuda compiled into its kernels
 * at run time).  The tensors an expression captured are on the call's
 * device (the reference reads host copies of any device's).  On cuda a
 * block mask is checked against the call's shape (its tile is used where
 * it divides the kernels', kernels/attention/attention_variant.cu). */
static fa_status check_variants(fa_context *ctx, const fa_attention_opts *o, int reference, const fa_attn_dims *d) {
  const fa_expr *ex[2] = {o->score_mod, o->mask_mod};
  const char *name[2] = {"opts.score_mod", "opts.mask_mod"};
  for (int i = 0; i < 2; i++) {
    const fa_expr *e = ex[i];
    if (!e) continue;
    if (e->nodes[e->n - 1].is_bool != (i == 1))
      return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: %s: expected an expression of %s, got one of %s", name[i],
                     i ? "booleans" : "numbers", i ? "numbers" : "booleans");
    if (reference) continue;
    for (int t = 0; t < e->ntensors; t++)
      if (e->tensors[t]->storage->device != d->device)
        return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: %s: the captured tensor %s is on %s, expected %s (the call's device)",
                       name[i], e->names[t], fa_device_name(e->tensors[t]->storage->device),
                       fa_device_name(d->device));
  }
  const fa_block_mask *m = o->block_mask;
  if (!m) return FA_OK;
  if (!o->mask_mod)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.block_mask: needs opts.mask_mod (the function it was made from)");
  if (m->expr != fa_expr_fingerprint(o->mask_mod))
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.block_mask: made from another mask_mod than the call's (their traced expressions "
                   "or the tensors they captured differ)");
  /* the references evaluate mask_mod on every pair: any tile, but the call's sizes */
  const int64_t br = reference || d->device == FA_CUDA ? m->Br : o->tile_q ? o->tile_q : FA_CPU_DEFAULT_TILE_Q;
  const int64_t bc = reference || d->device == FA_CUDA ? m->Bc : o->tile_k ? o->tile_k : FA_CPU_DEFAULT_TILE_K;
  if (m->B != d->B || m->H != d->Hq || m->Lq != d->Lq || m->Lk != d->Lk || m->Br != br || m->Bc != bc)
    return fa_fail(ctx, FA_ERR_SHAPE,
                   "flashattn: opts.block_mask: made for (B, H, Lq, Lk) = (%lld, %lld, %lld, %lld) and tile {%lld, %lld}, "
                   "the call has (%lld, %lld, %lld, %lld) and tile {%lld, %lld}",
                   (long long)m->B, (long long)m->H, (long long)m->Lq, (long long)m->Lk, (long long)m->Br,
                   (long long)m->Bc, (long long)d->B, (long long)d->Hq, (long long)d->Lq, (long long)d->Lk,
                   (long long)br, (long long)bc);
  return FA_OK;
}

/* opts.tile: 0 (both) is the backend's default; FA_TILE_ZERO is a 0 the
 * user wrote, checked (and shown) as 0 so that it fails like any size out
 * of range, with the backend's own range in the message. */
static fa_status check_tile(fa_context *ctx, const fa_attention_opts *o, const fa_attn_dims *d) {
  if (!o->tile_q && !o->tile_k) return FA_OK;
  int64_t br = o->tile_q == FA_TILE_ZERO ? 0 : o->tile_q, bc = o->tile_k == FA_TILE_ZERO ? 0 : o->tile_k;
  if (d->device == FA_CUDA) return fa_cuda_attention_check_tile(ctx, d->dtype, d->D, d->Dv, br, bc);
  if (br < FA_CPU_TILE_MIN || br > FA_CPU_TILE_MAX || bc < FA_CPU_TILE_MIN || bc > FA_CPU_TILE_MAX)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.tile: expected {Br, Bc} with %d <= Br <= %d and %d <= Bc <= %d, got {%lld, %lld}",
                   FA_CPU_TILE_MIN, FA_CPU_TILE_MAX, FA_CPU_TILE_MIN, FA_CPU_TILE_MAX, (long long)br, (long long)bc);
  return FA_OK;
}

fa_status fa_check_attention(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                             int reference, fa_attn_dims *d) {
  fa_status st;
  d->kernel = FA_KERNEL_AUTO;
  d->kernel_br = d->kernel_bc = 0;
  if ((st = check_float(ctx, q, "q")) || (st = fa_check_tensor(ctx, k, "k")) || (st = fa_check_tensor(ctx, v, "v")))
    return st;
  if ((st = check_like(ctx, k, "k", q, "q")) || (st = check_like(ctx, v, "v", q, "q"))) return st;
  if (q->ndim < 2)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: q: expected 2-D (L, D), 3-D (H, L, D) or 4-D (B, H, L, D), got %d-D",
                   q->ndim);
  if (k->ndim != q->ndim || v->ndim != q->ndim)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: expected %d-D like q, got %d-D", k->ndim != q->ndim ? "k" : "v",
                   q->ndim, k->ndim != q->ndim ? k->ndim : v->ndim);
  int64_t Bk, Hv, Lv, Bv;
  bhld(q, &d->B, &d->Hq, &d->Lq, &d->D);
  bhld(k, &Bk, &d->Hkv, &d->Lk, &Bv);
  if (Bv != d->D)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: k: head dimension %lld differs from q's %lld", (long long)Bv,
                   (long long)d->D);
  bhld(v, &Bv, &Hv, &Lv, &d->Dv);
  if (Bk != d->B || Bv != d->B)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: batch size %lld differs from q's %lld", Bk != d->B ? "k" : "v",
                   (long long)(Bk != d->B ? Bk : Bv), (long long)d->B);
  if (Hv != d->Hkv)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: v: %lld heads differ from k's %lld", (long long)Hv, (long long)d->Hkv);
  if (Lv != d->Lk)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: v: length %lld differs from k's %lld", (long long)Lv, (long long)d->Lk);
  if (d->Hkv == 0)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: k: 0 heads (Hkv must be >= 1; q has %lld)", (long long)d->Hq);
  if (d->Hq % d->Hkv)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: q has %lld heads, not a multiple of k's %lld (Hq %% Hkv must be 0)",
                   (long long)d->Hq, (long long)d->Hkv);
  if (d->D < 1 || d->Dv < 1)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: head dimension must be >= 1, got 0", d->D < 1 ? "q" : "v");
  if (d->D > FA_MAX_HEAD_DIM || d->Dv > FA_MAX_HEAD_DIM) /* BLAS takes int sizes; no head is this wide */
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: head dimension %lld is above the largest supported, %d",
                   d->D > FA_MAX_HEAD_DIM ? "q" : "v", (long long)(d->D > FA_MAX_HEAD_DIM ? d->D : d->Dv),
                   FA_MAX_HEAD_DIM);
  if (d->Lq > INT32_MAX || d->Lk > INT32_MAX)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: sequence length %lld is above %d", d->Lq > INT32_MAX ? "q" : "k",
                   (long long)(d->Lq > INT32_MAX ? d->Lq : d->Lk), INT32_MAX);
  d->rank = q->ndim;
  d->variant = 0;
  d->alibi_on_device = 0;
  d->device = q->storage->device;
  d->dtype = q->dtype;
  return o ? fa_check_attention_options(ctx, q, o, reference, d) : FA_OK;
}

fa_status fa_check_attention_options(fa_context *ctx, const fa_tensor *q, const fa_attention_opts *o, int reference,
                                     fa_attn_dims *d) {
  fa_status st;
  if ((unsigned)o->algo > FA_ATTN_FLASH)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.algo: expected auto, naive, two_pass, flash_row or flash");
  d->algo = o->algo == FA_ATTN_AUTO ? FA_ATTN_FLASH : o->algo;
  d->variant = o->score_mod || o->mask_mod;
  if (o->splits < 0 || o->splits > INT32_MAX) /* here, so that the cost and the kernel listing refuse it too */
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.splits: expected an integer from 1 to %d or \"auto\" (0), got %lld",
                   INT32_MAX, (long long)o->splits); /* the upper bound named: 2^31 is >= 1 too */
  if (o->has_scale && !isfinite(o->scale))
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.scale: expected a finite number, got %g", o->scale);
  /* every backend but f64 multiplies by (float)scale: past f32's range
   * that is inf, and the scores inf or NaN */
  if (o->has_scale && !reference && d->dtype != FA_F64 && fabs(o->scale) > FLT_MAX)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.scale: expected |scale| <= %g (f32's range: %s inputs compute in f32; f64 inputs "
                   "and attention_reference take any finite scale), got %g",
                   (double)FLT_MAX, fa_dtype_name(d->dtype), o->scale);
  if ((unsigned)o->causal > FA_CAUSAL_TOP_LEFT)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.causal: expected false, true, \"bottom_right\" or \"top_left\"");
  if (o->has_window && (o->window_left < -1 || o->window_right < -1))
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.window: expected {left, right} with values >= -1, got {%lld, %lld}",
                   (long long)o->window_left, (long long)o->window_right);
  if (!(o->softcap >= 0) || isinf(o->softcap))
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.softcap: expected a finite number >= 0 (0 = off), got %g",
                   o->softcap);
  if (!o->kv_lens && o->n_kv_lens)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.kv_lens: NULL with n_kv_lens = %lld (both or neither)",
                   (long long)o->n_kv_lens);
  if (!o->alibi && o->n_alibi)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.alibi: NULL with n_alibi = %lld (both or neither)",
                   (long long)o->n_alibi);
  if (o->kv_lens) {
    if (o->n_kv_lens != d->B)
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: opts.kv_lens: expected %lld entries (one per batch), got %lld",
                     (long long)d->B, (long long)o->n_kv_lens);
    for (int64_t b = 0; b < d->B; b++)
      if (o->kv_lens[b] < 0 || o->kv_lens[b] > d->Lk)
        return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.kv_lens[%lld]: expected 0 to Lk = %lld, got %lld",
                       (long long)b + 1, (long long)d->Lk, (long long)o->kv_lens[b]);
  }
  if (o->alibi) {
    if (o->n_alibi != d->Hq)
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: opts.alibi: expected %lld slopes (one per query head), got %lld",
                     (long long)d->Hq, (long long)o->n_alibi);
    for (int64_t h = 0; h < d->Hq; h++)
      if (!isfinite(o->alibi[h]))
        return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.alibi[%lld]: expected a finite slope, got %g",
                       (long long)h + 1, o->alibi[h]);
  }
  if ((st = check_tile(ctx, o, d))) return st;
  if (o->mask && (st = check_mask(ctx, o->mask, d))) return st;
  if ((st = check_variants(ctx, o, reference, d))) return st;

  int64_t oshape[4], lshape[4];
  for (int i = 0; i < d->rank - 1; i++) oshape[i] = lshape[i] = q->shape[i];
  oshape[d->rank - 1] = d->Dv;
  /* the reference's results are f64 on the CPU, and so are the outputs it writes */
  const fa_dtype odt = reference ? FA_F64 : d->dtype, ldt = reference ? FA_F64 : FA_F32;
  const fa_device odev = reference ? FA_CPU : d->device;
  if (o->out && (st = check_output(ctx, o->out, "opts.out", d->rank, oshape, odt, odev))) return st;
  if (o->lse_out && (st = check_output(ctx, o->lse_out, "opts.lse_out", d->rank - 1, lshape, ldt, odev))) return st;
  /* both are written: whichever came last would overwrite the other */
  if (o->out && o->lse_out && fa_tensor_overlaps(o->out, o->lse_out))
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.lse_out: overlaps opts.out in memory (intersecting byte ranges); "
                   "expected two disjoint outputs");
  return FA_OK;
}

fa_status fa_check_attention_or_defaults(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                                         const fa_attention_opts **opts, fa_attention_opts *defaults, fa_attn_dims *d) {
  if (!*opts) {
    fa_attention_opts_init(defaults);
    *opts = defaults;
  }
  return fa_check_attention(ctx, q, k, v, *opts, 0, d);
}

/* The quoted names of the kernels on device dev (accepting: those that
 * accept the call of d with algo and tile {tq, tk}) into buf; "none" when
 * there are none. */
static const char *kernel_names(const fa_attn_dims *d, fa_device dev, int accepting, fa_attention_algo algo,
                                int64_t tq, int64_t tk, char *buf, size_t n) {
  const char *names[FA_KERNEL_COUNT];
  int count = 0;
  if (accepting) {
    count = fa_attn_kernels_accepting(d, algo, tq, tk, NULL, 1, names, FA_KERNEL_COUNT); /* an error's list: any order */
  } else {
    for (int k = 0; k < FA_KERNEL_COUNT; k++)
      if (fa_attn_kernel_table[k].device == dev) names[count++] = fa_attn_kernel_table[k].name;
  }
  size_t u = 0;
  buf[0] = 0;
  for (int i = 0; i < count && u < n; i++) u += (size_t)snprintf(buf + u, n - u, i ? ", \"%s\"" : "\"%s\"", names[i]);
  return count ? buf : "none";
}

fa_status fa_check_attention_kernel_name(fa_context *ctx, const fa_attention_opts *o, const fa_attn_dims *d,
                                        fa_attn_kernel *k) {
  const int given = o && o->kernel && o->kernel[0];
  *k = given ? fa_attn_kernel_find(o->kernel) : FA_KERNEL_AUTO;
  if (!given || *k != FA_KERNEL_AUTO) return FA_OK;
  char list[192];
  return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.kernel: unknown kernel \"%.64s\"; the kernels on %s: %s",
                 o->kernel, fa_device_name(d->device), kernel_names(d, d->device, 0, o->algo, 0, 0, list, sizeof list));
}

fa_status fa_check_attention_kernel(fa_context *ctx, const fa_attention_opts *o, fa_attn_dims *d) {
  fa_attn_kernel k;
  fa_status st = fa_check_attention_kernel_name(ctx, o, d, &k);
  if (st || k == FA_KERNEL_AUTO) return st;
  char list[192], why[192];
  const int64_t tq = o->tile_q, tk = o->tile_k;
  /* the reason is the pointer returned (a literal, or why filled in) */
  const char *reason = fa_attn_kernel_refuses(k, d, o->algo, tq, tk, &d->kernel_br, &d->kernel_bc, why, sizeof why);
  if (reason)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                   "flashattn: opts.kernel: \"%s\" does not accept this call (%s); the kernels that accept it: %s",
                   fa_attn_kernel_table[k].name, reason, kernel_names(d, d->device, 1, o->algo, tq, tk, list, sizeof list));
  d->kernel = k;
  if (o->algo == FA_ATTN_AUTO) d->algo = fa_attn_kernel_table[k].algo;
  return FA_OK;
}

/* o, lse, dout of a backward call against the forward's dims d (from
 * fa_check_attention): o and dout (…, Lq, Dv), lse (…, Lq), all on q's
 * device; o and dout in q's dtype (any float dtype for the reference, as
 * fa.attention_reference gives f64), lse any float dtype. */
fa_status fa_check_attention_backward(fa_context *ctx, fa_tensor *q, fa_tensor *o, fa_tensor *lse, fa_tensor *dout,
                                      int reference, const fa_attn_dims *d) {
  fa_status st;
  if ((st = check_float(ctx, o, "o")) || (st = check_float(ctx, lse, "lse")) || (st = check_float(ctx, dout, "dout")))
    return st;
  int64_t oshape[4];
  for (int i = 0; i < d->rank - 1; i++) oshape[i] = q->shape[i];
  oshape[d->rank - 1] = d->Dv;
  const fa_dtype odt = reference ? o->dtype : d->dtype, ddt = reference ? dout->dtype : d->dtype;
  if ((st = fa_check_out(ctx, o, "o", d->rank, oshape, odt, d->device)) ||
      (st = fa_check_out(ctx, dout, "dout", d->rank, oshape, ddt, d->device)) ||
      (st = fa_check_out(ctx, lse, "lse", d->rank - 1, oshape, lse->dtype, d->device)))
    return st;
  return FA_OK;
}

fa_status fa_check_softmax(fa_context *ctx, fa_tensor *x, const fa_softmax_opts *o) {
  fa_status st = check_float(ctx, x, "x");
  if (st || !o) return st;
  if ((unsigned)o->algo > FA_SOFTMAX_FUSED)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.algo: expected auto, naive, safe, online or fused");
  if (o->block < 0 || o->block > (1 << 24))
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.block: expected 1 to %d (0 = default), got %lld", 1 << 24,
                   (long long)o->block);
  int64_t n = x->shape[x->ndim - 1];
  if (o->algo == FA_SOFTMAX_FUSED) {
    int64_t maxn = fa_softmax_fused_max_n(ctx, x->dtype, x->storage->device);
    if (n > maxn)
      return fa_fail(ctx, FA_ERR_ARGUMENT,
                     "flashattn: fused softmax holds a row on chip: the largest row it supports for %s on %s is "
                     "N = %lld, got N = %lld (use algo \"online\")",
                     fa_dtype_name(x->dtype), fa_device_name(x->storage->device), (long long)maxn, (long long)n);
  }
  if (o->out) return check_output(ctx, o->out, "opts.out", x->ndim, x->shape, x->dtype, x->storage->device);
  return FA_OK;
}

fa_status fa_check_matmul(fa_context *ctx, fa_tensor *a, fa_tensor *b, const fa_matmul_opts *o) {
  fa_status st;
  if ((st = check_float(ctx, a, "a")) || (st = fa_check_tensor(ctx, b, "b")) || (st = check_like(ctx, b, "b", a, "a")))
    return st;
  if (a->ndim != 2 || b->ndim != 2)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: matmul: %s: expected a 2-D tensor, got %d-D", a->ndim != 2 ? "a" : "b",
                   a->ndim != 2 ? a->ndim : b->ndim);
  if (a->shape[1] != b->shape[0]) {
    char ba[64], bb[64];
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: matmul: inner dimensions differ: a is %s, b is %s",
                   fa_shape_str(a, ba, sizeof ba), fa_shape_str(b, bb, sizeof bb));
  }
  if (!o) return FA_OK;
  if ((unsigned)o->algo > FA_MATMUL_BLAS)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.algo: expected auto, naive, tiled or blas");
  if (o->tile < 0 || o->tile > 1024)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: opts.tile: expected 1 to 1024 (0 = default), got %lld",
                   (long long)o->tile);
  if (o->out) {
    int64_t shape[2] = {a->shape[0], b->shape[1]};
    return check_output(ctx, o->out, "opts.out", 2, shape, a->dtype, a->storage->device);
  }
  return FA_OK;
}

fa_status fa_check_merge(fa_context *ctx, fa_tensor *o1, fa_tensor *lse1, fa_tensor *o2, fa_tensor *lse2) {
  const fa_merge_names n = {"o1", "lse1", "o2", "lse2"};
  return fa_check_merge_named(ctx, o1, lse1, o2, lse2, &n);
}

fa_status fa_check_merge_named(fa_context *ctx, fa_tensor *o1, fa_tensor *lse1, fa_tensor *o2, fa_tensor *lse2,
                               const fa_merge_names *n) {
  fa_status st;
  if ((st = check_float(ctx, o1, n->o1)) || (st = fa_check_tensor(ctx, o2, n->o2)) ||
      (st = check_like(ctx, o2, n->o2, o1, n->o1)) || (st = check_float(ctx, lse1, n->lse1)) ||
      (st = fa_check_tensor(ctx, lse2, n->lse2)) || (st = check_like(ctx, lse2, n->lse2, lse1, n->lse1)) ||
      (st = check_device_of(ctx, lse1, n->lse1, o1->storage->device)))
    return st;
  char b1[64], b2[64], b3[64];
  if (o1->ndim != o2->ndim) goto shape;
  if (lse1->ndim != lse2->ndim) goto lse;
  for (int i = 0; i < o1->ndim; i++)
    if (o1->shape[i] != o2->shape[i]) goto shape;
  if (lse1->ndim != o1->ndim - 1 && !(o1->ndim == 1 && lse1->ndim == 1 && lse1->shape[0] == 1)) goto lse;
  for (int i = 0; i < lse1->ndim; i++)
    if (lse1->shape[i] != lse2->shape[i] || (o1->ndim > 1 && lse1->shape[i] != o1->shape[i])) goto lse;
  return FA_OK;
shape:
  return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: merge_states: %s (%s) and %s (%s) must have one shape", n->o1,
                 fa_shape_str(o1, b1, sizeof b1), n->o2, fa_shape_str(o2, b2, sizeof b2));
lse:
  if (strcmp(n->lse1, n->lse2) == 0) /* the first state against itself: name it once */
    return fa_fail(ctx, FA_ERR_SHAPE,
                   "flashattn: merge_states: lse must have o's shape without its last dimension: %s is %s, %s is %s",
                   n->o1, fa_shape_str(o1, b1, sizeof b1), n->lse1, fa_shape_str(lse1, b2, sizeof b2));
  return fa_fail(ctx, FA_ERR_SHAPE,
                 "flashattn: merge_states: lse must have o's shape without its last dimension: %s is %s, %s is %s, %s is %s",
                 n->o1, fa_shape_str(o1, b1, sizeof b1), n->lse1, fa_shape_str(lse1, b2, sizeof b2), n->lse2,
                 fa_shape_str(lse2, b3, sizeof b3));
}
