/* Out of memory, injected at every allocation the engine makes (README
 * "Reliability").
 *
 * The engine's host allocations (calloc, malloc, aligned_alloc in the
 * static library's objects) are wrapped at link time (-Wl,--wrap) with a
 * counter: armed at n, the n-th allocation from then on fails, and in
 * "from" mode every one after it too.  Then, for each operation and each
 * n until the operation makes fewer than n allocations:
 *   - C API: the call returns FA_ERR_OUT_OF_MEMORY with a "flashattn:"
 *     message and no output, the engine holds what it held before (and
 *     ASan/valgrind see nothing leaked), and the same call unarmed succeeds
 *     with the unarmed result;
 *   - Lua (tests/fuzz/oom.lua, run here with a global `fault` table): a
 *     single failure is absorbed by the binding's collect-and-retry and the
 *     call succeeds with the right result; failures from n on raise a
 *     "flashattn:" error, after which the engine holds what it held and the
 *     next call succeeds.  oom.lua also walks each operation's memory limit
 *     (fa.set_memory_limit) allocation by allocation.
 *
 *   test_oom tests/fuzz/oom.lua */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "testutil.h"

/* ---- the fault injector ------------------------------------------------------ */
static atomic_long counter, fail_at, hits; /* fail_at 0: disarmed */
static atomic_int fail_from;

static int should_fail(void) {
  long n = atomic_load(&fail_at);
  if (n <= 0) return 0;
  long c = atomic_fetch_add(&counter, 1) + 1;
  if (c == n || (atomic_load(&fail_from) && c > n)) {
    atomic_fetch_add(&hits, 1);
    return 1;
  }
  return 0;
}

void *__real_calloc(size_t n, size_t size);
void *__real_malloc(size_t size);
void *__real_aligned_alloc(size_t align, size_t size);
void *__wrap_calloc(size_t n, size_t size) { return should_fail() ? NULL : __real_calloc(n, size); }
void *__wrap_malloc(size_t size) { return should_fail() ? NULL : __real_malloc(size); }
void *__wrap_aligned_alloc(size_t align, size_t size) { return should_fail() ? NULL : __real_aligned_alloc(align, size); }

static void arm(long n, int from) {
  atomic_store(&counter, 0);
  atomic_store(&hits, 0);
  atomic_store(&fail_from, from);
  atomic_store(&fail_at, n);
}

/* Disarms; returns how many allocations failed. */
static long disarm(void) {
  atomic_store(&fail_at, 0);
  return atomic_load(&hits);
}

/* ---- C API operations ---------------------------------------------------------- */
static fa_context *ctx;
static fa_tensor *in[6]; /* inputs made once: f16 q, k, v (views), a bool mask, f32 x, f32 lse */

/* An operation: returns its status and up to two outputs. */
typedef fa_status (*op_fn)(fa_tensor **o1, fa_tensor **o2);

