/* The C API against a hostile host (issue 21): NULL in every pointer slot of
 * every public function, strides whose offsets would overflow, tile sizes
 * of 0, scales past f32's range, outputs that overlap each other, and
 * millions of empty tensors against the memory limit.  Each is a status
 * with a "flashattn:" message (none without a context), never a crash, and
 * the engine holds no memory at the end. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "flashattn.h"
#include "testutil.h"

static fa_context *ctx;

/* Where a call must not leave a result: a non-NULL value it must clear. */
static fa_tensor *const POISON = (fa_tensor *)&ctx;

#define CHECK_ARG(c, call) CHECK_STATUS(c, FA_ERR_ARGUMENT, call)
/* The context's message names `word` (the NULL argument, the option). */
#define CHECK_NAMES(word) CHECK(strstr(fa_context_error(ctx), word) != NULL, "'%s' not in: %s", word, fa_context_error(ctx))

static int released;
static void on_release(void *data, void *user) {
  (void)data, (void)user;
  released++;
}

static fa_tensor *new_tensor(int ndim, const int64_t *shape, fa_dtype dt, uint64_t seed) {
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, ndim, shape, dt, FA_CPU, &t));
  if (t) CHECK_OK(ctx, fa_tensor_fill_random(ctx, t, FA_FILL_NORMAL, seed));
  return t;
}

/* ---- NULL context, tensors and result pointers (every public function) ---- */

static void test_null_context(void) {
  tu_test = "null context";
  CHECK_ARG(NULL, fa_context_create(FA_CPU, NULL));
  fa_context_destroy(NULL);
  CHECK(strncmp(fa_context_error(NULL), "flashattn:", 10) == 0, "error text of no context");
  CHECK(fa_context_device(NULL) == FA_DEVICE_NONE, "device of no context");
  CHECK_ARG(NULL, fa_context_set_device(NULL, FA_CPU));
  CHECK_ARG(NULL, fa_context_set_stream(NULL, NULL));
  CHECK(fa_context_stream(NULL) == NULL, "stream of no context");
  CHECK_ARG(NULL, fa_sync(NULL));
  CHECK_ARG(NULL, fa_timer_start(NULL));
  double ms = -1;
  CHECK_ARG(NULL, fa_timer_stop(NULL, &ms));
  CHECK_ARG(ctx, fa_timer_stop(ctx, NULL));
  CHECK_NAMES("ms");
  { /* stopped before it was started: an error, not the clock since boot */
    fa_context *fresh = NULL;
    if (fa_context_create(FA_CPU, &fresh) == FA_OK) {
      CHECK_ARG(fresh, fa_timer_stop(fresh, &ms));
      CHECK(ms == 0, "no time from a timer never started: %g", ms);
      CHECK(fa_timer_start(fresh) == FA_OK && fa_timer_stop(fresh, &ms) == FA_OK && ms >= 0, "start, then stop");
      fa_context_destroy(fresh);
    }
  }
  fa_device_info_t info;
  CHECK_ARG(NULL, fa_device_info(NULL, FA_CPU, &info));
  CHECK_ARG(ctx, fa_device_info(ctx, FA_CPU, NULL));
  /* a device that is neither cpu nor cuda: refused by device_info, no stand-in for the cpu in the
   * memory calls (setting its limit once capped the cpu) */
  CHECK_STATUS(ctx, FA_ERR_DEVICE, fa_device_info(ctx, (fa_device)9, &info));
  CHECK_NAMES("device");
  CHECK_STATUS(ctx, FA_ERR_DEVICE, fa_device_info(ctx, FA_DEVICE_NONE, &info));
  {
    const size_t cpu_limit = fa_memory_limit(FA_CPU);
    size_t cur = 1, peak = 1;
    fa_set_memory_limit(FA_DEVICE_NONE, 1024);
    fa_set_memory_limit((fa_device)9, 1024);
    CHECK(fa_memory_limit(FA_CPU) == cpu_limit, "an unknown device's limit left the cpu's alone");
    CHECK(fa_memory_limit(FA_DEVICE_NONE) == 0 && fa_memory_limit((fa_device)9) == 0, "no limit on no device");
    fa_memory((fa_device)9, &cur, &peak);
    fa_reset_peak((fa_device)9);
    CHECK(cur == 0 && peak == 0, "no device holds nothing: %zu, %zu", cur, peak);
  }
  /* names and parsers */
  CHECK(strcmp(fa_dtype_name(FA_DTYPE_NONE), "?") == 0 && fa_dtype_size(FA_DTYPE_NONE) == 0, "no dtype");
  CHECK(strcmp(fa_device_name(FA_DEVICE_NONE), "?") == 0 && !fa_backend_available(FA_DEVICE_NONE), "no device");
  CHECK(strcmp(fa_status_name((fa_status)-1), "unknown") == 0, "status name");
  fa_dtype dt;
  fa_device dv;
  CHECK(fa_dtype_parse(NULL, &dt) == -1 && fa_dtype_parse("f32", NULL) == -1, "dtype parse of NULL");
  CHECK(fa_device_parse(NULL, &dv) == -1 && fa_device_parse("cpu", NULL) == -1, "device parse of NULL");
  /* opts */
  fa_softmax_opts_init(NULL);
  fa_attention_opts_init(NULL);
  fa_matmul_opts_init(NULL);
  CHECK(fa_softmax_fused_max_n(NULL, FA_F32, FA_CPU) > 0, "fused max without a context");
  /* memory: NULL places are skipped */
  fa_memory(FA_CPU, NULL, NULL);
  fa_memory(FA_DEVICE_NONE, NULL, NULL);
}

