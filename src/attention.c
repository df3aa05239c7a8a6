/* fa_attention and fa_attention_reference: check once, resolve the options
 * into an fa_attn_problem, and hand it to a backend. */
#include "attn_kernels.h"
#include "check.h"
#include "expr.h"
#include "cpu/attention_tiles.h"
#include "splits.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

void fa_attention_opts_init(fa_attention_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->window_left = o->window_right = -1;
}

void fa_attn_buffers_drop(fa_context *ctx, fa_attn_buffers *b) {
  fa_tensor_drop(&b->q);
  fa_tensor_drop(&b->k);
  fa_tensor_drop(&b->v);
  fa_tensor_drop(&b->mask);
  fa_tensor_drop(&b->o);
  fa_tensor_drop(&b->lse);
  fa_cuda_free_on(ctx, b->kv_lens, b->kv_bytes); /* stream-ordered: after the kernels */
  fa_cuda_free_on(ctx, b->alibi, b->alibi_bytes);
  b->kv_lens = b->alibi = NULL;
}

void fa_attn_fit_tiles(fa_attn_problem *p) {
  const int64_t lq = p->Lq > 1 ? p->Lq : 1, lk = p->Lk > 1 ? p->Lk : 1;
  if (p->tile_q > lq) p->tile_q = lq;
  if (p->tile_k > lk) p->tile_k = lk;
}

/* The options every backend reads the same way: shapes, scale, softcap,
 * causal alignment, window, the compute dtype (p is cleared first).  Every
 * compute dtype but f64 works in f32, where softcap is taken as f32 takes
 * it: past f32's range c·tanh(s/c) is s (off; c = inf would give inf·0 =
 * NaN), a c that rounds to 0 is the least normal (0/0 at s = 0). */
void fa_attn_resolve_options(const fa_attention_opts *o, const fa_attn_dims *d, fa_dtype compute, fa_attn_problem *p) {
  memset(p, 0, sizeof *p);
  p->B = d->B, p->Hq = d->Hq, p->Hkv = d->Hkv, p->Lq = d->Lq, p->Lk = d->Lk, p->D = d->D, p->Dv = d->Dv;
  p->scale = o->has_scale ? o->scale : 1.0 / sqrt((double)d->D);
  p->compute = p->storage = p->o_dtype = compute;
  p->softcap = o->softcap;
  if (compute != FA_F64 && p->softcap > 0) p->softcap = isinf((float)p->softcap) ? 0 : fmax(p->softcap, FLT_MIN);
  p->scale_f = (float)p->scale;
  p->softcap_f = (float)p->softcap, p->inv_softcap_f = p->softcap > 0 ? (float)(1.0 / p->softcap) : 0.f;
  p->causal = o->causal;
  p->has_window = o->has_window && (o->window_left >= 0 || o->window_right >= 0);
  p->win_left = o->window_left, p->win_right = o->window_right;
  fa_attn_strides_contiguous(p);
}

void fa_attn_strides_contiguous(fa_attn_problem *p) {
  p->q_st = fa_attn_strides_dense(p->Hq, p->Lq, p->D);
  p->k_st = fa_attn_strides_dense(p->Hkv, p->Lk, p->D);
  p->v_st = fa_attn_strides_dense(p->Hkv, p->Lk, p->Dv);
  p->o_st = fa_attn_strides_dense(p->Hq, p->Lq, p->Dv);
  p->lse_st = fa_attn_strides_dense(p->Hq, p->Lq, 1);
}

/* Points p at the mask as `buf` holds it (bool or float: the caller's
 * tensor or a converted copy), with buf's strides right-aligned over
 * (B, Hq, Lq, Lk): 0 where m has size 1. */
void fa_attn_attach_mask(fa_attn_problem *p, const fa_tensor *m, fa_tensor *buf) {
  if (m->dtype == FA_BOOL) p->mask_b = fa_tensor_ptr(buf);
  else p->mask_f = fa_tensor_ptr(buf), p->mask_dtype = buf->dtype;
  for (int i = 0; i < 4; i++) p->mask_strides[i] = 0;
  for (int i = 0; i < m->ndim; i++) p->mask_strides[4 - m->ndim + i] = m->shape[i] == 1 ? 0 : buf->strides[i];
}

/* Operands where they lie (API §6): defined with the CUDA path below,
 * which takes them the same way. */
static void row_strides(const fa_tensor *t, int inner, fa_attn_strides *st);
static int readable_in_place(const fa_tensor *t, fa_attn_strides *st);
static int writable_in_place(const fa_tensor *t, int inner, const fa_attn_buffers *b, const fa_tensor *other);

/* t itself (retained; *st its strides) when the CPU kernels read it where
 * it lies: a host tensor of dtype dt, readable in place, its row stride an
 * int (BLAS's leading dimensions).  Else a contiguous copy in dt, and *st
 * keeps the dense strides. */
