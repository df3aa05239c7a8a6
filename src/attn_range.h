/* The key range a query row may attend to: causal, sliding window and
 * kv_lens each leave an interval, so together they leave one.  Elementwise
 * masks are applied per score elsewhere.  Shared by the CPU (C) and the
 * CUDA kernels (compiled for host and device), so the rule exists once. */
#ifndef FA_ATTN_RANGE_H
#define FA_ATTN_RANGE_H

#include "internal.h"
#include "host_device.h"

FA_HOST_DEVICE static inline int64_t fa_min64(int64_t a, int64_t b) { return a < b ? a : b; }
FA_HOST_DEVICE static inline int64_t fa_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* [*lo, *hi) for query row i of batch b; empty ranges come back as hi == lo. */
FA_HOST_DEVICE static inline void fa_attn_range_of(const fa_attn_problem *p, int64_t b, int64_t i, int64_t *lo,
                                                   int64_t *hi) {
  /* off aligns the last query with the last key (bottom-right); diag is
   * the key on query i's diagonal, in [Lk - Lq, Lk - 1]. */
  const int64_t off = p->Lk - p->Lq, diag = i + off;
  /* A window wider than Lk + Lq restricts nothing; capping it there keeps
   * diag ± width from overflowing. */
  const int64_t widest = p->Lk + p->Lq;
  int64_t a = 0, e = p->Lk;
  if (p->kv_lens) e = fa_min64(e, p->kv_lens[b]);
  if (p->causal == FA_CAUSAL_BOTTOM_RIGHT)
    e = fa_min64(e, diag + 1);
  else if (p->causal == FA_CAUSAL_TOP_LEFT)
    e = fa_min64(e, i + 1 - p->key_base);
  if (p->has_window) {
    if (p->win_left >= 0) a = fa_max64(a, diag - fa_min64(p->win_left, widest));
    if (p->win_right >= 0) e = fa_min64(e, diag + fa_min64(p->win_right, widest) + 1);
  }
  a = fa_min64(a, p->Lk);
  *lo = a;
  *hi = fa_max64(e, a);
}

#endif
