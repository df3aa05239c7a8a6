/* fa_attention_backward and fa_attention_backward_reference (API §10): the
 * gradients of fa_attention with respect to q, k and v.  Checked once like
 * the forward (fa_check_attention, then o, lse, dout), the options resolved
 * into an fa_attn_problem.  CPU: q, k, v, o and dout read where they lie
 * when they are host tensors (f16/bf16 widened to f32 a tile at a time),
 * else from contiguous copies; lse (in the compute dtype: f32, f64 for f64
 * inputs and the reference), and
 * every operand of the reference, as contiguous copies; the mask at its
 * strides where its dtype allows; the gradients computed into dense
 * buffers and delivered in q's dtype and each input's shape.  CUDA: the
 * operands read where they lie (API §6), the gradients computed by
 * kernels/attention/attention_backward*.cu into new dense tensors of q's
 * dtype. */
#include "attn_kernels.h"
#include "check.h"
#include "expr.h"
#include "cpu/attention_backward.h"

#include <string.h>

enum { BW_TILE = 128 };
enum { BW_Q, BW_K, BW_V, BW_O, BW_LSE, BW_DOUT, BW_MASK, BW_DQ, BW_DK, BW_DV, BW_N };

/* The forward's options as fa_attention resolves them, with the backward's
 * own default tile. */
static void bw_problem(const fa_attention_opts *o, const fa_attn_dims *d, fa_dtype compute, fa_attn_problem *p) {
  fa_attn_resolve_options(o, d, compute, p);
  p->kv_lens = o->kv_lens;
  p->alibi = o->alibi;
  p->score_mod = o->score_mod, p->mask_mod = o->mask_mod; /* API §9: the chain rule through score_mod's expression */
  p->tile_q = o->tile_q > 0 ? o->tile_q : BW_TILE; /* the backward's own default: three Br·Bc tiles in cache */
  p->tile_k = o->tile_k > 0 ? o->tile_k : BW_TILE;
  fa_attn_fit_tiles(p);
}

/* A contiguous (shape of `like`) view of the computed buffer, converted to
 * dtype. */
static fa_status bw_deliver(fa_context *ctx, fa_tensor *buf, const fa_tensor *like, fa_dtype dtype, fa_tensor **out) {
  fa_tensor *view = NULL;
  fa_status st = fa_tensor_view(ctx, buf, like->ndim, like->shape, &view);
  if (!st) st = fa_tensor_to(ctx, view, dtype, FA_CPU, out);
  fa_tensor_drop(&view);
  return st;
}

/* The gradients' buffers dq (B, Hq, Lq, D), dk (B, Hkv, Lk, D) and dv
 * (B, Hkv, Lk, Dv) of dtype dt on dev into g[0..2]: zeros with zero (the
 * CPU's reference adds into them, and where no kernel runs), else
 * uninitialised (cuda's kernels write every element; the CPU's zero their
 * own rows first, on the threads that fill them). */
static fa_status bw_buffers(fa_context *ctx, const fa_attn_dims *d, fa_dtype dt, fa_device dev, int zero,
                            fa_tensor **g) {
  const int64_t shapes[3][4] = {{d->B, d->Hq, d->Lq, d->D}, {d->B, d->Hkv, d->Lk, d->D}, {d->B, d->Hkv, d->Lk, d->Dv}};
  fa_status st = FA_OK;
  for (int i = 0; i < 3 && !st; i++) {
    const int64_t n = fa_numel_of(4, shapes[i]);
    st = fa_tensor_new(ctx, 4, shapes[i], dt, dev, &g[i]);
    if (!st && zero && n > 0) memset(fa_tensor_ptr(g[i]), 0, (size_t)n * fa_dtype_size(dt));
  }
  return st;
}

/* opts.kernel as the backward reads it (*k): one of its own kernels on
 * cuda ("wgmma", "mma", "simt"), else the automatic choice (no name, or a
 * forward kernel's: the same opts serve both passes); a name no kernel has
 * is an error naming the choices. */
static fa_status bw_kernel(fa_context *ctx, const fa_attention_opts *o, fa_attn_kernel *k) {
  *k = o->kernel && *o->kernel ? fa_attn_kernel_find(o->kernel) : FA_KERNEL_AUTO;
  if (o->kernel && *o->kernel && *k == FA_KERNEL_AUTO)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.kernel: no kernel is named '%.64s' (the backward's on cuda: wgmma, mma, simt; "
                   "fa.kernels lists the forward's)",
                   o->kernel);
  if (*k != FA_KERNEL_WGMMA && *k != FA_KERNEL_MMA && *k != FA_KERNEL_SIMT) *k = FA_KERNEL_AUTO;
  return FA_OK;
}

