/* The key range a query row may attend to: causal, sliding window and
 * kv_lens, all of which leave an interval.  Elementwise masks are applied
 * per score elsewhere. */
#include "internal.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

void fa_attn_key_range(const fa_attn_problem *p, int64_t b, int64_t i, int64_t *lo, int64_t *hi) {
  /* off aligns the last query with the last key (bottom-right); diag is
   * the key on query i's diagonal, in [Lk - Lq, Lk - 1]. */
  const int64_t off = p->Lk - p->Lq, diag = i + off;
  /* A window wider than Lk + Lq restricts nothing; capping it there keeps
   * diag ± width from overflowing. */
  const int64_t widest = p->Lk + p->Lq;
  int64_t a = 0, e = p->Lk;
  if (p->kv_lens) e = min64(e, p->kv_lens[b]);
  if (p->causal == FA_CAUSAL_BOTTOM_RIGHT)
    e = min64(e, diag + 1);
  else if (p->causal == FA_CAUSAL_TOP_LEFT)
    e = min64(e, i + 1);
  if (p->has_window) {
    if (p->win_left >= 0) a = max64(a, diag - min64(p->win_left, widest));
    if (p->win_right >= 0) e = min64(e, diag + min64(p->win_right, widest) + 1);
  }
  a = min64(a, p->Lk);
  *lo = a;
  *hi = max64(e, a); /* empty ranges come back as hi == lo */
}
