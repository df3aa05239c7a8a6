/* fa_timer_start / fa_timer_stop: device events on CUDA, the monotonic
 * clock on the CPU. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include "internal.h"

#include <time.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

fa_status fa_timer_start(fa_context *ctx) {
  FA_NEED(ctx);
  ctx->timer_device = ctx->device;
  if (ctx->device == FA_CUDA) {
    const fa_status st = fa_cuda_timer_start(ctx);
    ctx->timer_started = st == FA_OK;
    return st;
  }
  ctx->timer_start_ms = now_ms();
  ctx->timer_started = 1;
  return FA_OK;
}

fa_status fa_timer_stop(fa_context *ctx, double *ms) {
  FA_NEED(ctx);
  FA_NEED(ms);
  *ms = 0;
  if (!ctx->timer_started)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: fa_timer_stop: the context's timer was not started (fa_timer_start)");
  if (ctx->timer_device != ctx->device)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: fa_timer_stop: the timer was started on %s, the context is on %s now",
                   fa_device_name(ctx->timer_device), fa_device_name(ctx->device));
  if (ctx->device == FA_CUDA) return fa_cuda_timer_stop(ctx, ms);
  *ms = now_ms() - ctx->timer_start_ms;
  return FA_OK;
}
