/* "two_pass": the online statistics (m, l) of every query row first, then
 * a second pass that recomputes the scores and accumulates the normalised
 * probabilities times V.  Tiled like flash, with twice its Q·Kᵀ work. */
#include "cpu/attention_algos.h"
#include "cpu/attention_scores.h"

#include <omp.h>

#define FA_IMPL "cpu/attention_two_pass_impl.h"
#include "cpu/attention_instantiate.h"

fa_status fa_cpu_attention_two_pass(fa_context *ctx, const fa_attn_problem *p) {
  return p->compute == FA_F64 ? qtile_run_f64(ctx, p, two_pass_tile_f64) : qtile_run_f32(ctx, p, two_pass_tile_f32);
}
