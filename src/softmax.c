/* fa_softmax: check, bring the rows to a contiguous host buffer of the
 * compute dtype, run the backend, deliver in x's dtype. */
#include "check.h"

#include <string.h>

void fa_softmax_opts_init(fa_softmax_opts *o) { memset(o, 0, sizeof *o); }

int64_t fa_softmax_fused_max_n(fa_context *ctx, fa_dtype dtype, fa_device device) {
  (void)ctx;
  (void)device;
  return fa_cpu_softmax_fused_max_n(dtype == FA_F64 ? FA_F64 : FA_F32);
}

fa_status fa_softmax(fa_context *ctx, fa_tensor *x, const fa_softmax_opts *opts, fa_tensor **y) {
  fa_softmax_opts defaults;
  if (!opts) {
    fa_softmax_opts_init(&defaults);
    opts = &defaults;
  }
  if (!y) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: softmax: the output pointer is NULL");
  *y = NULL;
  fa_status st = fa_check_softmax(ctx, x, opts);
  if (st) return st;
  if (x->storage->device == FA_CUDA)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: softmax: the CUDA backend has no softmax kernel yet "
                                            "(move the tensor to the cpu)");
  fa_dtype compute = x->dtype == FA_F64 ? FA_F64 : FA_F32;
  int64_t n = x->shape[x->ndim - 1], rows = n ? fa_tensor_numel(x) / n : 0;
  fa_tensor *src = NULL, *dst = NULL;
  if ((st = fa_tensor_cpu_contiguous(ctx, x, compute, &src))) return st;
  fa_tensor *out = opts->out;
  if (out && out->dtype == compute && fa_tensor_is_contiguous(out) && out->storage->device == FA_CPU) {
    fa_tensor_retain(out);
    dst = out;
  } else if (src != x) {
    fa_tensor_retain(src); /* a private copy: normalise in place */
    dst = src;
  } else if ((st = fa_tensor_new_like(ctx, x, compute, FA_CPU, &dst))) {
    goto done;
  }
  if (rows) {
    fa_dtype storage = x->dtype;
    st = fa_cpu_softmax(ctx, opts->algo, opts->block, compute, storage, fa_tensor_ptr(src), fa_tensor_ptr(dst), rows, n);
    if (st) goto done;
  }
  if (out && dst != out) {
    st = fa_tensor_copy(ctx, out, dst);
    if (!st) fa_tensor_retain(out);
    *y = st ? NULL : out;
  } else if (out || dst->dtype == x->dtype) {
    fa_tensor_retain(dst);
    *y = dst;
  } else {
    st = fa_tensor_to(ctx, dst, x->dtype, FA_CPU, y);
  }
done:
  fa_tensor_drop(&src);
  fa_tensor_drop(&dst);
  return st;
}