fa_status fa_attn_cpu_operand(fa_context *ctx, fa_tensor *t, fa_dtype dt, fa_tensor **buf, fa_attn_strides *st) {
  fa_attn_strides here;
  if (t->storage->device != FA_CPU || t->dtype != dt || !readable_in_place(t, &here) || here.s > INT_MAX)
    return fa_tensor_cpu_contiguous(ctx, t, dt, buf);
  fa_tensor_retain(t);
  *buf = t;
  *st = here;
  return FA_OK;
}

/* The mask as the CPU kernels read it: m itself (retained) when it is a host
 * tensor of bool or the compute dtype, or f16/bf16 read by f32 kernels, at
 * any strides (every kernel indexes it by its four, fa_attn_attach_mask),
 * else a contiguous copy in the compute dtype. */
fa_status fa_attn_cpu_mask(fa_context *ctx, fa_tensor *m, fa_dtype compute, fa_tensor **buf) {
  const int half = (m->dtype == FA_F16 || m->dtype == FA_BF16) && compute == FA_F32;
  const fa_dtype want = m->dtype == FA_BOOL || half ? m->dtype : compute;
  if (m->storage->device != FA_CPU || m->dtype != want) return fa_tensor_cpu_contiguous(ctx, m, want, buf);
  fa_tensor_retain(m);
  *buf = m;
  return FA_OK;
}

/* Whether the CPU kernels write the caller's output t (dtype dt; inner and
 * other as for writable_in_place) where it lies, its row stride an int as
 * for the inputs; then *st its strides (else *st is left dense). */
static int cpu_output_in_place(const fa_tensor *t, fa_dtype dt, int inner, const fa_attn_buffers *b,
                               const fa_tensor *other, fa_attn_strides *st) {
  fa_attn_strides here;
  if (!t || t->storage->device != FA_CPU || t->dtype != dt || !writable_in_place(t, inner, b, other)) return 0;
  row_strides(t, inner, &here);
  if (here.s > INT_MAX) return 0;
  *st = here;
  return 1;
}

/* Fills p from dims and opts; the inputs are read where they lie, or from
 * contiguous host copies (fa_attn_cpu_operand), in dtype storage: the
 * inputs' own for the kernels (f16/bf16 widened tile by tile), the compute
 * dtype for the reference; the output is written in o_dtype. */
static fa_status build_problem(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                               const fa_attn_dims *d, fa_dtype compute, fa_dtype storage, fa_dtype o_dtype,
                               fa_attn_problem *p, fa_attn_buffers *bufs) {
  fa_attn_resolve_options(o, d, compute, p);
  p->storage = storage, p->o_dtype = o_dtype;
  p->kv_lens = o->kv_lens;
  p->alibi = o->alibi;
  p->score_mod = o->score_mod, p->mask_mod = o->mask_mod;
  p->tile_q = o->tile_q ? o->tile_q : FA_CPU_DEFAULT_TILE_Q;
  p->tile_k = o->tile_k ? o->tile_k : FA_CPU_DEFAULT_TILE_K;
  p->tile_given = o->tile_q || o->tile_k;
  p->key_chunks = o->splits; /* a piece's are 1 */
  fa_attn_fit_tiles(p);
  fa_status st;
  if ((st = fa_attn_cpu_operand(ctx, q, storage, &bufs->q, &p->q_st)) ||
      (st = fa_attn_cpu_operand(ctx, k, storage, &bufs->k, &p->k_st)) ||
      (st = fa_attn_cpu_operand(ctx, v, storage, &bufs->v, &p->v_st)))
    return st;
  p->q = fa_tensor_ptr(bufs->q), p->k = fa_tensor_ptr(bufs->k), p->v = fa_tensor_ptr(bufs->v);
  if (o->mask) {
    fa_tensor *m = o->mask;
    if ((st = fa_attn_cpu_mask(ctx, m, compute, &bufs->mask))) return st;
    fa_attn_attach_mask(p, m, bufs->mask);
  }
  return FA_OK;
}

/* Whether t shares storage with any input buffer (then the kernels must
 * not write into it while they read the inputs).  The buffers are the
 * caller's tensors themselves where they are read in place. */
static int shares_input(const fa_tensor *t, const fa_attn_buffers *b) {
  const fa_tensor *in[4] = {b->q, b->k, b->v, b->mask};
  for (int i = 0; i < 4; i++)
    if (in[i] && fa_tensor_same_memory(in[i], t)) return 1;
  for (int e = 0; e < 2; e++) /* a score_mod's bias[b][h][q][k] is read while the rows are written */
    for (int i = 0; b->exprs[e] && i < b->exprs[e]->ntensors; i++)
      if (fa_tensor_same_memory(b->exprs[e]->tensors[i], t)) return 1;
  return 0;
}

/* Output buffers in dtype p->o_dtype (lse's: lse_dtype): the caller's, written through
 * their strides, when they are host tensors of that dtype that the kernels
 * can write where they lie (cpu_output_in_place: no two elements in one
 * place, no storage shared with the inputs or each other), else dense
 * temporaries copied out later. */
