/* Argument checking for every operation: the one place where inputs are
 * validated before a backend sees them. */
#ifndef FA_CHECK_H
#define FA_CHECK_H

#include "internal.h"

/* Shapes of an attention call, resolved from q, k, v of rank 2, 3 or 4. */
typedef struct {
  int rank;
  int64_t B, Hq, Hkv, Lq, Lk, D, Dv;
  fa_device device;
  fa_dtype dtype;
  fa_attention_algo algo; /* AUTO resolved */
  int variant;            /* opts.score_mod or opts.mask_mod (API §9) */
  int alibi_on_device;    /* opts.alibi is device memory on cuda (a score_mod made it: expr_alibi.c) */
  /* opts.kernel (fa_check_attention_kernel): the named kernel and the
   * tile it runs with (0: none, or the backend's default); FA_KERNEL_AUTO
   * when none is named (and before that check) */
  fa_attn_kernel kernel;
  int64_t kernel_br, kernel_bc;
} fa_attn_dims;

fa_status fa_check_tensor(fa_context *ctx, const fa_tensor *t, const char *name);
/* The options every attention computation reads the same way (attention.c;
 * the backward too): p cleared, then shapes, scale, softcap, causal,
 * window, the compute dtype. */
void fa_attn_resolve_options(const fa_attention_opts *o, const fa_attn_dims *d, fa_dtype compute, fa_attn_problem *p);
/* The CPU's tiles no larger than Lq and Lk (at least 1): a tile past the
 * sequence covers it all the same, and its workspace would be sized by the
 * tile ({4096, 4096} on 4 rows took 67 MB). */
void fa_attn_fit_tiles(fa_attn_problem *p);
/* Points p at the mask as buf holds it (the caller's tensor or a converted
 * copy), with buf's strides, 0 where m broadcasts. */
void fa_attn_attach_mask(fa_attn_problem *p, const fa_tensor *m, fa_tensor *buf);
/* An attention call's computed output obuf (B, Hq, Lq, Dv) and lse lbuf
 * (B, Hq, Lq; NULL: no lse wanted) handed out in q's rank: copied into
 * user_out / user_lse when given (last: they may alias the inputs), else
 * as tensors of odt / ldt on dev (views of the buffers when those already
 * are); *lse is set only when lse is not NULL. */
fa_status fa_attn_deliver(fa_context *ctx, const fa_tensor *q, int rank, int64_t dv, fa_tensor *obuf, fa_tensor *lbuf,
                          fa_tensor *user_out, fa_tensor *user_lse, fa_dtype odt, fa_dtype ldt, fa_device dev,
                          fa_tensor **out, fa_tensor **lse);
/* Temporaries that an attention call holds while the backend runs: the
 * operands as the kernels read them (the caller's tensors, retained, or
 * copies), the mask's copy, the outputs, and on cuda the device copies of
 * kv_lens and alibi. */
typedef struct {
  fa_tensor *q, *k, *v, *mask, *o, *lse;
  void *kv_lens, *alibi;
  size_t kv_bytes, alibi_bytes;
  /* the call's score_mod and mask_mod (not held): their captured tensors
   * are inputs too, which an output written in place must not share */
  const struct fa_expr *exprs[2];
} fa_attn_buffers;
void fa_attn_buffers_drop(fa_context *ctx, fa_attn_buffers *b);
/* An operand on the CPU as its kernels read it (API §6): t itself
 * (retained) where it lies, a host tensor of dtype dt (the attention
 * kernels': the inputs' own; the backward's: the compute dtype) whose row
 * stride is an int (BLAS's leading dimensions), else a contiguous copy in
 * dt; *st its strides (the caller sets the dense ones first: a copy leaves
 * them). */
fa_status fa_attn_cpu_operand(fa_context *ctx, fa_tensor *t, fa_dtype dt, fa_tensor **buf, fa_attn_strides *st);
/* opts.mask on the CPU: m itself (retained) in bool or the compute dtype,
 * at any strides, else a contiguous copy in that dtype. */
fa_status fa_attn_cpu_mask(fa_context *ctx, fa_tensor *m, fa_dtype compute, fa_tensor **buf);
/* An operand on cuda as the kernels read it (API §6): t itself (retained)
 * where it lies, else a contiguous copy; *st its strides. */
fa_status fa_attn_operand_on_device(fa_context *ctx, fa_tensor *t, fa_tensor **buf, fa_attn_strides *st);
/* q, k, v, the mask, kv_lens and alibi of a call on cuda into p (options
 * resolved) and bufs, which holds them until fa_attn_buffers_drop. */
