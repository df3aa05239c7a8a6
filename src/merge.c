/* fa_merge_states: two partial attentions over disjoint key sets combined
 * by the seeds' rescale-and-add, in log space. */
#include "check.h"

#include <stdio.h>

/* A contiguous copy of t in dtype on device (t itself, retained, when it is one). */
static fa_status contiguous_as(fa_context *ctx, fa_tensor *t, fa_dtype dtype, fa_device device, fa_tensor **out) {
  if (device == FA_CPU) return fa_tensor_cpu_contiguous(ctx, t, dtype, out);
  fa_tensor *conv = NULL;
  fa_status st = fa_tensor_to(ctx, t, dtype, device, &conv);
  if (!st) st = fa_tensor_contiguous(ctx, conv, out);
  fa_tensor_drop(&conv);
  return st;
}

/* State t as merge_pair reads it (API §6: where it lies): t itself,
 * retained, when it is of dtype compute on dev, or on the CPU f16/bf16
 * merged in f32 (widened a row at a time), with its last dimension
 * contiguous; else a contiguous copy in the compute dtype. */
static fa_status state_operand(fa_context *ctx, fa_tensor *t, fa_dtype compute, fa_device dev, fa_tensor **out) {
  const int64_t dv = t->shape[t->ndim - 1];
  const int half_on_cpu = dev == FA_CPU && compute == FA_F32 && (t->dtype == FA_F16 || t->dtype == FA_BF16);
  if ((t->dtype == compute || half_on_cpu) && t->storage->device == dev && (dv <= 1 || t->strides[t->ndim - 1] == 1)) {
    fa_tensor_retain(t);
    *out = t;
    return FA_OK;
  }
  return contiguous_as(ctx, t, compute, dev, out);
}

/* The merge of (a, la) and (b, lb), states in dtype compute read at their
 * rows and lse contiguous in f64 on dev, into fresh contiguous tensors of
 * a's shape (dtype compute) and la's (f64). */
static fa_status merge_pair(fa_context *ctx, fa_dtype compute, fa_device dev, fa_tensor *a, fa_tensor *la, fa_tensor *b,
                            fa_tensor *lb, fa_tensor **ro, fa_tensor **rl) {
  fa_status st;
  if ((st = fa_tensor_new_like(ctx, a, compute, dev, ro))) return st;
  if ((st = fa_tensor_new_like(ctx, la, FA_F64, dev, rl))) {
    fa_tensor_drop(ro);
    return st;
  }
  /* one row per lse entry (also when dv = 0: the lse still merge) */
  const fa_merge_operands g = {fa_tensor_ptr(a), fa_tensor_ptr(b), fa_tensor_rows(a), fa_tensor_rows(b),
                               fa_tensor_ptr(la), fa_tensor_ptr(lb), fa_tensor_ptr(*ro), fa_tensor_ptr(*rl),
                               fa_tensor_numel(la), a->shape[a->ndim - 1], a->dtype, b->dtype};
  if (dev == FA_CUDA) st = fa_cuda_merge_states(ctx, compute, &g);
  else fa_cpu_merge_states(compute, &g);
  if (st) fa_tensor_drop(ro), fa_tensor_drop(rl);
  return st;
}

/* The merge of n >= 1 checked states (os[0] names the kinds), folded left
 * to right in dtype compute: (o, lse) fresh tensors in os[0]'s and
 * lses[0]'s dtypes.  Exact with empty states (lse = -inf): merge_pair
 * passes the other side through bit for bit. */
static fa_status merge_fold(fa_context *ctx, fa_dtype compute, int64_t n, fa_tensor *const *os, fa_tensor *const *lses,
                            fa_tensor **o, fa_tensor **lse) {
  const fa_device dev = os[0]->storage->device;
  fa_tensor *acc = NULL, *lacc = NULL, *b = NULL, *lb = NULL;
  fa_status st;
  if ((st = state_operand(ctx, os[0], compute, dev, &acc)) || (st = contiguous_as(ctx, lses[0], FA_F64, dev, &lacc)))
    goto done;
  for (int64_t i = 1; i < n && !st; i++) {
    fa_tensor *ro = NULL, *rl = NULL;
    if ((st = state_operand(ctx, os[i], compute, dev, &b)) || (st = contiguous_as(ctx, lses[i], FA_F64, dev, &lb)) ||
        (st = merge_pair(ctx, compute, dev, acc, lacc, b, lb, &ro, &rl)))
      break;
    fa_tensor_drop(&acc), fa_tensor_drop(&lacc), fa_tensor_drop(&b), fa_tensor_drop(&lb);
    acc = ro, lacc = rl;
  }
  /* fresh outputs, never an input itself (n = 1, or a state already in the compute dtype) */
  if (!st && !(st = fa_tensor_new_like(ctx, os[0], os[0]->dtype, dev, o)) &&
      !(st = fa_tensor_new_like(ctx, lses[0], lses[0]->dtype, dev, lse)) && !(st = fa_tensor_copy(ctx, *o, acc)))
    st = fa_tensor_copy(ctx, *lse, lacc);
  if (st) fa_tensor_drop(o), fa_tensor_drop(lse);
done:
  fa_tensor_drop(&acc), fa_tensor_drop(&lacc), fa_tensor_drop(&b), fa_tensor_drop(&lb);
  return st;
}

fa_status fa_merge_states(fa_context *ctx, fa_tensor *o1, fa_tensor *lse1, fa_tensor *o2, fa_tensor *lse2,
                          fa_tensor **o, fa_tensor **lse) {
  if (!o || !lse) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: merge_states: an output pointer is NULL");
  *o = *lse = NULL;
  FA_NEED(ctx);
  fa_status st = fa_check_merge(ctx, o1, lse1, o2, lse2);
  if (st) return st;
  /* states in f32 on the CPU (f64 for f64), in their dtype on the GPU; lse in f64 on both */
  const fa_dtype compute = o1->storage->device == FA_CUDA ? o1->dtype : o1->dtype == FA_F64 ? FA_F64 : FA_F32;
  fa_tensor *os[2] = {o1, o2}, *lses[2] = {lse1, lse2};
  return merge_fold(ctx, compute, 2, os, lses, o, lse);
}

fa_status fa_merge_states_n(fa_context *ctx, int64_t n, fa_tensor *const *os, fa_tensor *const *lses, fa_tensor **o,
                            fa_tensor **lse) {
  if (!o || !lse) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: merge_states: an output pointer is NULL");
  *o = *lse = NULL;
  FA_NEED(ctx);
  if (n < 1) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: merge_states: expected at least 1 state, got %lld", (long long)n);
  if (!os || !lses) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: merge_states: the %s array is NULL", os ? "lse" : "o");
  for (int64_t i = 0; i < n; i++) { /* each state against the first: one shape, dtype and device */
    char o1[32], l1[32], oi[32], li[32];
    snprintf(o1, sizeof o1, "os[1]"), snprintf(l1, sizeof l1, "lses[1]");
    snprintf(oi, sizeof oi, "os[%lld]", (long long)i + 1), snprintf(li, sizeof li, "lses[%lld]", (long long)i + 1);
    const fa_merge_names names = {o1, l1, oi, li};
    fa_status st = fa_check_merge_named(ctx, os[0], lses[0], os[i], lses[i], &names);
    if (st) return st;
  }
  /* in f32 on both backends (f64 for f64): a chain of merges in f16 would round at every step */
  const fa_dtype compute = os[0]->dtype == FA_F64 ? FA_F64 : FA_F32;
  return merge_fold(ctx, compute, n, os, lses, o, lse);
}
