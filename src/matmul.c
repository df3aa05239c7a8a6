/* fa_matmul: the seeds' naive and tiled products and the BLAS one, on
 * operands read where they lie when their rows allow (mm_operand). */
#include "check.h"

#include <limits.h>
#include <string.h>

void fa_matmul_opts_init(fa_matmul_opts *o) {
  if (o) memset(o, 0, sizeof *o);
}

/* t as an operand read where it lies (API §6), retained into *use with its
 * rows' stride in *ld: in the compute dtype, the last dimension
 * contiguous, rows at least a row apart and within BLAS's int; else a
 * contiguous copy (on the CPU converted to the compute dtype), *ld its row. */
static fa_status mm_operand(fa_context *ctx, fa_tensor *t, fa_dtype compute, fa_tensor **use, int64_t *ld) {
  const int64_t rows = t->shape[0], cols = t->shape[1], row = cols > 1 ? cols : 1, rs = t->strides[0];
  if (t->dtype == compute && (cols <= 1 || t->strides[1] == 1) && (rows <= 1 || (rs >= row && rs <= INT_MAX))) {
    fa_tensor_retain(t);
    *use = t, *ld = rows <= 1 ? row : rs;
    return FA_OK;
  }
  *ld = row;
  if (t->storage->device == FA_CUDA) return fa_tensor_contiguous(ctx, t, use);
  return fa_tensor_cpu_contiguous(ctx, t, compute, use);
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
  fa_mm_operands g = {NULL, NULL, NULL, m, k, n, k, n};
  if ((st = mm_operand(ctx, a, compute, &ac, &g.lda)) || (st = mm_operand(ctx, b, compute, &bc, &g.ldb))) goto done;
  if (out && out->dtype == compute && fa_tensor_is_contiguous(out) && !fa_tensor_same_memory(out, a) &&
      !fa_tensor_same_memory(out, b)) {
    fa_tensor_retain(out);
    cc = out;
  } else if ((st = fa_tensor_new(ctx, 2, shape, compute, dev, &cc))) {
    goto done;
  }
  g.a = fa_tensor_ptr(ac), g.b = fa_tensor_ptr(bc), g.c = fa_tensor_ptr(cc);
  st = dev == FA_CUDA ? fa_cuda_matmul(ctx, opts->algo, opts->tile, compute, &g)
                      : fa_cpu_matmul(ctx, opts->algo, opts->tile, compute, &g);
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