static void test_null_tensors(void) {
  tu_test = "null tensors";
  int64_t s2[2] = {2, 3}, idx[2] = {0, 0};
  double val = 0, buf[6] = {0};
  int ok = 0;
  fa_tensor *t = new_tensor(2, s2, FA_F32, 1), *r = POISON;
  if (!t) return;
  /* accessors: the neutral values of flashattn.h */
  CHECK(fa_tensor_ndim(NULL) == 0 && fa_tensor_size(NULL, 0) == -1 && fa_tensor_stride(NULL, 0) == -1 &&
            fa_tensor_numel(NULL) == -1,
        "sizes of no tensor");
  CHECK(fa_tensor_dtype(NULL) == FA_DTYPE_NONE && fa_tensor_device(NULL) == FA_DEVICE_NONE, "kind of no tensor");
  CHECK(fa_tensor_data(NULL) == NULL && fa_tensor_is_contiguous(NULL) == 0, "data of no tensor");
  fa_tensor_retain(NULL);
  fa_tensor_release(NULL);

  /* constructors */
  CHECK_ARG(NULL, fa_tensor_empty(NULL, 2, s2, FA_F32, FA_CPU, &r));
  CHECK(r == NULL, "no tensor without a context");
  CHECK_ARG(ctx, fa_tensor_empty(ctx, 2, s2, FA_F32, FA_CPU, NULL));
  CHECK_ARG(ctx, fa_tensor_empty(ctx, 2, NULL, FA_F32, FA_CPU, &r));
  CHECK_NAMES("shape");
  float host[6] = {0};
  released = 0;
  r = POISON;
  CHECK_ARG(NULL, fa_tensor_wrap(NULL, host, FA_CPU, FA_F32, 2, s2, NULL, on_release, NULL, &r));
  CHECK(r == NULL && released == 0, "wrap without a context: no tensor, no release");
  CHECK_ARG(ctx, fa_tensor_wrap(ctx, host, FA_CPU, FA_F32, 2, s2, NULL, on_release, NULL, NULL));
  CHECK(released == 0, "no release on failure");

  /* views and copies: no context, no tensor, no place for the result */
  typedef fa_status (*unary)(fa_context *, fa_tensor *, fa_tensor **);
  static const unary unaries[] = {fa_tensor_contiguous, fa_tensor_clone};
  for (size_t i = 0; i < sizeof unaries / sizeof *unaries; i++) {
    r = POISON;
    CHECK_ARG(NULL, unaries[i](NULL, t, &r));
    CHECK(r == NULL, "cleared");
    CHECK_ARG(ctx, unaries[i](ctx, NULL, &r));
    CHECK_ARG(ctx, unaries[i](ctx, t, NULL));
  }
  r = POISON;
  CHECK_ARG(NULL, fa_tensor_view(NULL, t, 2, s2, &r));
  CHECK(r == NULL, "cleared");
  CHECK_ARG(ctx, fa_tensor_view(ctx, NULL, 2, s2, &r));
  CHECK_ARG(ctx, fa_tensor_view(ctx, t, 2, NULL, &r));
  CHECK_ARG(ctx, fa_tensor_view(ctx, t, 2, s2, NULL));
  CHECK_ARG(NULL, fa_tensor_select(NULL, t, 0, 0, &r));
  CHECK_ARG(ctx, fa_tensor_select(ctx, NULL, 0, 0, &r));
  CHECK_ARG(ctx, fa_tensor_select(ctx, t, 0, 0, NULL));
  CHECK_ARG(NULL, fa_tensor_narrow(NULL, t, 0, 0, 1, &r));
  CHECK_ARG(ctx, fa_tensor_narrow(ctx, NULL, 0, 0, 1, &r));
  CHECK_ARG(ctx, fa_tensor_narrow(ctx, t, 0, 0, 1, NULL));
  CHECK_ARG(NULL, fa_tensor_transpose(NULL, t, 0, 1, &r));
  CHECK_ARG(ctx, fa_tensor_transpose(ctx, NULL, 0, 1, &r));
  CHECK_ARG(ctx, fa_tensor_transpose(ctx, t, 0, 1, NULL));
  CHECK_ARG(NULL, fa_tensor_to(NULL, t, FA_F64, FA_CPU, &r));
  CHECK_ARG(ctx, fa_tensor_to(ctx, NULL, FA_F64, FA_CPU, &r));
  CHECK_ARG(ctx, fa_tensor_to(ctx, t, FA_F64, FA_CPU, NULL));
  CHECK(r == NULL, "nothing handed out");

  /* element access and whole-tensor operations */
  CHECK_ARG(NULL, fa_tensor_copy(NULL, t, t));
  CHECK_ARG(ctx, fa_tensor_copy(ctx, NULL, t));
  CHECK_ARG(ctx, fa_tensor_copy(ctx, t, NULL));
  CHECK_ARG(NULL, fa_tensor_fill(NULL, t, 1));
  CHECK_ARG(ctx, fa_tensor_fill(ctx, NULL, 1));
  CHECK_ARG(NULL, fa_tensor_fill_random(NULL, t, FA_FILL_UNIFORM, 1));
  CHECK_ARG(ctx, fa_tensor_fill_random(ctx, NULL, FA_FILL_UNIFORM, 1));
  CHECK_ARG(NULL, fa_tensor_get(NULL, t, idx, &val));
  CHECK_ARG(ctx, fa_tensor_get(ctx, NULL, idx, &val));
  CHECK_ARG(ctx, fa_tensor_get(ctx, t, NULL, &val));
  CHECK_ARG(ctx, fa_tensor_get(ctx, t, idx, NULL));
  CHECK_ARG(NULL, fa_tensor_set(NULL, t, idx, 1));
  CHECK_ARG(ctx, fa_tensor_set(ctx, NULL, idx, 1));
  CHECK_ARG(ctx, fa_tensor_set(ctx, t, NULL, 1));
  CHECK_ARG(NULL, fa_tensor_read_f64(NULL, t, buf));
  CHECK_ARG(ctx, fa_tensor_read_f64(ctx, NULL, buf));
  CHECK_ARG(ctx, fa_tensor_read_f64(ctx, t, NULL));
  CHECK_ARG(NULL, fa_tensor_write_f64(NULL, t, buf));
  CHECK_ARG(ctx, fa_tensor_write_f64(ctx, NULL, buf));
  CHECK_ARG(ctx, fa_tensor_write_f64(ctx, t, NULL));
  CHECK_ARG(NULL, fa_tensor_reduce(NULL, t, FA_REDUCE_SUM, &val));
  CHECK_ARG(ctx, fa_tensor_reduce(ctx, NULL, FA_REDUCE_SUM, &val));
  CHECK_ARG(ctx, fa_tensor_reduce(ctx, t, FA_REDUCE_SUM, NULL));
  CHECK_ARG(NULL, fa_tensor_isfinite(NULL, t, &ok));
  CHECK_ARG(ctx, fa_tensor_isfinite(ctx, NULL, &ok));
  CHECK_ARG(ctx, fa_tensor_isfinite(ctx, t, NULL));
  r = POISON;
  CHECK_ARG(NULL, fa_tensor_binary(NULL, t, FA_BIN_ADD, t, 0, &r));
  CHECK(r == NULL, "cleared");
  CHECK_ARG(ctx, fa_tensor_binary(ctx, NULL, FA_BIN_ADD, t, 0, &r));
  CHECK_ARG(ctx, fa_tensor_binary(ctx, t, FA_BIN_ADD, t, 0, NULL));
  CHECK_ARG(NULL, fa_rel_error(NULL, t, t, &val));
  CHECK_ARG(ctx, fa_rel_error(ctx, NULL, t, &val));
  CHECK_ARG(ctx, fa_rel_error(ctx, t, NULL, &val));
  CHECK_ARG(ctx, fa_rel_error(ctx, t, t, NULL));
  CHECK_ARG(NULL, fa_max_abs_diff(NULL, t, t, &val));
  CHECK_ARG(ctx, fa_max_abs_diff(ctx, NULL, t, &val));
  CHECK_ARG(ctx, fa_max_abs_diff(ctx, t, NULL, &val));
  CHECK_ARG(ctx, fa_max_abs_diff(ctx, t, t, NULL));
  fa_tensor_release(t);
}

