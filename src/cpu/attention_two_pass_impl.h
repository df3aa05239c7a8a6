/* Body of attention_two_pass.c for one compute type (attention_instantiate.h).
 *
 * Pass 1 runs over the key tiles for the statistics alone: m (row max) and
 * l (sum of e^(s - m)) with the online rescale.  Pass 2 recomputes every
 * score tile and accumulates O += (e^(s - m) / l)·V: the probabilities are
 * final, so the output needs no rescaling. */
#include "cpu/attention_query_tile_impl.h"

static void FA_R(two_pass_tile)(const fa_attn_problem *p0, const FA_R(qtile) *t, const FA_R(qtile_ws) *w) {
  const int64_t Bc = p0->tile_k;
  fa_attn_problem full;
  const fa_attn_problem *p;
  if (p0->block_mask || p0->mask_mod) full = *p0, full.mask_mod = NULL;
  for (int64_t j0 = t->ulo; j0 < t->uhi; j0 += Bc) { /* pass 1: statistics */
    const int64_t n = t->uhi - j0 < Bc ? t->uhi - j0 : Bc;
    if (!FA_R(qtile_attends)(t, w, j0, n) || FA_R(qtile_block)(p0, t, j0, n, &full, &p) == FA_BLOCK_EMPTY) continue;
    FA_R(qtile_scores)(p, t, w, j0, n);
    FA_R(fa_attn_online)(w->s, Bc, t->rows, n, w->m, w->l, w->alpha);
  }
  for (int64_t j0 = t->ulo; j0 < t->uhi; j0 += Bc) { /* pass 2: probabilities times V */
    const int64_t n = t->uhi - j0 < Bc ? t->uhi - j0 : Bc;
    if (!FA_R(qtile_attends)(t, w, j0, n) || FA_R(qtile_block)(p0, t, j0, n, &full, &p) == FA_BLOCK_EMPTY) continue;
    FA_R(qtile_scores)(p, t, w, j0, n);
    for (int64_t r = 0; r < t->rows; r++) {
      REAL *row = w->s + r * Bc;
      if (w->l[r] == 0) { /* nothing attended: the row contributes nothing */
        memset(row, 0, (size_t)n * sizeof *row);
        continue;
      }
      FA_R(fa_attn_exp_sum)(row, n, w->m[r]);
      const REAL inv = 1 / w->l[r];
      for (int64_t j = 0; j < n; j++) row[j] *= inv;
    }
    FA_R(qtile_pv)(p, t, w, Bc, j0, n);
  }
  FA_R(qtile_finish)(p0, t, w, 0);
}
