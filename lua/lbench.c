/* fa.bench(fn, {warmup=, rep=, flush_cache=}) and fa.sync().
 *
 * Each repetition: (flush the caches,) wait for the device, start the
 * context's timer, call fn, stop the timer (fa_timer_*: CUDA events on the
 * context's stream, the monotonic clock on the CPU). */
#include <stdlib.h>

#include "lbinding.h"

#define DEFAULT_WARMUP 3
#define DEFAULT_REP 20
#define BENCH_MAX ((int64_t)1 << 24) /* warmup + rep far from overflow, times[] at most 128 MiB */
#define DEVICE_FLUSH_ELEMS ((int64_t)32 << 20) /* 128 MiB of f32: twice an H100/H200 L2 */

static const char *const bench_keys[] = {"warmup", "rep", "flush_cache", NULL};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void set_num(lua_State *L, const char *key, double v) {
  lua_pushnumber(L, (lua_Number)v);
  lua_setfield(L, -2, key);
}

static int l_sync(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  FAL_CALL(L, ctx, fa_sync(ctx));
  return 0;
}

static int l_bench(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  int64_t warmup = DEFAULT_WARMUP, rep = DEFAULT_REP;
  int flush = 0;
  lua_settop(L, 2);
  if (lua_type(L, 1) != LUA_TFUNCTION) {
    if (luaL_getmetafield(L, 1, "__call") == LUA_TNIL) fal_typeerror(L, 1, "fn", "function");
    lua_pop(L, 1);
  }
  if (fal_opts(L, 2, "fa.bench", bench_keys)) {
    fal_opt_int(L, 2, "warmup", &warmup);
    fal_opt_int(L, 2, "rep", &rep);
    fal_opt_bool(L, 2, "flush_cache", &flush);
  }
  if (warmup < 0 || warmup > BENCH_MAX)
    fal_error(L, "opts.warmup: expected an integer from 0 to %I, got %I", (lua_Integer)BENCH_MAX, (lua_Integer)warmup);
  if (rep < 1 || rep > BENCH_MAX)
    fal_error(L, "opts.rep: expected an integer from 1 to %I, got %I", (lua_Integer)BENCH_MAX, (lua_Integer)rep);
  double *times = (double *)fal_newbuffer(L, rep, sizeof *times, "fa.bench"); /* 3 */

  /* on a GPU the flush writes a device buffer held only for this call, so
   * fa.memory() is back to where it was afterwards */
  fa_tensor **dev_flush = fal_newbox(L); /* 4 */
  if (flush && fa_context_device(ctx) == FA_CUDA) {
    int64_t n = DEVICE_FLUSH_ELEMS;
    FAL_CALL(L, ctx, fa_tensor_empty(ctx, 1, &n, FA_F32, FA_CUDA, dev_flush));
  }

  for (int64_t i = 0; i < warmup + rep; i++) {
    if (flush) {
      fal_flush_host_cache(L);
      if (*dev_flush) FAL_CALL(L, ctx, fa_tensor_fill(ctx, *dev_flush, (double)i));
    }
    FAL_CALL(L, ctx, fa_sync(ctx));
    FAL_CALL(L, ctx, fa_timer_start(ctx));
    lua_pushvalue(L, 1);
    lua_call(L, 0, 0);
    double ms = 0;
    FAL_CALL(L, ctx, fa_timer_stop(ctx, &ms));
    if (i >= warmup) times[i - warmup] = ms;
  }
  fal_box_release(L, 4);

  double sum = 0;
  for (int64_t i = 0; i < rep; i++) sum += times[i];
  qsort(times, (size_t)rep, sizeof *times, cmp_double);
  double median = rep % 2 ? times[rep / 2] : 0.5 * (times[rep / 2 - 1] + times[rep / 2]);
  lua_createtable(L, 0, 5);
  set_num(L, "median_ms", median);
  set_num(L, "min_ms", times[0]);
  set_num(L, "max_ms", times[rep - 1]);
  set_num(L, "mean_ms", sum / (double)rep);
  lua_pushinteger(L, (lua_Integer)rep);
  lua_setfield(L, -2, "n");
  return 1;
}

const luaL_Reg fal_bench_funcs[] = {{"bench", l_bench}, {"sync", l_sync}, {NULL, NULL}};