static void test_null_kernels(void) {
  tu_test = "null kernels";
  int64_t s4[4] = {1, 2, 4, 8}, s2[2] = {4, 4};
  fa_tensor *q = new_tensor(4, s4, FA_F32, 2), *a = new_tensor(2, s2, FA_F32, 3);
  if (!q || !a) return;
  fa_tensor *o = POISON, *lse = POISON;
  fa_cost cost;
  /* softmax */
  CHECK_ARG(NULL, fa_softmax(NULL, q, NULL, &o));
  CHECK(o == NULL, "cleared");
  CHECK_ARG(ctx, fa_softmax(ctx, NULL, NULL, &o));
  CHECK_ARG(ctx, fa_softmax(ctx, q, NULL, NULL));
  CHECK_ARG(NULL, fa_cost_softmax(NULL, q, NULL, &cost));
  CHECK_ARG(ctx, fa_cost_softmax(ctx, NULL, NULL, &cost));
  CHECK_ARG(ctx, fa_cost_softmax(ctx, q, NULL, NULL));
  /* attention, the reference, the cost model */
  typedef fa_status (*attn_fn)(fa_context *, fa_tensor *, fa_tensor *, fa_tensor *, const fa_attention_opts *,
                               fa_tensor **, fa_tensor **);
  static const attn_fn attns[] = {fa_attention, fa_attention_reference};
  for (size_t i = 0; i < 2; i++) {
    o = lse = POISON;
    CHECK_ARG(NULL, attns[i](NULL, q, q, q, NULL, &o, &lse));
    CHECK(o == NULL && lse == NULL, "cleared");
    CHECK_ARG(ctx, attns[i](ctx, NULL, q, q, NULL, &o, &lse));
    CHECK_ARG(ctx, attns[i](ctx, q, NULL, q, NULL, &o, &lse));
    CHECK_ARG(ctx, attns[i](ctx, q, q, NULL, NULL, &o, &lse));
    CHECK_ARG(ctx, attns[i](ctx, q, q, q, NULL, NULL, &lse));
    CHECK(lse == NULL, "no lse without a place for o");
  }
  CHECK_ARG(NULL, fa_cost_attention(NULL, q, q, q, NULL, &cost));
  CHECK_ARG(ctx, fa_cost_attention(ctx, q, NULL, q, NULL, &cost));
  CHECK_ARG(ctx, fa_cost_attention(ctx, q, q, q, NULL, NULL));
  /* merge_states, matmul */
  fa_tensor *l = NULL;
  int64_t sl[3] = {1, 2, 4};
  CHECK_OK(ctx, fa_tensor_empty(ctx, 3, sl, FA_F32, FA_CPU, &l));
  o = lse = POISON;
  CHECK_ARG(NULL, fa_merge_states(NULL, q, l, q, l, &o, &lse));
  CHECK(o == NULL && lse == NULL, "cleared");
  CHECK_ARG(ctx, fa_merge_states(ctx, NULL, l, q, l, &o, &lse));
  CHECK_ARG(ctx, fa_merge_states(ctx, q, NULL, q, l, &o, &lse));
  CHECK_ARG(ctx, fa_merge_states(ctx, q, l, NULL, l, &o, &lse));
  CHECK_ARG(ctx, fa_merge_states(ctx, q, l, q, NULL, &o, &lse));
  CHECK_ARG(ctx, fa_merge_states(ctx, q, l, q, l, NULL, &lse));
  CHECK_ARG(ctx, fa_merge_states(ctx, q, l, q, l, &o, NULL));
  o = POISON;
  CHECK_ARG(NULL, fa_matmul(NULL, a, a, NULL, &o));
  CHECK(o == NULL, "cleared");
  CHECK_ARG(ctx, fa_matmul(ctx, NULL, a, NULL, &o));
  CHECK_ARG(ctx, fa_matmul(ctx, a, NULL, NULL, &o));
  CHECK_ARG(ctx, fa_matmul(ctx, a, a, NULL, NULL));
  fa_tensor_release(l);
  fa_tensor_release(q);
  fa_tensor_release(a);
}