/* The CUDA backward: q, k, v, o and dout read where they lie (copies where
 * they cannot be: fa_attn_operand_on_device), lse as f32, the gradients
 * into new dense tensors of q's dtype, viewed in the inputs' shapes. */
static fa_status run_backward_cuda(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, fa_tensor *o,
                                   fa_tensor *lse, fa_tensor *dout, const fa_attention_opts *opts,
                                   const fa_attn_dims *d, fa_attn_kernel kernel, fa_tensor **dq, fa_tensor **dk,
                                   fa_tensor **dv) {
  if (d->dtype == FA_F64)
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: q: attention_backward on cuda takes f32, f16 or bf16, got f64 (f64 "
                                      "runs on the cpu, and fa.attention_backward_reference takes any device)");
  if (d->D > 256 || d->Dv > 256) /* the kernels' and the variants' alike */
    return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                   "flashattn: attention_backward on cuda takes head dims up to 256 (D = %lld, Dv = %lld)",
                   (long long)d->D, (long long)d->Dv);
  fa_attn_buffers bufs = {0};
  fa_tensor *ob = NULL, *db = NULL, *l32 = NULL, *lb = NULL, *g[3] = {0};
  fa_attn_problem p;
  fa_attn_grads gr = {0};
  fa_attn_resolve_options(opts, d, d->dtype, &p);
  fa_status st = fa_attn_cuda_inputs(ctx, q, k, v, opts, d, &p, &bufs);
  if (st || (st = fa_attn_operand_on_device(ctx, o, &ob, &p.o_st)) ||
      (st = fa_attn_operand_on_device(ctx, dout, &db, &gr.dout_st)) ||
      (st = fa_tensor_to(ctx, lse, FA_F32, FA_CUDA, &l32)) || (st = fa_tensor_contiguous(ctx, l32, &lb)))
    goto done;
  p.o = fa_tensor_ptr(ob), p.lse = fa_tensor_ptr(lb);
  p.lse_st = fa_attn_strides_dense(d->Hq, d->Lq, 1);
  if ((st = bw_buffers(ctx, d, d->dtype, FA_CUDA, 0, g))) goto done;
  gr.dout = fa_tensor_ptr(db);
  gr.deterministic = opts->deterministic != 0;
  gr.dq = fa_tensor_ptr(g[0]), gr.dk = fa_tensor_ptr(g[1]), gr.dv = fa_tensor_ptr(g[2]);
  if (opts->score_mod || opts->mask_mod) { /* API §9: compiled into the SIMT kernels, as the forward's */
    p.score_mod = opts->score_mod, p.mask_mod = opts->mask_mod;
    if (!(st = fa_expr_begin(ctx, p.score_mod, p.mask_mod, 0)))
      st = fa_cuda_attention_backward_variant(ctx, kernel, &p, &gr);
    if (!st) st = fa_expr_end(ctx, p.score_mod, p.mask_mod); /* a tensor read out of range (src/expr.h) */
  } else {
    st = fa_cuda_attention_backward(ctx, kernel, &p, &gr);
  }
  if (st) goto done;
  fa_tensor *like[3] = {q, k, v}, **res[3] = {dq, dk, dv};
  for (int i = 0; i < 3 && !st; i++) st = fa_tensor_view(ctx, g[i], like[i]->ndim, like[i]->shape, res[i]);
  if (st) {
    fa_tensor_drop(dq);
    fa_tensor_drop(dk);
    fa_tensor_drop(dv);
  }
done:
  for (int i = 0; i < 3; i++) fa_tensor_drop(&g[i]);
  fa_tensor_drop(&ob);
  fa_tensor_drop(&db);
  fa_tensor_drop(&l32);
  fa_tensor_drop(&lb);
  fa_attn_buffers_drop(ctx, &bufs);
  return st;
}

