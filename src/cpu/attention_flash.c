/* "flash": tiled and fused attention, the CPU engine proper.  Query tiles
 * x key tiles with the online-softmax rescale, two gemms per tile pair,
 * O(tile) memory per thread, OpenMP over (batch, head, query tile). */
#include "cpu/attention_algos.h"
#include "cpu/attention_scores.h"

#include <omp.h>

#define FA_IMPL "cpu/attention_flash_impl.h"
#include "cpu/attention_instantiate.h"

fa_status fa_cpu_attention_flash(fa_context *ctx, const fa_attn_problem *p) {
  return p->compute == FA_F64 ? qtile_run_f64(ctx, p, flash_tile_f64) : qtile_run_f32(ctx, p, flash_tile_f32);
}