/* The Lua entry points need a lua_State (as Lua's API does); NULL tensors
 * and contexts they take. */
static int check_arg1(lua_State *L) {
  fa_lua_check_tensor(L, 1);
  return 0;
}

static void test_null_lua(void) {
  tu_test = "null lua";
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "flashattn", luaopen_flashattn, 1);
  lua_pop(L, 1);
  fa_lua_push_tensor(L, NULL);
  CHECK(lua_isnil(L, -1), "a NULL tensor is nil");
  lua_pop(L, 1);
  fa_lua_set_context(L, ctx);
  CHECK(fa_lua_get_context(L) == ctx, "the host's context");
  fa_lua_set_context(L, NULL);
  CHECK(fa_lua_get_context(L) != NULL && fa_lua_get_context(L) != ctx, "back to the module's own");
  lua_pushcfunction(L, check_arg1);
  lua_pushnil(L);
  CHECK(lua_pcall(L, 1, 0, 0) != LUA_OK && strncmp(lua_tostring(L, -1), "flashattn:", 10) == 0,
        "no tensor is a flashattn error");
  lua_close(L);
}

/* ---- strides that would overflow an offset (issue 21, item 4) --------------- */

static void test_wrap_strides(void) {
  tu_test = "wrap strides";
  float host[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  static const struct {
    int64_t shape[2], strides[2];
  } bad[] = {
      {{3, 1}, {1, INT64_MAX}},         /* a size-1 dimension: iteration steps over it */
      {{3, 1}, {1, (int64_t)1 << 62}},
      {{1, 3}, {INT64_MAX, 1}},
      {{0, 4}, {1, INT64_MAX / 2}},     /* empty: narrow of dimension 2 would step over it */
      {{2, 2}, {(int64_t)1 << 58, (int64_t)1 << 58}}, /* each fits, together they pass 2^59 */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    fa_tensor *t = POISON;
    released = 0;
    CHECK_ARG(ctx, fa_tensor_wrap(ctx, host, FA_CPU, FA_F32, 2, bad[i].shape, bad[i].strides, on_release, NULL, &t));
    CHECK(t == NULL && released == 0, "case %zu: no tensor, no release", i);
    CHECK_NAMES("stride");
  }
  /* a size-1 dimension's stride within range is taken and harmless */
  int64_t shape[2] = {3, 1}, strides[2] = {2, 1000};
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, host, FA_CPU, FA_F32, 2, shape, strides, NULL, NULL, &t));
  if (!t) return;
  double got[3] = {0};
  CHECK_OK(ctx, fa_tensor_read_f64(ctx, t, got));
  CHECK(got[0] == 1 && got[1] == 3 && got[2] == 5, "read through the strides: %g %g %g", got[0], got[1], got[2]);
  fa_tensor *col = NULL;
  CHECK_OK(ctx, fa_tensor_select(ctx, t, 1, 0, &col));
  double sum = 0;
  if (col) CHECK_OK(ctx, fa_tensor_reduce(ctx, col, FA_REDUCE_SUM, &sum));
  CHECK(sum == 9, "sum of the column %g", sum);
  fa_tensor_release(col);
  fa_tensor_release(t);
}

