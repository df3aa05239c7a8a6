/* fa_merge_states: two partial attentions over disjoint key sets combined
 * by the seeds' rescale-and-add, in log space. */
#include "check.h"

/* A contiguous copy of t in dtype on device (t itself, retained, when it is one). */
static fa_status contiguous_as(fa_context *ctx, fa_tensor *t, fa_dtype dtype, fa_device device, fa_tensor **out) {
  if (device == FA_CPU) return fa_tensor_cpu_contiguous(ctx, t, dtype, out);
  fa_tensor *conv = NULL;
  fa_status st = fa_tensor_to(ctx, t, dtype, device, &conv);
  if (!st) st = fa_tensor_contiguous(ctx, conv, out);
  fa_tensor_drop(&conv);
  return st;
}

fa_status fa_merge_states(fa_context *ctx, fa_tensor *o1, fa_tensor *lse1, fa_tensor *o2, fa_tensor *lse2,
                          fa_tensor **o, fa_tensor **lse) {
  if (!o || !lse) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: merge_states: an output pointer is NULL");
  *o = *lse = NULL;
  FA_NEED(ctx);
  fa_status st = fa_check_merge(ctx, o1, lse1, o2, lse2);
  if (st) return st;
  fa_device dev = o1->storage->device;
  /* states in f32 on the CPU (f64 for f64), in their dtype on the GPU; lse in f64 on both */
  fa_dtype compute = dev == FA_CUDA ? o1->dtype : o1->dtype == FA_F64 ? FA_F64 : FA_F32;
  fa_tensor *a = NULL, *b = NULL, *la = NULL, *lb = NULL, *ro = NULL, *rl = NULL;
  if ((st = contiguous_as(ctx, o1, compute, dev, &a)) || (st = contiguous_as(ctx, o2, compute, dev, &b)) ||
      (st = contiguous_as(ctx, lse1, FA_F64, dev, &la)) || (st = contiguous_as(ctx, lse2, FA_F64, dev, &lb)) ||
      (st = fa_tensor_new_like(ctx, o1, compute, dev, &ro)) || (st = fa_tensor_new_like(ctx, lse1, FA_F64, dev, &rl)))
    goto done;
  /* one row per lse entry (also when dv = 0: the lse still merge) */
  int64_t dv = o1->shape[o1->ndim - 1], rows = fa_tensor_numel(lse1);
  if (dev == FA_CUDA)
    st = fa_cuda_merge_states(ctx, compute, fa_tensor_ptr(a), fa_tensor_ptr(la), fa_tensor_ptr(b), fa_tensor_ptr(lb),
                              fa_tensor_ptr(ro), fa_tensor_ptr(rl), rows, dv);
  else
    fa_cpu_merge_states(compute, fa_tensor_ptr(a), fa_tensor_ptr(la), fa_tensor_ptr(b), fa_tensor_ptr(lb),
                        fa_tensor_ptr(ro), fa_tensor_ptr(rl), rows, dv);
  if (st || (st = fa_tensor_to(ctx, ro, o1->dtype, dev, o))) goto done;
  if ((st = fa_tensor_to(ctx, rl, lse1->dtype, dev, lse))) fa_tensor_drop(o);
done:
  fa_tensor_drop(&a);
  fa_tensor_drop(&b);
  fa_tensor_drop(&la);
  fa_tensor_drop(&lb);
  fa_tensor_drop(&ro);
  fa_tensor_drop(&rl);
  return st;
}