static fa_status op_attention_flash(fa_tensor **o, fa_tensor **l) {
  fa_attention_opts opts;
  fa_attention_opts_init(&opts);
  opts.causal = FA_CAUSAL_BOTTOM_RIGHT;
  opts.mask = in[3];
  opts.tile_q = 8, opts.tile_k = 16;
  return fa_attention(ctx, in[0], in[1], in[2], &opts, o, l);
}
static fa_status op_attention_naive(fa_tensor **o, fa_tensor **l) {
  fa_attention_opts opts;
  fa_attention_opts_init(&opts);
  opts.algo = FA_ATTN_NAIVE;
  static const double slopes[4] = {0.1, 0.2, 0.3, 0.4};
  opts.alibi = slopes, opts.n_alibi = 4;
  return fa_attention(ctx, in[0], in[1], in[2], &opts, o, l);
}
static fa_status op_attention_two_pass(fa_tensor **o, fa_tensor **l) {
  fa_attention_opts opts;
  fa_attention_opts_init(&opts);
  opts.algo = FA_ATTN_TWO_PASS;
  return fa_attention(ctx, in[0], in[1], in[2], &opts, o, l);
}
static fa_status op_attention_flash_row(fa_tensor **o, fa_tensor **l) {
  fa_attention_opts opts;
  fa_attention_opts_init(&opts);
  opts.algo = FA_ATTN_FLASH_ROW;
  opts.softcap = 5;
  return fa_attention(ctx, in[0], in[1], in[2], &opts, o, l);
}
static fa_status op_attention_reference(fa_tensor **o, fa_tensor **l) {
  return fa_attention_reference(ctx, in[0], in[1], in[2], NULL, o, l);
}
static fa_status op_softmax_fused(fa_tensor **y, fa_tensor **unused) {
  (void)unused;
  fa_softmax_opts opts;
  fa_softmax_opts_init(&opts);
  opts.algo = FA_SOFTMAX_FUSED;
  return fa_softmax(ctx, in[0], &opts, y);
}
static fa_status op_softmax_online(fa_tensor **y, fa_tensor **unused) {
  (void)unused;
  fa_softmax_opts opts;
  fa_softmax_opts_init(&opts);
  opts.algo = FA_SOFTMAX_ONLINE;
  opts.block = 7;
  return fa_softmax(ctx, in[4], &opts, y);
}
static fa_status op_matmul(fa_tensor **c, fa_tensor **unused) {
  (void)unused;
  fa_tensor *bt = NULL;
  fa_status st = fa_tensor_transpose(ctx, in[4], 0, 1, &bt);
  if (st) return st;
  st = fa_matmul(ctx, in[4], bt, NULL, c);
  fa_tensor_release(bt);
  return st;
}
static fa_status op_merge(fa_tensor **o, fa_tensor **l) {
  fa_tensor *o1 = NULL, *l1 = NULL;
  fa_status st = fa_attention(ctx, in[0], in[1], in[2], NULL, &o1, &l1);
  if (!st) st = fa_merge_states(ctx, o1, l1, o1, in[5], o, l);
  fa_tensor_release(o1);
  fa_tensor_release(l1);
  return st;
}
static fa_status op_tensor_ops(fa_tensor **r, fa_tensor **unused) {
  (void)unused;
  fa_tensor *t = NULL, *c = NULL;
  fa_status st = fa_tensor_to(ctx, in[0], FA_F64, FA_CPU, &t);
  if (!st) st = fa_tensor_contiguous(ctx, in[1], &c);
  if (!st) st = fa_tensor_binary(ctx, t, FA_BIN_MUL, NULL, 2.0, r);
  double v;
  if (!st) st = fa_rel_error(ctx, *r, t, &v);
  fa_tensor_release(t);
  fa_tensor_release(c);
  if (st) fa_tensor_release(*r), *r = NULL; /* a sequence of calls: no result when one fails */
  return st;
}
static fa_status op_views(fa_tensor **r, fa_tensor **unused) {
  (void)unused;
  fa_tensor *s = NULL, *n = NULL;
  const int64_t shape[2] = {-1, 16};
  fa_status st = fa_tensor_select(ctx, in[0], 0, 0, &s);
  if (!st) st = fa_tensor_narrow(ctx, s, 1, 1, 3, &n);
  if (!st) st = fa_tensor_clone(ctx, n, r);
  fa_tensor *v = NULL;
  if (!st) st = fa_tensor_view(ctx, *r, 2, shape, &v);
  fa_tensor_release(v);
  fa_tensor_release(s);
  fa_tensor_release(n);
  if (st) fa_tensor_release(*r), *r = NULL;
  return st;
}
static fa_status op_empty(fa_tensor **r, fa_tensor **unused) {
  (void)unused;
  const int64_t shape[3] = {3, 4, 5};
  fa_status st = fa_tensor_empty(ctx, 3, shape, FA_BF16, FA_CPU, r);
  if (!st) st = fa_tensor_fill_random(ctx, *r, FA_FILL_NORMAL, 3);
  if (st) fa_tensor_release(*r), *r = NULL;
  return st;
}

static const struct {
  const char *name;
  op_fn fn;
} ops[] = {{"attention flash (f16 views, mask)", op_attention_flash},
           {"attention naive (alibi)", op_attention_naive},
           {"attention two_pass", op_attention_two_pass},
           {"attention flash_row (softcap)", op_attention_flash_row},
           {"attention_reference", op_attention_reference},
           {"softmax fused (f16 view)", op_softmax_fused},
           {"softmax online", op_softmax_online},
           {"matmul (a transposed view)", op_matmul},
           {"merge_states", op_merge},
           {"to, contiguous, binary, rel_error", op_tensor_ops},
           {"select, narrow, clone, view", op_views},
           {"empty, fill_random", op_empty}};