/* Data not aligned to its element size: refused, where the kernels would
 * read misaligned elements (undefined behaviour; UBSan reported it). */
static void test_wrap_misaligned(void) {
  tu_test = "wrap misaligned";
  static double host[8];
  char *base = (char *)host;
  int64_t shape[2] = {2, 3};
  static const fa_dtype types[] = {FA_F32, FA_F16, FA_BF16, FA_F64};
  for (size_t i = 0; i < sizeof types / sizeof *types; i++)
    for (int off = 1; off < 8; off++) {
      fa_tensor *t = POISON;
      released = 0;
      fa_status st = fa_tensor_wrap(ctx, base + off, FA_CPU, types[i], 2, shape, NULL, on_release, NULL, &t);
      if (off % (int)fa_dtype_size(types[i]) == 0) {
        CHECK(st == FA_OK, "dtype %d offset %d: aligned, taken (%s)", (int)types[i], off, fa_context_error(ctx));
        fa_tensor_release(t);
        CHECK(released == 1, "released once");
        continue;
      }
      CHECK(st == FA_ERR_ARGUMENT && t == NULL && released == 0, "dtype %d offset %d: refused, no tensor",
            (int)types[i], off);
      CHECK_NAMES("aligned");
    }
  fa_tensor *b = NULL; /* bool: one byte, any address */
  CHECK_OK(ctx, fa_tensor_wrap(ctx, base + 3, FA_CPU, FA_BOOL, 2, shape, NULL, NULL, NULL, &b));
  fa_tensor_release(b);
}

