/* "naive": the standard method.  S = Q·Kᵀ and P = softmax(S) materialised
 * for a whole head, then O = P·V; OpenMP over (batch, head), one S buffer
 * of Lq x Lk per thread. */
#include "cpu/attention_algos.h"
#include "cpu/attention_scores.h"

#include <limits.h>
#include <omp.h>
#include <stdint.h>

#define FA_IMPL "cpu/attention_naive_impl.h"
#include "cpu/attention_instantiate.h"

fa_status fa_cpu_attention_naive(fa_context *ctx, const fa_attn_problem *p) {
  if (p->Lq > INT_MAX || p->Lk > INT_MAX) /* BLAS sizes are int */
    return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                   "flashattn: attention: algo \"naive\" takes Lq and Lk up to %d, got %lld and %lld", INT_MAX,
                   (long long)p->Lq, (long long)p->Lk);
  fa_attn_problem whole = *p; /* one query tile and one key tile per head */
  whole.tile_q = p->Lq > 0 ? p->Lq : 1;
  whole.tile_k = p->Lk > 0 ? p->Lk : 1;
  whole.key_chunks = 1; /* the standard method: a head's keys in one softmax (opts.splits: pieces) */
  return p->compute == FA_F64 ? qtile_run_f64(ctx, &whole, naive_head_f64) : qtile_run_f32(ctx, &whole, naive_head_f32);
}
