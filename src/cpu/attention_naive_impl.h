/* Body of attention_naive.c for one compute type (attention_instantiate.h).
 *
 * The standard method on one whole head: S = Q·Kᵀ (gemm, Lq x Lk, over the
 * union of the rows' key ranges), scores, a safe softmax per row (max,
 * e^(s - max), sum, normalise), O = P·V (gemm).  It runs as a query tile
 * of all Lq rows with one key tile of all Lk keys, so S is materialised. */
#include "cpu/attention_query_tile_impl.h"

static void FA_R(naive_head)(const fa_attn_problem *p, const FA_R(qtile) *t, const FA_R(qtile_ws) *w) {
  const int64_t n = t->uhi - t->ulo, ld = p->tile_k;
  if (n > 0) {
    FA_R(qtile_scores)(p, t, w, t->ulo, n);
    /* one online step over whole rows is the safe softmax's max and sum */
    FA_R(fa_attn_online)(w->s, ld, t->rows, n, w->m, w->l, w->alpha);
    for (int64_t r = 0; r < t->rows; r++) {
      if (w->l[r] == 0) continue; /* nothing attended: already all zero */
      REAL *row = w->s + r * ld;
      const REAL inv = 1 / w->l[r];
      for (int64_t j = 0; j < n; j++) row[j] *= inv;
    }
    FA_R(qtile_pv)(p, t, w, ld, t->ulo, n);
  }
  FA_R(qtile_finish)(p, t, w, 0);
}