/* ---- every handle counts against the limit (item 8) ------------------------- */

static void test_handles_counted(void) {
  tu_test = "handles";
  size_t m0 = tu_mem_now();
  int64_t zero = 0, s2[2] = {4, 4};
  fa_tensor *e = NULL, *w = NULL, *v = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 1, &zero, FA_F32, FA_CPU, &e));
  size_t m1 = tu_mem_now();
  CHECK(m1 > m0, "an empty tensor counts its handles (%zu bytes)", m1 - m0);
  float host[16];
  CHECK_OK(ctx, fa_tensor_wrap(ctx, host, FA_CPU, FA_F32, 2, s2, NULL, NULL, NULL, &w));
  size_t m2 = tu_mem_now();
  CHECK(m2 > m1, "a wrapped tensor counts its handles");
  if (w) CHECK_OK(ctx, fa_tensor_select(ctx, w, 0, 1, &v));
  CHECK(tu_mem_now() > m2, "a view counts its handle");
  fa_tensor_release(v);
  fa_tensor_release(w);
  fa_tensor_release(e);
  CHECK(tu_mem_now() == m0, "handles given back: %zu bytes held", tu_mem_now() - m0);

  /* a flood of empty tensors meets the limit */
  enum { MAX = 200000 };
  fa_tensor **ts = calloc(MAX, sizeof *ts);
  if (!ts) return;
  fa_set_memory_limit(FA_CPU, m0 + (1 << 16));
  int n = 0;
  fa_status st = FA_OK;
  while (n < MAX && (st = fa_tensor_empty(ctx, 1, &zero, FA_F32, FA_CPU, &ts[n])) == FA_OK) n++;
  fa_set_memory_limit(FA_CPU, 0);
  CHECK(st == FA_ERR_OUT_OF_MEMORY && n < MAX, "%d empty tensors under a 64 KiB limit (%s)", n, fa_status_name(st));
  CHECK(strstr(fa_context_error(ctx), "flashattn: out of memory") != NULL, "message %s", fa_context_error(ctx));
  CHECK(ts[n < MAX ? n : 0] == NULL || n == MAX, "no tensor from the failed call");
  for (int i = 0; i < n; i++) fa_tensor_release(ts[i]);
  free(ts);
  CHECK(tu_mem_now() == m0, "all given back: %zu bytes held", tu_mem_now() - m0);
}

/* ---- opts.tile: 0 is the default, FA_TILE_ZERO an error (item A) ------------ */

