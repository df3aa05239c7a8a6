/* fa_matmul: the seeds' naive and tiled products and the BLAS one. */
#include "check.h"

#include <string.h>

void fa_matmul_opts_init(fa_matmul_opts *o) {
  if (o) memset(o, 0, sizeof *o);
}

fa_status fa_matmul(fa_context *ctx, fa_tensor *a, fa_tensor *b, const fa_matmul_opts *opts, fa_tensor **c) {
  fa_matmul_opts defaults;
  if (!opts) {
    fa_matmul_opts_init(&defaults);
    opts = &defaults;
  }
  if (!c) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: matmul: the output pointer is NULL");
  *c = NULL;
  FA_NEED(ctx);
  fa_status st = fa_check_matmul(ctx, a, b, opts);
  if (st) return st;
  fa_device dev = a->storage->device;
  /* the CPU computes f16/bf16 in f32; the GPU in the tensors' dtype */
  fa_dtype compute = dev == FA_CUDA || a->dtype == FA_F64 ? a->dtype : FA_F32;
  int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
  int64_t shape[2] = {m, n};
  fa_tensor *ac = NULL, *bc = NULL, *cc = NULL, *out = opts->out;
  if (dev == FA_CUDA) {
    if (!(st = fa_tensor_contiguous(ctx, a, &ac))) st = fa_tensor_contiguous(ctx, b, &bc);
  } else if (!(st = fa_tensor_cpu_contiguous(ctx, a, compute, &ac))) {
    st = fa_tensor_cpu_contiguous(ctx, b, compute, &bc);
  }
  if (st) goto done;
  if (out && out->dtype == compute && fa_tensor_is_contiguous(out) && out->storage != a->storage &&
      out->storage != b->storage) {
    fa_tensor_retain(out);
    cc = out;
  } else if ((st = fa_tensor_new(ctx, 2, shape, compute, dev, &cc))) {
    goto done;
  }
  if (dev == FA_CUDA)
    st = fa_cuda_matmul(ctx, opts->algo, opts->tile, compute, fa_tensor_ptr(ac), fa_tensor_ptr(bc), fa_tensor_ptr(cc),
                        m, k, n);
  else
    st = fa_cpu_matmul(ctx, opts->algo, opts->tile, compute, fa_tensor_ptr(ac), fa_tensor_ptr(bc), fa_tensor_ptr(cc), m,
                       k, n);
  if (st) goto done;
  if (out && cc != out) {
    if (!(st = fa_tensor_copy(ctx, out, cc))) {
      fa_tensor_retain(out);
      *c = out;
    }
  } else if (out || compute == a->dtype) {
    fa_tensor_retain(cc);
    *c = cc;
  } else {
    st = fa_tensor_to(ctx, cc, a->dtype, dev, c);
  }
done:
  fa_tensor_drop(&ac);
  fa_tensor_drop(&bc);
  fa_tensor_drop(&cc);
  return st;
}
