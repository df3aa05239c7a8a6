/* "flash_row": the seeds' one-pass recurrence, one query row at a time,
 * written plainly (no BLAS, no tiling); OpenMP over rows. */
#include "cpu/attention_algos.h"
#include "cpu/attention_scores.h"

#include <omp.h>

#define FA_IMPL "cpu/attention_flash_row_impl.h"
#include "cpu/attention_instantiate.h"

fa_status fa_cpu_attention_flash_row(fa_context *ctx, const fa_attn_problem *p) {
  return p->compute == FA_F64 ? flash_row_all_f64(ctx, p) : flash_row_all_f32(ctx, p);
}