static void test_tile_zero(void) {
  tu_test = "tile";
  int64_t s4[4] = {1, 2, 5, 8};
  fa_tensor *q = new_tensor(4, s4, FA_F32, 4), *o = NULL, *lse = NULL;
  if (!q) return;
  fa_attention_opts op;
  fa_attention_opts_init(&op);
  CHECK_OK(ctx, fa_attention(ctx, q, q, q, &op, &o, NULL)); /* tile {0, 0}: the default */
  fa_tensor_release(o);
  o = NULL;
  static const struct {
    int64_t br, bc;
    const char *shown;
  } cases[] = {{FA_TILE_ZERO, FA_TILE_ZERO, "got {0, 0}"}, {FA_TILE_ZERO, 16, "got {0, 16}"},
               {16, FA_TILE_ZERO, "got {16, 0}"}, {0, 16, "got {0, 16}"}, {-3, 16, "got {-3, 16}"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    for (int algo = FA_ATTN_AUTO; algo <= FA_ATTN_FLASH; algo++) {
      op.algo = (fa_attention_algo)algo;
      op.tile_q = cases[i].br, op.tile_k = cases[i].bc;
      CHECK_ARG(ctx, fa_attention(ctx, q, q, q, &op, &o, &lse));
      CHECK(o == NULL && lse == NULL, "no output");
      CHECK_NAMES("opts.tile");
      CHECK_NAMES("1 <= Br <= 4096");
      CHECK_NAMES(cases[i].shown);
    }
  fa_tensor_release(q);
}

/* ---- opts.scale past f32's range (item 10) ----------------------------------- */

static void test_scale_range(void) {
  tu_test = "scale";
  int64_t s4[4] = {1, 1, 4, 8};
  fa_tensor *q = new_tensor(4, s4, FA_F32, 5), *q64 = NULL, *o = NULL, *ref = NULL;
  if (!q) return;
  fa_attention_opts op;
  fa_attention_opts_init(&op);
  op.has_scale = 1;
  static const double bad[] = {1e39, -1e39, DBL_MAX};
  fa_cost cost;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    op.scale = bad[i];
    CHECK_ARG(ctx, fa_attention(ctx, q, q, q, &op, &o, NULL));
    CHECK(o == NULL, "no output");
    CHECK_NAMES("opts.scale");
    CHECK_NAMES("3.40282e+38");
    CHECK_ARG(ctx, fa_cost_attention(ctx, q, q, q, &op, &cost));
  }
  /* f64 inputs and the reference compute in f64: a finite scale is a scale */
  op.scale = 1e39;
  CHECK_OK(ctx, fa_attention_reference(ctx, q, q, q, &op, &ref, NULL));
  CHECK_OK(ctx, fa_tensor_to(ctx, q, FA_F64, FA_CPU, &q64));
  if (q64) CHECK_OK(ctx, fa_attention(ctx, q64, q64, q64, &op, &o, NULL));
  double diff = -1;
  int finite = 0;
  if (o && ref) {
    CHECK_OK(ctx, fa_tensor_isfinite(ctx, o, &finite));
    CHECK_OK(ctx, fa_max_abs_diff(ctx, o, ref, &diff));
  }
  CHECK(finite && diff >= 0 && diff < 1e-12, "f64 at scale 1e39 matches the reference (%g)", diff);
  /* the largest f32 is a scale there */
  fa_tensor_release(o);
  o = NULL;
  op.scale = FLT_MAX;
  CHECK_OK(ctx, fa_attention(ctx, q, q, q, &op, &o, NULL));
  fa_tensor_release(o);
  fa_tensor_release(ref);
  fa_tensor_release(q64);
  fa_tensor_release(q);
}

/* ---- opts.out and opts.lse_out overlapping (item 11) ------------------------- */

static void test_outputs_overlap(void) {
  tu_test = "outputs overlap";
  int64_t s4[4] = {1, 2, 4, 8}, flat_n = 2 * 4 * 8 + 2 * 4, sl[3] = {1, 2, 4};
  fa_tensor *q = new_tensor(4, s4, FA_F32, 6), *buf = NULL, *lse_view = NULL, *o = NULL, *lse = NULL;
  if (!q) return;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, s4, FA_F32, FA_CPU, &buf));
  if (buf) CHECK_OK(ctx, fa_tensor_select(ctx, buf, 3, 0, &lse_view));
  if (!lse_view) return;
  fa_attention_opts op;
  fa_attention_opts_init(&op);
  op.out = buf;
  op.lse_out = lse_view;
  CHECK_ARG(ctx, fa_attention(ctx, q, q, q, &op, &o, &lse));
  CHECK(o == NULL && lse == NULL, "no output");
  CHECK_NAMES("opts.lse_out");
  CHECK_NAMES("overlap");
  fa_cost cost;
  CHECK_ARG(ctx, fa_cost_attention(ctx, q, q, q, &op, &cost));
  fa_tensor_release(lse_view);
  fa_tensor_release(buf);

  /* disjoint parts of one buffer are two outputs */
  fa_tensor *flat = NULL, *po = NULL, *pl = NULL, *vo = NULL, *vl = NULL, *want_o = NULL, *want_l = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 1, &flat_n, FA_F32, FA_CPU, &flat));
  if (flat) CHECK_OK(ctx, fa_tensor_fill(ctx, flat, NAN));
  if (flat) CHECK_OK(ctx, fa_tensor_narrow(ctx, flat, 0, 0, 64, &po));
  if (flat) CHECK_OK(ctx, fa_tensor_narrow(ctx, flat, 0, 64, 8, &pl));
  if (po) CHECK_OK(ctx, fa_tensor_view(ctx, po, 4, s4, &vo));
  if (pl) CHECK_OK(ctx, fa_tensor_view(ctx, pl, 3, sl, &vl));
  op.out = vo;
  op.lse_out = vl;
  if (vo && vl) CHECK_OK(ctx, fa_attention(ctx, q, q, q, &op, &o, &lse));
  CHECK(o == vo && lse == vl, "the outputs are the caller's");
  fa_attention_opts plain;
  fa_attention_opts_init(&plain);
  CHECK_OK(ctx, fa_attention(ctx, q, q, q, &plain, &want_o, &want_l));
  double d1 = -1, d2 = -1;
  if (o && want_o) CHECK_OK(ctx, fa_max_abs_diff(ctx, o, want_o, &d1));
  if (lse && want_l) CHECK_OK(ctx, fa_max_abs_diff(ctx, lse, want_l, &d2));
  CHECK(d1 == 0 && d2 == 0, "the same values as without outputs (%g, %g)", d1, d2);
  fa_tensor *all[] = {o, lse, want_o, want_l, vo, vl, po, pl, flat, q};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) fa_tensor_release(all[i]);
}

