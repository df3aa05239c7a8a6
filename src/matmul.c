/* fa_matmul: the seeds' naive and tiled products and the BLAS one. */
#include "check.h"

#include <string.h>

void fa_matmul_opts_init(fa_matmul_opts *o) { memset(o, 0, sizeof *o); }

fa_status fa_matmul(fa_context *ctx, fa_tensor *a, fa_tensor *b, const fa_matmul_opts *opts, fa_tensor **c) {
  fa_matmul_opts defaults;
  if (!opts) {
    fa_matmul_opts_init(&defaults);
    opts = &defaults;
  }
  if (!c) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: matmul: the output pointer is NULL");
  *c = NULL;
  fa_status st = fa_check_matmul(ctx, a, b, opts);
  if (st) return st;
  if (a->storage->device == FA_CUDA)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: matmul: the CUDA backend has no matmul yet "
                                            "(move the tensors to the cpu)");
  fa_dtype compute = a->dtype == FA_F64 ? FA_F64 : FA_F32;
  int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
  int64_t shape[2] = {m, n};
  fa_tensor *ac = NULL, *bc = NULL, *cc = NULL, *out = opts->out;
  if ((st = fa_tensor_cpu_contiguous(ctx, a, compute, &ac)) || (st = fa_tensor_cpu_contiguous(ctx, b, compute, &bc)))
    goto done;
  if (out && out->dtype == compute && fa_tensor_is_contiguous(out) && out->storage != a->storage &&
      out->storage != b->storage) {
    fa_tensor_retain(out);
    cc = out;
  } else if ((st = fa_tensor_new(ctx, 2, shape, compute, FA_CPU, &cc))) {
    goto done;
  }
  if ((st = fa_cpu_matmul(ctx, opts->algo, opts->tile, compute, fa_tensor_ptr(ac), fa_tensor_ptr(bc),
                          fa_tensor_ptr(cc), m, k, n)))
    goto done;
  if (out && cc != out) {
    if (!(st = fa_tensor_copy(ctx, out, cc))) {
      fa_tensor_retain(out);
      *c = out;
    }
  } else if (out || compute == a->dtype) {
    fa_tensor_retain(cc);
    *c = cc;
  } else {
    st = fa_tensor_to(ctx, cc, a->dtype, FA_CPU, c);
  }
done:
  fa_tensor_drop(&ac);
  fa_tensor_drop(&bc);
  fa_tensor_drop(&cc);
  return st;
}