fa_status fa_attn_cuda_inputs(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                              const fa_attn_dims *d, fa_attn_problem *p, fa_attn_buffers *bufs);
/* The keys and values of a paged KV cache (src/kv_cache.c) for the decode
 * kernel: the pools (pages, Hkv, page_size, D | Dv), the page table and
 * the sequences' lengths on the device, and on the host. */
typedef struct {
  fa_tensor *kpool, *vpool;
  fa_attn_paging pg;
  const int64_t *lens, *lens_host;
} fa_attn_paged_kv;
/* Attention of q over a paged cache by the decode kernel: d holds the
 * call's dims (Lk the longest sequence, rank 4, algo flash) and is one
 * fa_attn_decode_takes accepts; o checked (no mask, kv_lens, tile). */
fa_status fa_attention_paged(fa_context *ctx, fa_tensor *q, const fa_attn_paged_kv *kv, const fa_attention_opts *o,
                             const fa_attn_dims *d, fa_tensor **out, fa_tensor **lse);
/* The same on the CPU, where the kernels "flash", "two_pass" and "naive"
 * (d->algo) read the pools (pages, Hkv, page_size, D | Dv) through the
 * host table of pg, each sequence a call over its own keys; o as above,
 * and no splits. */
fa_status fa_attention_cpu_pages(fa_context *ctx, fa_tensor *q, fa_tensor *kpool, fa_tensor *vpool,
                                 const fa_attn_pages *pg, const fa_attention_opts *o, const fa_attn_dims *d,
                                 fa_tensor **out, fa_tensor **lse);
/* `reference`: the call computes in f64 whatever the inputs (the scale's
 * f32 range does not apply). */
fa_status fa_check_attention(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                             int reference, fa_attn_dims *d);
/* The options part of fa_check_attention, for dims d of the call's q
 * (shapes, device and dtype set): sets d->algo. */
fa_status fa_check_attention_options(fa_context *ctx, const fa_tensor *q, const fa_attention_opts *o, int reference,
                                     fa_attn_dims *d);
/* fa_check_attention for the C API's entry points that take opts NULL as
 * the defaults: *opts points at `defaults` (initialised) then. */
fa_status fa_check_attention_or_defaults(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                                         const fa_attention_opts **opts, fa_attention_opts *defaults, fa_attn_dims *d);
/* opts.kernel of fa_attention (after fa_check_attention): an unknown name
 * is FA_ERR_ARGUMENT, a kernel that does not accept the call (device,
 * dtype, head dims, algo, tile, GPU) FA_ERR_UNSUPPORTED, each naming the
 * choices; else d->kernel, d->kernel_br/bc and d->algo (the kernel's own
 * with algo auto) are set.  No kernel named: d is left alone. */
fa_status fa_check_attention_kernel(fa_context *ctx, const fa_attention_opts *o, fa_attn_dims *d);
/* Only that opts.kernel, when given, names a kernel (FA_ERR_ARGUMENT naming
 * the choices), *k (FA_KERNEL_AUTO: none named): fa_attention_reference's
 * check, which runs none of them but takes no typo either. */
fa_status fa_check_attention_kernel_name(fa_context *ctx, const fa_attention_opts *o, const fa_attn_dims *d,
                                        fa_attn_kernel *k);
/* o, lse and dout of fa_attention_backward(_reference) against the dims
 * fa_check_attention resolved from q, k, v and the opts. */
fa_status fa_check_attention_backward(fa_context *ctx, fa_tensor *q, fa_tensor *o, fa_tensor *lse, fa_tensor *dout,
                                      int reference, const fa_attn_dims *d);
fa_status fa_check_softmax(fa_context *ctx, fa_tensor *x, const fa_softmax_opts *o);
fa_status fa_check_matmul(fa_context *ctx, fa_tensor *a, fa_tensor *b, const fa_matmul_opts *o);
fa_status fa_check_merge(fa_context *ctx, fa_tensor *o1, fa_tensor *lse1, fa_tensor *o2, fa_tensor *lse2);
/* The same with the arguments' names for messages (fa_merge_states_n: "os[3]"). */
typedef struct {
  const char *o1, *lse1, *o2, *lse2;
} fa_merge_names;
fa_status fa_check_merge_named(fa_context *ctx, fa_tensor *o1, fa_tensor *lse1, fa_tensor *o2, fa_tensor *lse2,
                               const fa_merge_names *n);
/* An output's elements each their own memory: no stride 0 over more than
 * one element (a view of the C API's or DLPack's); name for the message. */
fa_status fa_check_writable(fa_context *ctx, const fa_tensor *out, const char *name);
/* out given by the caller: shape (rank dims), dtype, device must match. */
fa_status fa_check_out(fa_context *ctx, const fa_tensor *out, const char *name, int ndim, const int64_t *shape,
                       fa_dtype dtype, fa_device device);
int fa_is_float_dtype(fa_dtype d);

#endif