static fa_status prepare_outputs(fa_context *ctx, const fa_attention_opts *o, const fa_attn_dims *d, int want_lse,
                                 fa_tensor *out, fa_tensor *lse_out, fa_dtype lse_dtype,
                                 fa_attn_problem *p, fa_attn_buffers *bufs) {
  int64_t shape[4] = {d->B, d->Hq, d->Lq, d->Dv};
  fa_status st;
  if (cpu_output_in_place(out, p->o_dtype, 1, bufs, NULL, &p->o_st)) {
    fa_tensor_retain(out);
    bufs->o = out;
  } else if ((st = fa_tensor_new(ctx, 4, shape, p->o_dtype, FA_CPU, &bufs->o))) {
    return st;
  }
  p->o = fa_tensor_ptr(bufs->o);
  if (want_lse) {
    if (cpu_output_in_place(lse_out, lse_dtype, 0, bufs, bufs->o, &p->lse_st)) {
      fa_tensor_retain(lse_out);
      bufs->lse = lse_out;
    } else if ((st = fa_tensor_new(ctx, 3, shape, lse_dtype, FA_CPU, &bufs->lse))) {
      return st;
    }
    if (lse_dtype == FA_F64) p->lse64 = fa_tensor_ptr(bufs->lse);
    else p->lse = fa_tensor_ptr(bufs->lse);
  }
  (void)o;
  return FA_OK;
}

/* Whether a call's variants read captured tensors: such a call can fail
 * after its kernels ran (a read out of range, src/expr.h), so that its
 * outputs go to temporaries, copied into the caller's opts.out and
 * opts.lse_out only on success (on failure nothing else is written). */
static int variants_may_fault(const fa_expr *score_mod, const fa_expr *mask_mod) {
  return (score_mod && score_mod->ntensors > 0) || (mask_mod && mask_mod->ntensors > 0);
}

/* Wraps a computed (B,Hq,Lq,X) buffer in the caller's rank and copies it into
 * dst (a new tensor of dtype/device when dst is NULL). */
static fa_status deliver(fa_context *ctx, fa_tensor *buf, int rank, const fa_tensor *q, int64_t last, int has_last,
                         fa_tensor *dst, fa_dtype dtype, fa_device device, fa_tensor **result) {
  int64_t shape[4];
  int n = 0;
  for (int i = 0; i < rank - 1; i++) shape[n++] = q->shape[i];
  if (has_last) shape[n++] = last;
  if (n == 0) shape[n++] = 1;
  fa_status st;
  fa_tensor *view = NULL, *r = dst;
  if (dst && dst == buf) { /* computed in place, through dst's strides */
    fa_tensor_retain(dst);
    *result = dst;
    return FA_OK;
  }
  if ((st = fa_tensor_view(ctx, buf, n, shape, &view))) return st;
  if (!r) {
    if (dtype == view->dtype && device == view->storage->device) {
      *result = view;
      return FA_OK;
    }
    if ((st = fa_tensor_new(ctx, n, shape, dtype, device, &r))) goto done;
  } else {
    fa_tensor_retain(r);
  }
  if ((st = fa_tensor_copy(ctx, r, view))) fa_tensor_drop(&r);
done:
  fa_tensor_release(view);
  *result = r;
  return st;
}

fa_status fa_attn_deliver(fa_context *ctx, const fa_tensor *q, int rank, int64_t dv, fa_tensor *obuf, fa_tensor *lbuf,
                          fa_tensor *user_out, fa_tensor *user_lse, fa_dtype odt, fa_dtype ldt, fa_device dev,
                          fa_tensor **out, fa_tensor **lse) {
  fa_status st = deliver(ctx, obuf, rank, q, dv, 1, user_out, odt, dev, out);
  if (st || !lbuf) return st;
  fa_tensor *l = NULL;
  st = deliver(ctx, lbuf, rank, q, 0, 0, user_lse, ldt, dev, &l);
  if (st) fa_tensor_drop(out);
  else if (lse) *lse = l;
  else fa_tensor_release(l);
  return st;
}

/* Lk == 0 or every row empty needs no backend: zeros and lse = -inf,
 * through the outputs' strides (they may be the caller's views). */
static void fill_empty(const fa_attn_problem *p) {
  const size_t es = fa_dtype_size(p->o_dtype);
  const fa_attn_strides os = p->o_st, ls = p->lse_st;
  for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->Hq; h++)
      for (int64_t i = 0; i < p->Lq; i++) {
        memset((char *)p->o + (size_t)(b * os.b + h * os.h + i * os.s) * es, 0, (size_t)p->Dv * es);
        const int64_t l = b * ls.b + h * ls.h + i * ls.s;
        if (p->lse) p->lse[l] = -INFINITY;
        if (p->lse64) p->lse64[l] = -INFINITY;
      }
}

/* ---- CUDA: inputs stay in their dtype on the device ---- */

