/* fa_merge_states: two partial attentions over disjoint key sets combined
 * by the seeds' rescale-and-add, in log space. */
#include "check.h"

/* On the GPU: f32/f16/bf16 states in their dtype, lse in f64. */
static fa_status merge_cuda(fa_context *ctx, fa_tensor *o1, fa_tensor *lse1, fa_tensor *o2, fa_tensor *lse2,
                            fa_tensor **o, fa_tensor **lse) {
  fa_tensor *a = NULL, *b = NULL, *la = NULL, *lb = NULL, *ro = NULL, *rl = NULL;
  fa_status st;
  if ((st = fa_tensor_contiguous(ctx, o1, &a)) || (st = fa_tensor_contiguous(ctx, o2, &b)) ||
      (st = fa_tensor_to(ctx, lse1, FA_F64, FA_CUDA, &la)) || (st = fa_tensor_to(ctx, lse2, FA_F64, FA_CUDA, &lb)) ||
      (st = fa_tensor_new_like(ctx, o1, o1->dtype, FA_CUDA, &ro)) ||
      (st = fa_tensor_new_like(ctx, lse1, FA_F64, FA_CUDA, &rl)))
    goto done;
  fa_tensor *lac = NULL, *lbc = NULL;
  if (!(st = fa_tensor_contiguous(ctx, la, &lac)) && !(st = fa_tensor_contiguous(ctx, lb, &lbc))) {
    int64_t dv = o1->shape[o1->ndim - 1], rows = fa_tensor_numel(lse1);
    st = fa_cuda_merge_states(ctx, o1->dtype, fa_tensor_ptr(a), fa_tensor_ptr(lac), fa_tensor_ptr(b),
                              fa_tensor_ptr(lbc), fa_tensor_ptr(ro), fa_tensor_ptr(rl), rows, dv);
  }
  fa_tensor_drop(&lac);
  fa_tensor_drop(&lbc);
  if (st) goto done;
  if ((st = fa_tensor_to(ctx, rl, lse1->dtype, FA_CUDA, lse))) goto done;
  *o = ro;
  ro = NULL;
done:
  fa_tensor_drop(&a);
  fa_tensor_drop(&b);
  fa_tensor_drop(&la);
  fa_tensor_drop(&lb);
  fa_tensor_drop(&ro);
  fa_tensor_drop(&rl);
  return st;
}

fa_status fa_merge_states(fa_context *ctx, fa_tensor *o1, fa_tensor *lse1, fa_tensor *o2, fa_tensor *lse2,
                          fa_tensor **o, fa_tensor **lse) {
  if (!o || !lse) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: merge_states: an output pointer is NULL");
  *o = *lse = NULL;
  fa_status st = fa_check_merge(ctx, o1, lse1, o2, lse2);
  if (st) return st;
  if (o1->storage->device == FA_CUDA) return merge_cuda(ctx, o1, lse1, o2, lse2, o, lse);
  fa_dtype compute = o1->dtype == FA_F64 ? FA_F64 : FA_F32;
  fa_tensor *a = NULL, *b = NULL, *la = NULL, *lb = NULL, *ro = NULL, *rl = NULL;
  if ((st = fa_tensor_cpu_contiguous(ctx, o1, compute, &a)) || (st = fa_tensor_cpu_contiguous(ctx, o2, compute, &b)) ||
      (st = fa_tensor_cpu_contiguous(ctx, lse1, FA_F64, &la)) ||
      (st = fa_tensor_cpu_contiguous(ctx, lse2, FA_F64, &lb)) ||
      (st = fa_tensor_new_like(ctx, o1, compute, FA_CPU, &ro)) ||
      (st = fa_tensor_new_like(ctx, lse1, FA_F64, FA_CPU, &rl)))
    goto done;
  /* one row per lse entry (also when dv = 0: the lse still merge) */
  int64_t dv = o1->shape[o1->ndim - 1], rows = fa_tensor_numel(lse1);
  fa_cpu_merge_states(compute, fa_tensor_ptr(a), fa_tensor_ptr(la), fa_tensor_ptr(b), fa_tensor_ptr(lb),
                      fa_tensor_ptr(ro), fa_tensor_ptr(rl), rows, dv);
  if ((st = fa_tensor_to(ctx, ro, o1->dtype, FA_CPU, o))) goto done;
  if ((st = fa_tensor_to(ctx, rl, lse1->dtype, FA_CPU, lse))) fa_tensor_drop(o);
done:
  fa_tensor_drop(&a);
  fa_tensor_drop(&b);
  fa_tensor_drop(&la);
  fa_tensor_drop(&lb);
  fa_tensor_drop(&ro);
  fa_tensor_drop(&rl);
  return st;
}
