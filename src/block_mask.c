/* fa.block_mask (API §9): per (b, h, query tile, key tile), whether a
 * mask_mod leaves the tile empty, full or partial (flashattn.h). */
#include "cpu/attention_tiles.h"
#include "expr.h"

#include <string.h>

/* The state of one tile: decided as a whole where the expression allows
 * (fa_expr_tile), else every pair evaluated until both a true and a
 * false are seen. */
static uint8_t tile_state(const fa_expr *e, const fa_block_mask *m, int64_t b, int64_t h, int64_t qi, int64_t ki) {
  const int64_t i1 = (qi + 1) * m->Br < m->Lq ? (qi + 1) * m->Br : m->Lq;
  const int64_t j1 = (ki + 1) * m->Bc < m->Lk ? (ki + 1) * m->Bc : m->Lk;
  const int whole = fa_expr_tile(e, b, h, qi * m->Br, i1 - 1, ki * m->Bc, j1 - 1);
  if (whole != 2) return (uint8_t)whole;
  int any = 0, all = 1;
  for (int64_t i = qi * m->Br; i < i1; i++)
    for (int64_t j = ki * m->Bc; j < j1; j++) {
      if (fa_expr_value(e, 0, b, h, i, j) != 0) any = 1;
      else all = 0;
      if (any && !all) return FA_BLOCK_PARTIAL;
    }
  return all ? FA_BLOCK_FULL : FA_BLOCK_EMPTY;
}

/* Whether the tiles are evaluated on cuda: the context's device is cuda
 * and every captured tensor is there (a CPU tensor keeps the CPU's). */
static int on_device(const fa_context *ctx, const fa_expr *e) {
  if (!ctx || ctx->device != FA_CUDA || !fa_cuda_available()) return 0;
  for (int t = 0; t < e->ntensors; t++)
    if (e->tensors[t]->storage->device != FA_CUDA) return 0;
  return 1;
}

fa_status fa_block_mask_new(fa_context *ctx, const fa_expr *e, int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                            int64_t Br, int64_t Bc, fa_block_mask **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(e);
  if (!e->nodes[e->n - 1].is_bool)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: block_mask: mask_mod: expected an expression of booleans");
  if (B < 1 || H < 1 || Lq < 1 || Lk < 1 || Lq > INT32_MAX || Lk > INT32_MAX || B > INT32_MAX || H > INT32_MAX)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: block_mask: expected B, H, Lq, Lk from 1 to %d, got %lld, %lld, "
                   "%lld, %lld", INT32_MAX, (long long)B, (long long)H, (long long)Lq, (long long)Lk);
  if (!Br && !Bc) Br = FA_CPU_DEFAULT_TILE_Q, Bc = FA_CPU_DEFAULT_TILE_K; /* FA_TILE_ZERO: a 0 written, refused */
  if (Br < FA_CPU_TILE_MIN || Br > FA_CPU_TILE_MAX || Bc < FA_CPU_TILE_MIN || Bc > FA_CPU_TILE_MAX)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: block_mask: opts.tile: expected {Br, Bc} with %d <= Br <= %d and %d <= Bc <= %d, got "
                   "{%lld, %lld}", FA_CPU_TILE_MIN, FA_CPU_TILE_MAX, FA_CPU_TILE_MIN, FA_CPU_TILE_MAX, (long long)(Br == FA_TILE_ZERO ? 0 : Br),
                   (long long)(Bc == FA_TILE_ZERO ? 0 : Bc));
  const int64_t nq = (Lq + Br - 1) / Br, nk = (Lk + Bc - 1) / Bc;
  if ((uint64_t)B * (uint64_t)H > ((uint64_t)1 << 40) / (uint64_t)nq / (uint64_t)nk)
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: block_mask: %lld x %lld x %lld x %lld tiles is too many",
                   (long long)B, (long long)H, (long long)nq, (long long)nk);
  fa_status st = FA_OK;
  fa_block_mask *m = fa_host_alloc(ctx, sizeof *m, &st);
  if (!m) return st;
  memset(m, 0, sizeof *m);
  m->B = B, m->H = H, m->Lq = Lq, m->Lk = Lk, m->Br = Br, m->Bc = Bc, m->nq = nq, m->nk = nk;
  m->expr = fa_expr_fingerprint(e);
  m->bytes = (size_t)(B * H * nq * nk);
  if (!(m->state = fa_host_alloc(ctx, m->bytes, &st))) {
    fa_block_mask_free(m);
    return st;
  }
  const int gpu = on_device(ctx, e);
  if ((st = fa_expr_begin(ctx, NULL, e, !gpu))) {
    fa_block_mask_free(m);
    return st;
  }
  if (gpu) {
    st = fa_cuda_block_mask(ctx, e, B, H, Lq, Lk, Br, Bc, m->state);
  } else {
    const int64_t rows = B * H * nq;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t r = 0; r < rows; r++)
      for (int64_t ki = 0; ki < nk; ki++)
        m->state[r * nk + ki] = tile_state(e, m, r / (H * nq), r / nq % H, r % nq, ki);
  }
  if (st) {
    fa_block_mask_free(m);
    return st;
  }
  if ((st = fa_expr_fault(ctx, e, "block_mask: mask_mod"))) {
    fa_block_mask_free(m);
    return st;
  }
  int64_t full = 0, partial = 0; /* two sums, not an increment of the state's counter (a dependence a byte) */
  for (size_t i = 0; i < m->bytes; i++) full += m->state[i] == FA_BLOCK_FULL, partial += m->state[i] == FA_BLOCK_PARTIAL;
  m->counts[FA_BLOCK_FULL] = full, m->counts[FA_BLOCK_PARTIAL] = partial;
  m->counts[FA_BLOCK_EMPTY] = (int64_t)m->bytes - full - partial;
  *out = m;
  return FA_OK;
}

void fa_block_mask_free(fa_block_mask *m) {
  if (!m) return;
  if (m->state) fa_host_free(m->state, m->bytes);
  if (m->dev_spans) fa_cuda_free(m->dev_spans, m->dev_bytes);
  fa_host_free(m, sizeof *m);
}

int fa_block_mask_tile(const fa_block_mask *m, int64_t b, int64_t h, int64_t qi, int64_t ki) {
  if (!m || b < 0 || b >= m->B || h < 0 || h >= m->H || qi < 0 || qi >= m->nq || ki < 0 || ki >= m->nk) return -1;
  return m->state[((b * m->H + h) * m->nq + qi) * m->nk + ki];
}

/* NULL is never a crash (docs/c-api.md): a NULL array is not written, a NULL mask gives zeros */
void fa_block_mask_counts(const fa_block_mask *m, int64_t counts[3]) {
  if (!counts) return;
  for (int i = 0; i < 3; i++) counts[i] = m ? m->counts[i] : 0;
}

void fa_block_mask_sizes(const fa_block_mask *m, int64_t sizes[6]) {
  if (!sizes) return;
  const int64_t s[6] = {m ? m->B : 0, m ? m->H : 0, m ? m->Lq : 0, m ? m->Lk : 0, m ? m->Br : 0, m ? m->Bc : 0};
  memcpy(sizes, s, sizeof s);
}