/* *st from the strides of t's dimensions before its last `inner` (1: an
 * operand's rows of X elements, 0: lse), right-aligned onto (batch, head,
 * sequence).  A dimension of one element gets the stride of a dense layout
 * (0, or the row length X for the sequence): it is never stepped, and the
 * kernels' alignment tests and cuBLAS's leading dimensions then see
 * ordinary values. */
static void row_strides(const fa_tensor *t, int inner, fa_attn_strides *st) {
  int64_t s[3] = {0, 0, inner ? t->shape[t->ndim - 1] : 1};
  const int outer = t->ndim - inner;
  for (int i = 0; i < outer; i++)
    if (t->shape[i] > 1) s[3 - outer + i] = t->strides[i];
  st->b = s[0], st->h = s[1], st->s = s[2];
}

/* Whether operand t (rank 2 to 4, rows of X elements) can be read where
 * it lies (API §6): its last dimension contiguous and its rows at least X
 * elements apart (cuBLAS's leading dimensions, in "naive"). */
static int readable_in_place(const fa_tensor *t, fa_attn_strides *st) {
  const int64_t X = t->shape[t->ndim - 1];
  if (X > 1 && t->strides[t->ndim - 1] != 1) return 0;
  row_strides(t, 1, st);
  return st->s >= X;
}

/* Whether the rows of device operand t (strides st) start on 16 bytes, as the tensor-core kernels' 16-byte copies need; or could not
 * anyway (rows of X elements not a multiple of 16 bytes), so that a copy
 * would not help. */
static int rows_fit_tensor_cores(const fa_tensor *t, const fa_attn_strides *st) {
  const int64_t es = (int64_t)fa_dtype_size(t->dtype), row = t->shape[t->ndim - 1] * es;
  return row % 16 || (((uintptr_t)fa_tensor_ptr(t) | (uint64_t)((st->b | st->h | st->s) * es)) % 16) == 0;
}

/* t itself (retained) when the kernels read it where it lies, else a
 * contiguous copy; *st its strides.  Rows off 16 bytes are copied too: in
 * place they would leave the call to the SIMT kernel, many times slower
 * than the tensor cores, for the price of one pass over the operand. */
fa_status fa_attn_operand_on_device(fa_context *ctx, fa_tensor *t, fa_tensor **buf, fa_attn_strides *st) {
  if (readable_in_place(t, st) && rows_fit_tensor_cores(t, st)) {
    fa_tensor_retain(t);
    *buf = t;
    return FA_OK;
  }
  fa_status st_ = fa_tensor_contiguous(ctx, t, buf);
  if (!st_) row_strides(*buf, 1, st);
  return st_;
}

/* Whether the CUDA kernels read operand t with rows its last dimension
 * apart: where it lies with that row stride, or as the dense copy
 * fa_attn_operand_on_device makes. */
static int device_rows_dense(const fa_tensor *t) {
  fa_attn_strides st;
  return !(readable_in_place(t, &st) && rows_fit_tensor_cores(t, &st)) || st.s == t->shape[t->ndim - 1];
}

/* Whether the kernels may write the caller's output t where it lies: rows
 * with a contiguous last dimension (inner = 1; lse: inner = 0), no two
 * elements in one place, sharing no storage with an input or with
 * `other` (the other output). */
static int writable_in_place(const fa_tensor *t, int inner, const fa_attn_buffers *b, const fa_tensor *other) {
  const int64_t X = inner ? t->shape[t->ndim - 1] : 1;
  if (inner && X > 1 && t->strides[t->ndim - 1] != 1) return 0;
  return fa_tensor_injective(t) && !shares_input(t, b) && !(other && fa_tensor_same_memory(other, t));
}

/* A device copy of n host values (kv_lens, alibi), freed by the caller. */
static fa_status upload(fa_context *ctx, const void *host, size_t bytes, void **dev) {
  fa_status st = fa_cuda_malloc(ctx, dev, bytes);
  if (!st && (st = fa_cuda_upload(ctx, *dev, host, bytes))) {
    fa_cuda_free_on(ctx, *dev, bytes);
    *dev = NULL;
  }
  return st;
}

/* The outputs of a call on cuda: the caller's opts.out and opts.lse_out
 * where the kernels can write them (API §6: their strides), else fresh
 * dense buffers; p->o, p->lse and their strides point at them.  lse_dtype
 * FA_F64 (an opts.splits piece, no lse_out): a fresh f64 lse at p->lse64. */
