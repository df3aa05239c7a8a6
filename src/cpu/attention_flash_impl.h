/* Body of attention_flash.c for one compute type (attention_instantiate.h).
 *
 * For each key tile that some row of the query tile attends:
 * S = Q·Kᵀ (gemm) -> scores -> online step (m, l, alpha) -> O rows *= alpha
 * -> O += P·V (gemm, beta = 1).  Finally O /= l.  The output rows in p->o
 * are the running output (staged in the workspace when p->storage is
 * another dtype), so the workspace is one S tile and row stats. */
#include "cpu/attention_query_tile_impl.h"

static void FA_R(flash_tile)(const fa_attn_problem *p0, const FA_R(qtile) *t, const FA_R(qtile_ws) *w) {
  const int64_t Dv = p0->Dv, Bc = p0->tile_k, ldo = t->ldo;
  fa_attn_problem full;
  if (p0->block_mask || p0->mask_mod) full = *p0, full.mask_mod = NULL;
  for (int64_t j0 = t->ulo; j0 < t->uhi; j0 += Bc) {
    const int64_t n = t->uhi - j0 < Bc ? t->uhi - j0 : Bc;
    const fa_attn_problem *p;
    if (!FA_R(qtile_attends)(t, w, j0, n) || FA_R(qtile_block)(p0, t, j0, n, &full, &p) == FA_BLOCK_EMPTY) continue;
    FA_R(qtile_scores)(p, t, w, j0, n);
    FA_R(fa_attn_online)(w->s, Bc, t->rows, n, w->m, w->l, w->alpha);
    for (int64_t r = 0; r < t->rows; r++) {
      const REAL a = w->alpha[r];
      if (a == 1) continue;
      REAL *orow = t->o + r * ldo;
      for (int64_t d = 0; d < Dv; d++) orow[d] *= a;
    }
    FA_R(qtile_pv)(p, t, w, Bc, j0, n);
  }
  FA_R(qtile_finish)(p0, t, w, 1);
}
