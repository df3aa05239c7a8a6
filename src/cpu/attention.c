/* CPU attention: dispatch to the algorithms, and the per-thread
 * workspaces they share. */
#include "cpu/attention_algos.h"

#include <omp.h>
#include <stdint.h>

fa_status fa_cpu_attention(fa_context *ctx, fa_attention_algo algo, const fa_attn_problem *p) {
  switch (algo) {
  case FA_ATTN_NAIVE: return fa_cpu_attention_naive(ctx, p);
  case FA_ATTN_TWO_PASS: return fa_cpu_attention_two_pass(ctx, p);
  case FA_ATTN_FLASH_ROW: return fa_cpu_attention_flash_row(ctx, p);
  case FA_ATTN_AUTO: /* resolved by the caller; flash is the right answer anyway */
  case FA_ATTN_FLASH: return fa_cpu_attention_flash(ctx, p);
  }
  return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: unknown attention algorithm %d", (int)algo);
}

size_t fa_attn_bytes(size_t n, size_t size) {
  if (size != 0 && n > (SIZE_MAX - 63) / size) return 0;
  return (n * size + 63) / 64 * 64;
}

fa_status fa_attn_workspace_init(fa_context *ctx, fa_attn_workspace *w, int64_t work_items, double flops,
                                 size_t slice_bytes) {
  const int threads = fa_cpu_threads_for(work_items, flops);
  w->base = 0;
  w->threads = threads;
  w->slice = (slice_bytes + 63) / 64 * 64;
  if (w->slice == 0 || slice_bytes > SIZE_MAX - 63 || w->slice > SIZE_MAX / (size_t)threads)
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: attention workspace of %d x %zu bytes is too large",
                   threads, slice_bytes);
  w->total = w->slice * (size_t)threads;
  fa_status st = FA_OK;
  w->base = fa_host_alloc(ctx, w->total, &st);
  if (!w->base) return st != FA_OK ? st : FA_ERR_OUT_OF_MEMORY;
  return FA_OK;
}

void fa_attn_workspace_free(fa_attn_workspace *w) {
  if (w->base) fa_host_free(w->base, w->total);
  w->base = 0;
}