static fa_status cuda_outputs(fa_context *ctx, const fa_attention_opts *o, const fa_attn_dims *d, int want_lse,
                              fa_dtype lse_dtype, fa_attn_buffers *bufs, fa_attn_problem *p) {
  int64_t oshape[4] = {d->B, d->Hq, d->Lq, d->Dv};
  fa_tensor *uo = o->out, *ul = o->lse_out;
  fa_status st;
  if (uo) row_strides(uo, 1, &p->o_st);
  if (uo && writable_in_place(uo, 1, bufs, NULL) && rows_fit_tensor_cores(uo, &p->o_st)) {
    fa_tensor_retain(uo);
    bufs->o = uo;
  } else if ((st = fa_tensor_new(ctx, 4, oshape, d->dtype, FA_CUDA, &bufs->o))) {
    return st;
  } else {
    p->o_st = fa_attn_strides_dense(d->Hq, d->Lq, d->Dv);
  }
  p->o = fa_tensor_ptr(bufs->o);
  if (want_lse) {
    if (ul && writable_in_place(ul, 0, bufs, bufs->o)) {
      fa_tensor_retain(ul);
      bufs->lse = ul;
    } else if ((st = fa_tensor_new(ctx, 3, oshape, lse_dtype, FA_CUDA, &bufs->lse))) {
      return st;
    }
    if (lse_dtype == FA_F64) p->lse64 = fa_tensor_ptr(bufs->lse);
    else p->lse = fa_tensor_ptr(bufs->lse);
    row_strides(bufs->lse, 0, &p->lse_st);
  }
  return FA_OK;
}

/* No keys: zeros and lse = -inf. */
static fa_status cuda_fill_empty(fa_context *ctx, fa_attn_buffers *bufs, int want_lse) {
  fa_status st = fa_tensor_fill(ctx, bufs->o, 0);
  if (!st && want_lse) st = fa_tensor_fill(ctx, bufs->lse, -INFINITY);
  return st;
}

fa_status fa_attn_cuda_inputs(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                              const fa_attn_dims *d, fa_attn_problem *p, fa_attn_buffers *bufs) {
  fa_status st;
  if ((st = fa_attn_operand_on_device(ctx, q, &bufs->q, &p->q_st)) ||
      (st = fa_attn_operand_on_device(ctx, k, &bufs->k, &p->k_st)) ||
      (st = fa_attn_operand_on_device(ctx, v, &bufs->v, &p->v_st)))
    return st;
  p->q = fa_tensor_ptr(bufs->q), p->k = fa_tensor_ptr(bufs->k), p->v = fa_tensor_ptr(bufs->v);
  if (o->mask) { /* bool or f32 on the device, read at its strides (the kernels index it by all four) */
    fa_tensor *m = o->mask;
    if ((st = fa_tensor_to(ctx, m, m->dtype == FA_BOOL ? FA_BOOL : FA_F32, FA_CUDA, &bufs->mask))) return st;
    fa_attn_attach_mask(p, m, bufs->mask);
  }
  if (o->kv_lens) {
    bufs->kv_bytes = sizeof(int64_t) * (size_t)d->B;
    if ((st = upload(ctx, o->kv_lens, bufs->kv_bytes, &bufs->kv_lens))) return st;
  }
  if (o->alibi && !d->alibi_on_device) {
    bufs->alibi_bytes = sizeof(double) * (size_t)d->Hq;
    if ((st = upload(ctx, o->alibi, bufs->alibi_bytes, &bufs->alibi))) return st;
  }
  p->kv_lens = bufs->kv_lens, p->alibi = d->alibi_on_device ? o->alibi : bufs->alibi;
  return FA_OK;
}

/* decode: the decode kernel takes the call (fa_attn_decode_takes).
 * piece_base >= 0: an opts.splits piece (see run_attention), its lse in
 * f64 for the merge where the call is f32 (the kernels that take f32 write
 * it: attn_lse_store); a 16-bit piece keeps an f32 lse, whose rounding is
 * below its dtype's, so that the tensor-core kernels' epilogues stay as
 * they are (one that wrote either form ran 1 % slower at bf16 D = 64, 1k
 * keys causal). */