/* One host buffer wrapped twice (or two DLPack imports of one array): two
 * storages over the same memory. Outputs there are checked as within one
 * storage: an out over v's memory is still an input's (computed aside and
 * copied: right values, where it was written while v was read), and out
 * and lse_out over intersecting bytes are an error (they were taken). */
static void test_two_wraps_of_one_buffer(void) {
  tu_test = "two wraps of one buffer";
  enum { L = 4, D = 4 };
  static float vbuf[L * D], abuf[L * D];
  int64_t sh[2] = {L, D}, sl[1] = {L};
  for (int i = 0; i < L * D; i++) vbuf[i] = abuf[i] = (float)((i * 7) % 5) - 2.0f;
  fa_tensor *q = new_tensor(2, sh, FA_F32, 11), *k = new_tensor(2, sh, FA_F32, 12);
  fa_tensor *v = NULL, *v_again = NULL, *lse_over = NULL, *want = NULL, *o = NULL, *l = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, vbuf, FA_CPU, FA_F32, 2, sh, NULL, NULL, NULL, &v));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, vbuf, FA_CPU, FA_F32, 2, sh, NULL, NULL, NULL, &v_again));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, vbuf, FA_CPU, FA_F32, 1, sl, NULL, NULL, NULL, &lse_over));
  if (!q || !k || !v || !v_again || !lse_over) return;
  fa_attention_opts op;
  fa_attention_opts_init(&op);
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &op, &want, NULL));
  static const fa_attention_algo algos[] = {FA_ATTN_NAIVE, FA_ATTN_TWO_PASS, FA_ATTN_FLASH_ROW, FA_ATTN_FLASH};
  for (size_t a = 0; a < sizeof algos / sizeof *algos; a++) {
    for (int i = 0; i < L * D; i++) vbuf[i] = (float)((i * 7) % 5) - 2.0f;
    op.algo = algos[a];
    op.out = v_again;
    op.lse_out = NULL;
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &op, &o, NULL));
    double d = -1;
    if (o && want) CHECK_OK(ctx, fa_max_abs_diff(ctx, o, want, &d));
    CHECK(d >= 0 && d < 1e-6, "algo %d: out over v's memory: max |o - right| = %g", (int)algos[a], d);
    fa_tensor_release(o);
    o = NULL;
    op.lse_out = lse_over; /* bytes 0..15 of out's memory too */
    CHECK_ARG(ctx, fa_attention(ctx, q, k, k, &op, &o, &l));
    CHECK(o == NULL && l == NULL, "no output");
    CHECK_NAMES("overlap");
  }
  /* matmul: an out over a's memory */
  fa_tensor *a = NULL, *a_again = NULL, *mm = NULL, *mm_want = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, abuf, FA_CPU, FA_F32, 2, sh, NULL, NULL, NULL, &a));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, abuf, FA_CPU, FA_F32, 2, sh, NULL, NULL, NULL, &a_again));
  fa_matmul_opts mo;
  fa_matmul_opts_init(&mo);
  if (a && a_again) CHECK_OK(ctx, fa_matmul(ctx, a, k, &mo, &mm_want));
  mo.out = a_again;
  if (a && a_again) CHECK_OK(ctx, fa_matmul(ctx, a, k, &mo, &mm));
  double d = -1;
  if (mm && mm_want) CHECK_OK(ctx, fa_max_abs_diff(ctx, mm, mm_want, &d));
  CHECK(d == 0, "matmul into a's memory: max |c - right| = %g", d);
  fa_tensor *all[] = {q, k, v, v_again, lse_over, want, a, a_again, mm, mm_want};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) fa_tensor_release(all[i]);
}

int main(void) {
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) {
    fprintf(stderr, "no context\n");
    return 1;
  }
  test_null_context();
  test_null_tensors();
  test_null_kernels();
  test_null_lua();
  test_wrap_strides();
  test_wrap_misaligned();
  test_handles_counted();
  test_tile_zero();
  test_scale_range();
  test_outputs_overlap();
  test_two_wraps_of_one_buffer();
  /* the engine is still usable, and holds nothing */
  int64_t s2[2] = {2, 2};
  fa_tensor *t = new_tensor(2, s2, FA_F32, 7);
  fa_tensor_release(t);
  fa_context_destroy(ctx);
  CHECK(tu_mem_now() == 0, "engine memory at the end: %zu bytes (leak)", tu_mem_now());
  return tu_summary("test_capi_hostile");
}
