/* fa.bench(fn, {warmup=, rep=, flush_cache=}) and fa.sync(); the host's
 * poll callback (fa_lua_set_poll) that the binding's long loops call.
 *
 * Each repetition: poll the host, (flush the caches,) wait for the device,
 * start the context's timer, call fn, stop the timer (fa_timer_*: CUDA
 * events on the context's stream, the monotonic clock on the CPU).  On a
 * GPU with the caches flushed the device is not waited for: the events
 * are queued behind the flush, as Triton's do_bench queues them, so that
 * they time the device's work and not the host's cost of queueing it
 * (which the flush hides).  That host cost is reported beside them:
 * host_ms, the median of the monotonic clock around fn alone (on CUDA the
 * time the host spends queueing the call, its kernels not waited for). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <stdlib.h>
#include <string.h>

#include "lbinding.h"

#include <time.h>

#define DEFAULT_WARMUP 3
#define DEFAULT_REP 20
/* warmup and rep each at most a million (README "Reliability"): times[]
 * (the device's and the host's) at most 16 MB, and a count the host's
 * limits need not be the only bound of */
#define BENCH_MAX ((int64_t)1000000)
/* 256 MiB of f32, the buffer Triton's do_bench zeroes (its CUDA driver's
 * get_empty_cache_for_benchmark): the peers' scripts time with do_bench, and a
 * flush of the same length hides the same host cost of queueing a call.  With
 * 128 MiB (about 30 us of writes on an H200) the host's preparation of a
 * variant call (40-80 us at B 4, H 16, L 4096) left the GPU idle between
 * the start event and the first kernel: timed as the call's, where
 * do_bench hid the peer's. */
#define DEVICE_FLUSH_ELEMS ((int64_t)64 << 20)

static const char *const bench_keys[] = {"warmup", "rep", "flush_cache", NULL};

/* The host clock of host_ms: src/timer.c has the same one, but the core
 * exports only the C API, so the binding keeps its own four lines. */
static double host_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* x[0..n) sorted in place; their median */
static double sorted_median(double *x, int64_t n) {
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static void set_num(lua_State *L, const char *key, double v) {
  lua_pushnumber(L, (lua_Number)v);
  lua_setfield(L, -2, key);
}

/* ---- the host's poll ------------------------------------------------------ */

/* A C function the engine calls runs no Lua instruction, so a count hook
 * never sees fa.bench's repetitions or fa.tensor's walk: those loops call
 * the host's callback instead, which may raise to stop the script. */
typedef struct {
  fa_lua_poll_fn fn;
  void *ud;
} poll_slot;

static const char poll_key = 0; /* its address keys the registry entry */

FA_API void fa_lua_set_poll(lua_State *L, fa_lua_poll_fn fn, void *ud) {
  if (!fn) {
    lua_pushnil(L);
  } else {
    poll_slot *p = (poll_slot *)lua_newuserdatauv(L, sizeof *p, 0);
    p->fn = fn;
    p->ud = ud;
  }
  lua_rawsetp(L, LUA_REGISTRYINDEX, &poll_key);
}

void fal_poll(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &poll_key);
  poll_slot p = {NULL, NULL};
  if (lua_type(L, -1) == LUA_TUSERDATA) p = *(const poll_slot *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (p.fn) p.fn(L, p.ud);
}

/* ---- fa.sync, fa.bench ------------------------------------------------------ */

static int l_sync(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  FAL_CALL(L, ctx, fa_sync(ctx));
  return 0;
}

/* fn raised (the error on top): the flush buffer goes back now, and a
 * message of fn's own (a yield across this C call boundary included) gets
 * the prefix and the argument's name; the engine's own messages and
 * non-string error values pass unchanged. */
static int fn_failed(lua_State *L, int status) {
  fal_box_release(L, 4);
  const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
  if (status == LUA_ERRMEM || !msg || strncmp(msg, "flashattn:", 10) == 0) return lua_error(L);
  return fal_argerror(L, 1, "fn", "raised an error: %s", msg);
}

/* Set in the registry while a bench's fn runs: the context has one timer,
 * which a bench inside fn would restart under the outer one's feet. */
static const char bench_running_key = 0;

static int bench_running(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &bench_running_key);
  const int on = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return on;
}

static void set_bench_running(lua_State *L, int on) {
  lua_pushboolean(L, on);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &bench_running_key);
}

static int l_bench(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  if (bench_running(L))
    fal_error(L, "fa.bench: called from inside another fa.bench's fn (the two would share the context's timer)");
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
  /* the device's times, then the host's (host_ms) */
  double *times = (double *)fal_newbuffer(L, 2 * rep, sizeof *times, "fa.bench"); /* 3 */
  double *host = times + rep;

  /* on a GPU the flush writes a device buffer held only for this call, so
   * fa.memory() is back to where it was afterwards */
  fa_tensor **dev_flush = fal_newbox(L); /* 4 */
  if (flush && fa_context_device(ctx) == FA_CUDA) {
    int64_t n = DEVICE_FLUSH_ELEMS;
    FAL_CALL(L, ctx, fa_tensor_empty(ctx, 1, &n, FA_F32, FA_CUDA, dev_flush));
  }

  for (int64_t i = 0; i < warmup + rep; i++) {
    fal_poll(L);
    if (flush) {
      fal_flush_host_cache(L);
      if (*dev_flush) FAL_CALL(L, ctx, fa_tensor_fill(ctx, *dev_flush, (double)i));
    }
    if (!*dev_flush) FAL_CALL(L, ctx, fa_sync(ctx));
    FAL_CALL(L, ctx, fa_timer_start(ctx));
    lua_pushvalue(L, 1);
    set_bench_running(L, 1);
    const double h0 = host_now_ms();
    int st = lua_pcall(L, 0, 0, 0);
    const double h1 = host_now_ms();
    set_bench_running(L, 0);
    if (st != LUA_OK) fn_failed(L, st);
    double ms = 0;
    FAL_CALL(L, ctx, fa_timer_stop(ctx, &ms));
    if (i >= warmup) times[i - warmup] = ms, host[i - warmup] = h1 - h0;
  }
  fal_box_release(L, 4);

  double sum = 0;
  for (int64_t i = 0; i < rep; i++) sum += times[i];
  const double median = sorted_median(times, rep), host_median = sorted_median(host, rep);
  lua_createtable(L, 0, 6);
  set_num(L, "median_ms", median);
  set_num(L, "host_ms", host_median);
  set_num(L, "min_ms", times[0]);
  set_num(L, "max_ms", times[rep - 1]);
  set_num(L, "mean_ms", sum / (double)rep);
  lua_pushinteger(L, (lua_Integer)rep);
  lua_setfield(L, -2, "n");
  return 1;
}

const luaL_Reg fal_bench_funcs[] = {{"bench", l_bench}, {"sync", l_sync}, {NULL, NULL}};