static fa_status run_cuda(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                          const fa_expr *const exprs[2], const fa_attn_dims *d, int decode, int want_lse,
                          int64_t piece_base, fa_tensor **out, fa_tensor **lse) {
  fa_attn_buffers bufs = {.exprs = {exprs[0], exprs[1]}};
  fa_attn_problem p;
  fa_attn_resolve_options(o, d, d->dtype, &p);
  const fa_dtype lse_dtype = piece_base >= 0 && d->dtype == FA_F32 ? FA_F64 : FA_F32;
  /* an opts.splits piece: top_left's diagonal counts the whole call's keys */
  p.key_base = piece_base >= 0 ? piece_base : 0;
  /* defaults: the tile of the fastest kernel that takes the call, or of
   * the kernel opts.kernel named (the opts' tile when given).  The decode
   * kernel has its own tiles and takes no opts.tile (fa_attn_decode_takes):
   * its calls skip the default's probe of the tiled kernels, a few tenths of
   * a µs of a tiny decode call's 8 (a driver call each time; H200, sampled),
   * and run with tiles of 0, as the paged cache's calls always have */
  const int tiled_default = d->kernel == FA_KERNEL_AUTO && !decode;
  int64_t br = d->kernel_br, bc = d->kernel_bc;
  if (tiled_default) fa_cuda_attention_default_tile(d->dtype, d->D, d->Dv, &br, &bc);
  p.tile_q = o->tile_q ? o->tile_q : br;
  p.tile_k = o->tile_k ? o->tile_k : bc;
  p.tile_given = o->tile_q || o->tile_k;
  fa_status st = FA_OK;
  if (d->dtype == FA_F64)
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: q: attention on cuda takes f32, f16 or bf16, got f64 (f64 runs on "
                                      "the cpu, and fa.attention_reference takes tensors on any device)");
  /* a named kernel's tile was checked with it (fa_check_attention_kernel) */
  if (d->algo != FA_ATTN_NAIVE && d->algo != FA_ATTN_FLASH_ROW && tiled_default &&
      (st = fa_cuda_attention_check_tile(ctx, d->dtype, d->D, d->Dv, p.tile_q, p.tile_k)))
    return st;
  if (d->algo == FA_ATTN_FLASH_ROW && d->Dv > 256)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: flash_row on cuda: Dv = %lld is above 256", (long long)d->Dv);
  /* the decode kernel takes a few lengths in its parameters: no device copy (a launch, and a read before
   * any other in each block: at batch 1 and 4k keys such calls took 1.13x the time of those without kv_lens) */
  fa_attention_opts in = *o;
  if (decode && d->B <= FA_KV_LENS_INLINE) in.kv_lens = NULL;
  if ((st = fa_attn_cuda_inputs(ctx, q, k, v, &in, d, &p, &bufs))) goto done;
  p.kv_lens_host = o->kv_lens;
  fa_attention_opts where = *o; /* where the kernels write */
  if (d->variant && variants_may_fault(o->score_mod, o->mask_mod)) where.out = where.lse_out = NULL;
  if ((st = cuda_outputs(ctx, &where, d, want_lse, lse_dtype, &bufs, &p))) goto done;
  if (d->B * d->Hq * d->Lq == 0) {
  } else if (d->Lk == 0) { /* no keys: zeros and lse = -inf */
    st = cuda_fill_empty(ctx, &bufs, want_lse);
  } else if (d->variant) {
    p.score_mod = o->score_mod, p.mask_mod = o->mask_mod, p.block_mask = o->block_mask;
    if (!(st = fa_expr_begin(ctx, p.score_mod, p.mask_mod, 0))) st = fa_cuda_attention_variant(ctx, d->algo, d->kernel, &p);
    if (!st) st = fa_expr_end(ctx, p.score_mod, p.mask_mod); /* a tensor read out of range (src/expr.h) */
  } else { /* the registry: decode where it fits (its split of the keys is opts.splits; elsewhere it is 0 or 1 here,
            * larger counts being pieces, and the f32 kernel's own chunks are "auto"'s) */
    st = fa_cuda_attention_run(ctx, d->algo, decode ? FA_KERNEL_DECODE : d->kernel, NULL, o->splits, &p);
  }
  if (st) goto done;
  st = fa_attn_deliver(ctx, q, d->rank, d->Dv, bufs.o, want_lse ? bufs.lse : NULL, o->out, o->lse_out, d->dtype,
                       lse_dtype, FA_CUDA, out, lse);
done:
  fa_attn_buffers_drop(ctx, &bufs);
  return st;
}

fa_status fa_attention_paged(fa_context *ctx, fa_tensor *q, const fa_attn_paged_kv *kv, const fa_attention_opts *o,
                             const fa_attn_dims *d, fa_tensor **out, fa_tensor **lse) {
  fa_attn_buffers bufs = {0};
  fa_attn_problem p;
  void *alibi = NULL;
  const size_t alibi_bytes = sizeof(double) * (size_t)d->Hq;
  const int want_lse = o->return_lse || lse != NULL || o->lse_out;
  fa_attn_resolve_options(o, d, d->dtype, &p);
  fa_status st;
  if ((st = fa_attn_operand_on_device(ctx, q, &bufs.q, &p.q_st))) goto done;
  p.q = fa_tensor_ptr(bufs.q);
  p.k = fa_tensor_ptr(kv->kpool), p.v = fa_tensor_ptr(kv->vpool);
  /* the pools are (pages, Hkv, page_size, D | Dv): strides within a page */
  p.k_st.b = p.v_st.b = 0;
  p.k_st.h = kv->pg.page_size * d->D, p.k_st.s = d->D;
  p.v_st.h = kv->pg.page_size * d->Dv, p.v_st.s = d->Dv;
  p.kv_lens = kv->lens, p.kv_lens_host = kv->lens_host;
  if (o->alibi && (st = upload(ctx, o->alibi, alibi_bytes, &alibi))) goto done;
  p.alibi = alibi;
  if ((st = cuda_outputs(ctx, o, d, want_lse, FA_F32, &bufs, &p))) goto done;
  if (d->B * d->Hq * d->Lq == 0) {
  } else if (d->Lk == 0) {
    st = cuda_fill_empty(ctx, &bufs, want_lse);
  } else {
    st = fa_cuda_attention_run(ctx, FA_ATTN_FLASH, FA_KERNEL_DECODE, &kv->pg, o->splits, &p);
  }
  if (!st)
    st = fa_attn_deliver(ctx, q, 4, d->Dv, bufs.o, want_lse ? bufs.lse : NULL, o->out, o->lse_out, d->dtype, FA_F32,
                         FA_CUDA, out, lse);
done:
  fa_cuda_free_on(ctx, alibi, alibi_bytes);
  fa_attn_buffers_drop(ctx, &bufs);
  return st;
}