static void make_inputs(void) {
  const int64_t qs[4] = {2, 4, 16, 12}, ks[4] = {2, 2, 20, 16}, vs[4] = {2, 2, 20, 19}, ms[2] = {12, 20};
  const int64_t xs[2] = {9, 70}, ls[3] = {2, 4, 12}; /* lse: f32 like fa_attention's */
  fa_tensor *qt = NULL, *vw = NULL, *m = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, qs, FA_F16, FA_CPU, &qt)); /* q = qt transposed: (2, 4, 12, 16) */
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, qt, FA_FILL_NORMAL, 1));
  CHECK_OK(ctx, fa_tensor_transpose(ctx, qt, 2, 3, &in[0]));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, ks, FA_F16, FA_CPU, &in[1]));
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, in[1], FA_FILL_NORMAL, 2));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, vs, FA_F16, FA_CPU, &vw));
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, vw, FA_FILL_NORMAL, 3));
  CHECK_OK(ctx, fa_tensor_narrow(ctx, vw, 3, 2, 16, &in[2]));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 2, ms, FA_F32, FA_CPU, &m));
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, m, FA_FILL_UNIFORM, 4));
  CHECK_OK(ctx, fa_tensor_to(ctx, m, FA_BOOL, FA_CPU, &in[3]));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 2, xs, FA_F32, FA_CPU, &in[4]));
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, in[4], FA_FILL_NORMAL, 5));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 3, ls, FA_F32, FA_CPU, &in[5]));
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, in[5], FA_FILL_NORMAL, 6));
  fa_tensor_release(qt);
  fa_tensor_release(vw);
  fa_tensor_release(m);
}

static double diff(fa_tensor *a, fa_tensor *b) {
  if (!a || !b) return a == b ? 0 : 1e300;
  double d = 1e300;
  if (fa_max_abs_diff(ctx, a, b, &d) != FA_OK) return 1e300;
  return d;
}

static long c_api_walks(void) {
  long injected = 0;
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
    tu_test = ops[i].name;
    fa_tensor *w1 = NULL, *w2 = NULL;
    CHECK_OK(ctx, ops[i].fn(&w1, &w2)); /* the result without faults (workspaces warmed up) */
    size_t base = tu_mem_now();
    for (long n = 1;; n++) {
      fa_tensor *r1 = NULL, *r2 = NULL;
      arm(n, 1);
      fa_status st = ops[i].fn(&r1, &r2);
      long h = disarm();
      if (h == 0) { /* fewer than n allocations: it ran to the end */
        CHECK(st == FA_OK, "no allocation failed, yet %s: %s", fa_status_name(st), fa_context_error(ctx));
        CHECK(diff(r1, w1) == 0 && diff(r2, w2) == 0, "the result differs from the one without faults");
        fa_tensor_release(r1);
        fa_tensor_release(r2);
        break;
      }
      injected++;
      CHECK(st == FA_ERR_OUT_OF_MEMORY, "allocation %ld failed: status %s (%s)", n, fa_status_name(st),
            fa_context_error(ctx));
      CHECK(strncmp(fa_context_error(ctx), "flashattn:", 10) == 0, "message %s", fa_context_error(ctx));
      CHECK(r1 == NULL && r2 == NULL, "allocation %ld failed: an output anyway", n);
      fa_tensor_release(r1);
      fa_tensor_release(r2);
      CHECK(tu_mem_now() == base, "allocation %ld failed: the engine holds %zu bytes, %zu before", n, tu_mem_now(),
            base);
      if (n > 100000) break;
    }
    fa_tensor_release(w1);
    fa_tensor_release(w2);
  }
  return injected;
}

/* ---- Lua: the `fault` table for tests/fuzz/oom.lua ------------------------------------ */
static int l_arm(lua_State *L) {
  arm((long)luaL_checkinteger(L, 1), lua_toboolean(L, 2));
  return 0;
}
static int l_disarm(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)disarm());
  return 1;
}

static int run_lua(const char *path) {
  lua_State *L = luaL_newstate();
  if (!L) return 1;
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_flashattn);
  lua_setfield(L, -2, "flashattn");
  lua_pop(L, 1);
  lua_createtable(L, 0, 2);
  lua_pushcfunction(L, l_arm);
  lua_setfield(L, -2, "arm");
  lua_pushcfunction(L, l_disarm);
  lua_setfield(L, -2, "disarm");
  lua_setglobal(L, "fault");
  int status = luaL_dofile(L, path);
  if (status != LUA_OK) fprintf(stderr, "test_oom: %s\n", lua_tostring(L, -1));
  int ok = status == LUA_OK && lua_toboolean(L, -1);
  lua_close(L);
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) {
    fprintf(stderr, "no CPU context\n");
    return 1;
  }
  make_inputs();
  long injected = c_api_walks();
  for (int i = 0; i < 6; i++) fa_tensor_release(in[i]);
  fa_context_destroy(ctx);
  tu_test = "C API end";
  CHECK(tu_mem_now() == 0, "the engine holds %zu bytes (leak)", tu_mem_now());
  printf("test_oom: C API: %zu operations, %ld injected failures\n", sizeof ops / sizeof *ops, injected);
  if (argc > 1) {
    tu_test = "oom.lua";
    CHECK(run_lua(argv[1]) == 0, "%s failed", argv[1]);
    CHECK(tu_mem_now() == 0, "the engine holds %zu bytes after the Lua state closed (leak)", tu_mem_now());
  }
  return tu_summary("test_oom");
}