static fa_status run_backward(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, fa_tensor *o, fa_tensor *lse,
                              fa_tensor *dout, const fa_attention_opts *opts, int reference, fa_tensor **dq,
                              fa_tensor **dk, fa_tensor **dv) {
  fa_attention_opts defaults;
  if (!opts) {
    fa_attention_opts_init(&defaults);
    opts = &defaults;
  }
  if (dq) *dq = NULL;
  if (dk) *dk = NULL;
  if (dv) *dv = NULL;
  if (!dq || !dk || !dv)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: attention_backward: an output pointer (dq, dk, dv) is NULL");
  FA_NEED(ctx);
  fa_attn_dims d;
  fa_status st = fa_check_attention(ctx, q, k, v, opts, reference, &d);
  fa_attn_kernel kernel = FA_KERNEL_AUTO;
  if (st || (st = fa_check_attention_backward(ctx, q, o, lse, dout, reference, &d)) ||
      (st = bw_kernel(ctx, opts, &kernel))) /* the reference runs none, but takes no unknown name */
    return st;
  /* a mask_mod that is a window or causal rule runs as that rule, as in the forward (src/expr_window.c) */
  fa_attention_opts as_range;
  if (!reference && fa_expr_mask_as_range(opts->mask_mod, d.Lq, d.Lk, opts, &as_range)) {
    opts = &as_range;
    d.variant = opts->score_mod || opts->mask_mod;
  }
  if (!reference && d.device == FA_CUDA)
    return run_backward_cuda(ctx, q, k, v, o, lse, dout, opts, &d, kernel, dq, dk, dv);
  const fa_dtype compute = reference || d.dtype == FA_F64 ? FA_F64 : FA_F32;
  fa_tensor *t[BW_N] = {0};
  fa_attn_problem p;
  bw_problem(opts, &d, compute, &p);
  p.storage = reference ? compute : d.dtype; /* q, k, v, o, dout as they lie; f16/bf16 widened tile by tile */
  fa_tensor *in[BW_MASK] = {q, k, v, o, lse, dout};
  fa_attn_strides dout_st = fa_attn_strides_dense(d.Hq, d.Lq, d.Dv);
  /* the fast path reads q, k, v, o and dout where they lie (API §6); lse, and every operand of the reference, as
   * dense copies */
  fa_attn_strides *at[BW_MASK] = {&p.q_st, &p.k_st, &p.v_st, &p.o_st, NULL, &dout_st};
  for (int i = 0; i < BW_MASK; i++)
    if ((st = !reference && at[i] ? fa_attn_cpu_operand(ctx, in[i], p.storage, &t[i], at[i])
                                  : fa_tensor_cpu_contiguous(ctx, in[i], compute, &t[i])))
      goto done;
  p.q = fa_tensor_ptr(t[BW_Q]), p.k = fa_tensor_ptr(t[BW_K]), p.v = fa_tensor_ptr(t[BW_V]);
  if (opts->mask) {
    fa_tensor *m = opts->mask;
    if ((st = fa_attn_cpu_mask(ctx, m, compute, &t[BW_MASK]))) goto done;
    fa_attn_attach_mask(&p, m, t[BW_MASK]);
  }
  const int runs = d.B * d.Hq * d.Lq > 0 && d.Lk > 0;
  if ((st = bw_buffers(ctx, &d, compute, FA_CPU, reference || !runs, &t[BW_DQ]))) goto done; /* BW_DQ, DK, DV */
  fa_attn_backward g = {&p,
                        fa_tensor_ptr(t[BW_O]),
                        fa_tensor_ptr(t[BW_DOUT]),
                        fa_tensor_ptr(t[BW_LSE]),
                        fa_tensor_ptr(t[BW_DQ]),
                        fa_tensor_ptr(t[BW_DK]),
                        fa_tensor_ptr(t[BW_DV]),
                        dout_st};
  st = fa_expr_begin(ctx, p.score_mod, p.mask_mod, 1);
  if (!st && runs)
    st = reference ? fa_cpu_attention_backward_reference(ctx, &g) : fa_cpu_attention_backward(ctx, &g);
  if (!st) st = fa_expr_end(ctx, p.score_mod, p.mask_mod); /* a tensor read out of range (src/expr.h) */
  const fa_dtype odt = reference ? FA_F64 : d.dtype;
  if (st || (st = bw_deliver(ctx, t[BW_DQ], q, odt, dq)) || (st = bw_deliver(ctx, t[BW_DK], k, odt, dk)) ||
      (st = bw_deliver(ctx, t[BW_DV], v, odt, dv))) {
    fa_tensor_drop(dq);
    fa_tensor_drop(dk);
    fa_tensor_drop(dv);
  }
done:
  for (int i = 0; i < BW_N; i++) fa_tensor_drop(&t[i]);
  return st;
}

fa_status fa_attention_backward(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, fa_tensor *o,
                                fa_tensor *lse, fa_tensor *dout, const fa_attention_opts *opts, fa_tensor **dq,
                                fa_tensor **dk, fa_tensor **dv) {
  return run_backward(ctx, q, k, v, o, lse, dout, opts, 0, dq, dk, dv);
}

fa_status fa_attention_backward_reference(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, fa_tensor *o,
                                          fa_tensor *lse, fa_tensor *dout, const fa_attention_opts *opts,
                                          fa_tensor **dq, fa_tensor **dk, fa_tensor **dv) {
  return run_backward(ctx, q, k, v, o, lse, dout, opts, 1, dq, dk, dv);
}