fa_status fa_attention_cpu_pages(fa_context *ctx, fa_tensor *q, fa_tensor *kpool, fa_tensor *vpool,
                                 const fa_attn_pages *pg, const fa_attention_opts *o, const fa_attn_dims *d,
                                 fa_tensor **out, fa_tensor **lse) {
  fa_attn_buffers bufs = {0};
  fa_attn_problem p;
  const int want_lse = o->return_lse || lse != NULL || o->lse_out;
  const fa_dtype compute = d->dtype == FA_F64 ? FA_F64 : FA_F32;
  fa_status st;
  /* the pools as k and v: their heads and rows as a page's, the page itself from pg */
  if ((st = build_problem(ctx, q, kpool, vpool, o, d, compute, d->dtype, d->dtype, &p, &bufs)) ||
      (st = prepare_outputs(ctx, o, d, want_lse, o->out, o->lse_out, FA_F32, &p, &bufs)))
    goto done;
  p.k_st = (fa_attn_strides){0, pg->page_size * d->D, d->D};
  p.v_st = (fa_attn_strides){0, pg->page_size * d->Dv, d->Dv};
  p.pages = pg;
  if (d->B * d->Hq * d->Lq == 0) {
  } else if (d->Lk == 0) {
    fill_empty(&p);
  } else {
    st = fa_cpu_attention(ctx, d->algo, &p);
  }
  if (!st)
    st = fa_attn_deliver(ctx, q, 4, d->Dv, bufs.o, want_lse ? bufs.lse : NULL, o->out, o->lse_out, d->dtype, FA_F32,
                         FA_CPU, out, lse);
done:
  fa_attn_buffers_drop(ctx, &bufs);
  return st;
}

/* reference: fa_attention_reference.  piece_base >= 0: an opts.splits
 * piece on the keys from piece_base (a view; src/splits.c): its lse in f64
 * on the CPU, and for f32 on cuda (the public call's lse is f32, API §2; the
 * merge weighs the pieces by e^(lse - max), and an f32 lse near 8192 is
 * rounded by up to 5e-4 of a piece's weight: tests/lua/test_splits.lua),
 * top_left and the variants counting keys
 * from piece_base (fa_attn_problem.key_base), no rewriting of the variants
 * by the piece's own sizes (the whole call rewrote mask_mod's range rules
 * before it split; a score_mod of ALiBi's form runs as its expression in
 * the pieces) and no block mask (made for the whole call's tiles).  -1:
 * the call itself. */
