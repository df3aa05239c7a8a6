/* fa_softmax: check, take the rows where they lie (a tensor of the compute
 * dtype whose last dimension is contiguous, API §6) or as a contiguous copy
 * (another dtype, or a last dimension with a stride), run that backend,
 * deliver in x's dtype. */
#include "check.h"

#include <string.h>

void fa_softmax_opts_init(fa_softmax_opts *o) {
  if (o) memset(o, 0, sizeof *o);
}

int64_t fa_softmax_fused_max_n(fa_context *ctx, fa_dtype dtype, fa_device device) {
  (void)ctx;
  if (device == FA_CUDA) return fa_cuda_softmax_fused_max_n(dtype);
  return fa_cpu_softmax_fused_max_n(dtype == FA_F64 ? FA_F64 : FA_F32);
}

/* The CPU computes in f32 (f64 for f64); the GPU in the tensor's dtype. */
static fa_dtype compute_dtype(const fa_tensor *x) {
  if (x->storage->device == FA_CUDA) return x->dtype;
  return x->dtype == FA_F64 ? FA_F64 : FA_F32;
}

static fa_status run_backend(fa_context *ctx, const fa_softmax_opts *o, const fa_tensor *x, fa_tensor *src,
                             fa_tensor *dst, int64_t rows, int64_t n) {
  const fa_state_rows xr = fa_tensor_rows(src);
  if (x->storage->device == FA_CUDA)
    return fa_cuda_softmax(ctx, o->algo, o->block, src->dtype, fa_tensor_ptr(src), &xr, fa_tensor_ptr(dst), rows, n);
  return fa_cpu_softmax(ctx, o->algo, o->block, src->dtype, x->dtype, fa_tensor_ptr(src), &xr, fa_tensor_ptr(dst),
                        rows, n);
}

/* The rows as the backend reads them: x itself (retained) when it is of
 * the compute dtype with its last dimension contiguous (its rows at any
 * strides), else a contiguous copy in that dtype (cuda computes in x's). */
static fa_status rows_of(fa_context *ctx, fa_tensor *x, fa_dtype compute, fa_tensor **src) {
  const int64_t n = x->shape[x->ndim - 1];
  const int strided = n > 1 && x->strides[x->ndim - 1] != 1;
  if (x->storage->device == FA_CUDA && strided) return fa_tensor_contiguous(ctx, x, src);
  if (x->dtype != compute || strided) return fa_tensor_cpu_contiguous(ctx, x, compute, src);
  fa_tensor_retain(x);
  *src = x;
  return FA_OK;
}

/* out can take the rows in place unless it overlaps src without being
 * exactly src (rows are read and written in parallel, in any order; out is
 * contiguous, src's rows may be strided: then any overlap rules it out). */
static int usable_in_place(const fa_tensor *out, const fa_tensor *src) {
  if (!fa_tensor_same_memory(out, src)) return 1;
  if (!fa_tensor_is_contiguous(src)) return !fa_tensor_overlaps(out, src);
  const char *o0 = fa_tensor_ptr(out), *s0 = fa_tensor_ptr(src);
  size_t ob = (size_t)fa_tensor_numel(out) * fa_dtype_size(out->dtype);
  size_t sb = (size_t)fa_tensor_numel(src) * fa_dtype_size(src->dtype);
  if (o0 == s0 && ob == sb) return 1; /* the same elements (both contiguous) */
  return o0 + ob <= s0 || s0 + sb <= o0;
}

fa_status fa_softmax(fa_context *ctx, fa_tensor *x, const fa_softmax_opts *opts, fa_tensor **y) {
  fa_softmax_opts defaults;
  if (!opts) {
    fa_softmax_opts_init(&defaults);
    opts = &defaults;
  }
  if (!y) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: softmax: the output pointer is NULL");
  *y = NULL;
  FA_NEED(ctx);
  fa_status st = fa_check_softmax(ctx, x, opts);
  if (st) return st;
  fa_device dev = x->storage->device;
  fa_dtype compute = compute_dtype(x);
  int64_t n = x->shape[x->ndim - 1], rows = n ? fa_tensor_numel(x) / n : 0;
  fa_tensor *src = NULL, *dst = NULL, *out = opts->out;
  if ((st = rows_of(ctx, x, compute, &src))) return st;
  if (out && out->dtype == compute && fa_tensor_is_contiguous(out) && usable_in_place(out, src)) {
    fa_tensor_retain(out);
    dst = out;
  } else if (src != x) {
    fa_tensor_retain(src); /* a private copy: normalise in place */
    dst = src;
  } else if ((st = fa_tensor_new_like(ctx, x, compute, dev, &dst))) {
    goto done;
  }
  if (rows && (st = run_backend(ctx, opts, x, src, dst, rows, n))) goto done;
  if (out && dst != out) {
    if (!(st = fa_tensor_copy(ctx, out, dst))) {
      fa_tensor_retain(out);
      *y = out;
    }
  } else if (out || dst->dtype == x->dtype) {
    fa_tensor_retain(dst);
    *y = dst;
  } else {
    st = fa_tensor_to(ctx, dst, x->dtype, dev, y);
  }
done:
  fa_tensor_drop(&src);
  fa_tensor_drop(&dst);
  return st;
}
