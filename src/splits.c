/* opts.splits for fa_attention (API §8): the keys cut into s contiguous
 * pieces, each attended by fa_attention and the partial states merged by
 * fa_merge_states_n.  Exact (within rounding) for every rule of §2: piece
 * [s, e) is computed on the keys [s, Lk) (a view) with kv_lens =
 * min(kv_lens[b], e) - s, so that the bottom-right diagonal, the window and
 * the alibi distances, which all count from the end of the keys, stay those
 * of the whole call; top_left's diagonal counts from the piece's start
 * (fa_attn_problem.key_base, on both backends); a mask is narrowed the same
 * way; the variants' k too (the CPU's expressions and cuda's compiled ones
 * add key_base).
 * The decode kernel on cuda (kernels/attention/attention_decode.cuh) takes
 * opts.splits itself, as chunks of one launch, "auto" (0) chosen from the
 * shape and the GPU; this path is for the other calls, where "auto" is 1. */
#include "splits.h"

#include <string.h>

int64_t fa_attention_splits_resolve(const fa_attention_opts *o, const fa_attn_dims *d) {
  int64_t s = o && o->splits > 0 ? o->splits : 1;
  if (s > d->Lk) s = d->Lk;
  return s < 1 ? 1 : s;
}

fa_status fa_attention_splits_run(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                                  const fa_attn_dims *d, int64_t splits, fa_tensor **out, fa_tensor **lse) {
  const int want_lse = o->return_lse || lse != NULL || o->lse_out;
  const int kdim = k->ndim - 2; /* the key dimension */
  fa_status st = FA_OK;
  size_t nbytes = sizeof(fa_tensor *) * 2 * (size_t)splits + sizeof(int64_t) * (size_t)d->B;
  fa_tensor **os = fa_host_alloc(ctx, nbytes, &st);
  if (!os) return st;
  memset(os, 0, nbytes);
  fa_tensor **lses = os + splits;
  int64_t *lens = (int64_t *)(lses + splits);
  fa_tensor *kp = NULL, *vp = NULL, *mp = NULL, *ro = NULL, *rl = NULL;
  for (int64_t i = 0; i < splits && !st; i++) {
    const int64_t s = d->Lk * i / splits, e = d->Lk * (i + 1) / splits;
    for (int64_t b = 0; b < d->B; b++) {
      int64_t end = o->kv_lens && o->kv_lens[b] < e ? o->kv_lens[b] : e;
      lens[b] = end > s ? end - s : 0;
    }
    fa_attention_opts po = *o;
    po.splits = 1, po.out = po.lse_out = NULL, po.return_lse = 1;
    po.block_mask = NULL; /* made for the whole call's keys: each piece evaluates mask_mod itself */
    po.kv_lens = lens, po.n_kv_lens = d->B;
    if ((st = fa_tensor_narrow(ctx, k, kdim, s, d->Lk - s, &kp)) ||
        (st = fa_tensor_narrow(ctx, v, kdim, s, d->Lk - s, &vp)))
      break;
    if (o->mask && o->mask->shape[o->mask->ndim - 1] != 1) {
      if ((st = fa_tensor_narrow(ctx, o->mask, o->mask->ndim - 1, s, d->Lk - s, &mp))) break;
      po.mask = mp;
    }
    st = fa_attention_piece(ctx, q, kp, vp, &po, s, &os[i], &lses[i]);
    fa_tensor_drop(&kp), fa_tensor_drop(&vp), fa_tensor_drop(&mp);
  }
  if (!st) st = fa_merge_states_n(ctx, splits, os, lses, &ro, &rl);
  for (int64_t i = 0; i < splits; i++) {
    if (os[i]) fa_tensor_release(os[i]);
    if (lses[i]) fa_tensor_release(lses[i]);
  }
  fa_host_free(os, nbytes);
  if (!st)
    st = fa_attn_deliver(ctx, q, d->rank, d->Dv, ro, want_lse ? rl : NULL, o->out, o->lse_out, d->dtype, FA_F32,
                         d->device, out, lse);
  fa_tensor_drop(&ro), fa_tensor_drop(&rl), fa_tensor_drop(&kp), fa_tensor_drop(&vp), fa_tensor_drop(&mp);
  return st;
}