static fa_status run_attention(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                               int reference, int64_t piece_base, fa_tensor **out, fa_tensor **lse) {
  const int piece = piece_base >= 0;
  fa_attention_opts defaults;
  if (!o) {
    fa_attention_opts_init(&defaults);
    o = &defaults;
  }
  if (out) *out = NULL;
  if (lse) *lse = NULL;
  if (!out) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: attention: the output pointer is NULL");
  /* the caller's variants, whose captured tensors an output must not share even where they are
   * rewritten below (score_mod's ALiBi slopes are then opts.alibi itself) */
  const fa_expr *const exprs[2] = {o->score_mod, o->mask_mod};
  FA_NEED(ctx);
  fa_attn_dims d;
  fa_status st = fa_check_attention(ctx, q, k, v, o, reference, &d);
  fa_attn_kernel named;
  if (!st) st = reference ? fa_check_attention_kernel_name(ctx, o, &d, &named) : fa_check_attention_kernel(ctx, o, &d);
  /* a mask_mod that is a window or causal rule runs as that rule (the reference keeps it literal) */
  fa_attention_opts as_range;
  if (!st && !reference && !piece && fa_expr_mask_as_range(o->mask_mod, d.Lq, d.Lk, o, &as_range)) {
    o = &as_range;
    d.variant = o->score_mod || o->mask_mod;
  }
  /* the decode kernel cuts the keys into opts.splits chunks itself, and so do the CPU's flash and two_pass */
  const int decode = !st && !reference && fa_attn_decode_takes(&d, o);
  if (st) return st;
  const int chunks = d.device == FA_CPU && (d.algo == FA_ATTN_FLASH || d.algo == FA_ATTN_TWO_PASS);
  const int64_t splits = reference || decode || chunks ? 1 : fa_attention_splits_resolve(o, &d);
  if (splits > 1) return fa_attention_splits_run(ctx, q, k, v, o, &d, splits, out, lse);
  /* a score_mod that is the ALiBi rule runs as opts.alibi, its slopes made on the call's device
   * (after the splits: their calls read opts.alibi on the host) */
  fa_attention_opts as_alibi;
  fa_tensor *slopes = NULL;
  int alibi = 0;
  if (!reference && !piece &&
      (st = fa_expr_score_as_alibi(ctx, o->score_mod, d.Hq, d.Lq, d.Lk, d.device, o, &as_alibi, &slopes, &alibi)))
    return st;
  if (alibi) {
    o = &as_alibi;
    d.variant = o->score_mod || o->mask_mod;
    d.alibi_on_device = d.device == FA_CUDA;
  }
  int want_lse = o->return_lse || lse != NULL || o->lse_out;
  if (!reference && d.device == FA_CUDA) {
    st = run_cuda(ctx, q, k, v, o, exprs, &d, decode, want_lse, piece_base, out, lse);
    fa_tensor_release(slopes); /* stream-ordered: after the kernels that read it */
    return st;
  }
  const fa_dtype compute = reference || d.dtype == FA_F64 ? FA_F64 : FA_F32, storage = reference ? FA_F64 : d.dtype;
  const fa_dtype o_dtype = piece ? compute : storage; /* a piece's o in f32: merged, then rounded once */
  const fa_dtype lse_dtype = reference || piece ? FA_F64 : FA_F32;
  fa_tensor *user_out = o->out, *user_lse = o->lse_out;
  const int aside = variants_may_fault(o->score_mod, o->mask_mod); /* the outputs in temporaries */
  fa_attn_buffers bufs = {.exprs = {exprs[0], exprs[1]}};
  fa_attn_problem p;
  if ((st = build_problem(ctx, q, k, v, o, &d, compute, storage, o_dtype, &p, &bufs)) ||
      (st = prepare_outputs(ctx, o, &d, want_lse, aside ? NULL : user_out, aside ? NULL : user_lse,
                            lse_dtype, &p, &bufs)))
    goto done;
  if (!reference && !piece) p.block_mask = o->block_mask;
  if (piece) p.key_base = piece_base;
  if ((st = fa_expr_begin(ctx, p.score_mod, p.mask_mod, 1))) goto done;
  if (d.B * d.Hq * d.Lq == 0) {
  } else if (d.Lk == 0) {
    fill_empty(&p);
  } else if (reference) {
    st = fa_cpu_attention_reference(ctx, &p);
  } else {
    st = fa_cpu_attention(ctx, d.algo, &p);
  }
  if (!st) st = fa_expr_end(ctx, p.score_mod, p.mask_mod); /* a tensor read out of range (src/expr.h) */
  if (st) goto done;
  fa_device dev = reference ? FA_CPU : d.device;
  st = fa_attn_deliver(ctx, q, d.rank, d.Dv, bufs.o, want_lse ? bufs.lse : NULL, user_out, user_lse, o_dtype,
                       lse_dtype, dev, out, lse);
done:
  fa_attn_buffers_drop(ctx, &bufs);
  fa_tensor_release(slopes);
  return st;
}

fa_status fa_attention(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *opts,
                       fa_tensor **o, fa_tensor **lse) {
  return run_attention(ctx, q, k, v, opts, 0, -1, o, lse);
}

fa_status fa_attention_piece(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *opts,
                             int64_t key_base, fa_tensor **o, fa_tensor **lse) {
  return run_attention(ctx, q, k, v, opts, 0, key_base, o, lse);
}

fa_status fa_attention_reference(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                                 const fa_attention_opts *opts, fa_tensor **o, fa_tensor **lse) {
  return run_attention(ctx, q, k, v, opts, 1, -1, o, lse);
}

fa_status fa_attention_kernels(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *opts,
                               const char **names, int cap, int *n) {
  FA_NEED(ctx);
  FA_NEED(n);
  *n = 0;
  if (cap < 0) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: %s: cap must be >= 0, got %d", __func__, cap);
  if (cap > 0) FA_NEED(names);
  fa_attention_opts defaults;
  fa_attn_dims d;
  fa_status st = fa_check_attention_or_defaults(ctx, q, k, v, &opts, &defaults, &d);
  /* a named kernel: the kernels listed only when named are listed */
  if (st || (st = fa_check_attention_kernel_name(ctx, opts, &d, &d.kernel))) return st;
  const int dense = device_rows_dense(q) && device_rows_dense(k) && device_rows_dense(v);
  /* the call as the kernels would see it, for their order: its rules, its key tile (0: a kernel's
   * default), and which mask (only its kind is read: the mask itself stands in for its copy) */
  fa_attn_problem call;
  fa_attn_resolve_options(opts, &d, d.dtype, &call);
  call.tile_q = opts->tile_q, call.tile_k = opts->tile_k;
  if (opts->mask) fa_attn_attach_mask(&call, opts->mask, opts->mask);
  *n = fa_attn_kernels_accepting(&d, opts->algo, opts->tile_q, opts->tile_k, &call, dense, names, cap);
  return FA_OK;
}
