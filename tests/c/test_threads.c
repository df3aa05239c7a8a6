/* Two host threads, each with its own fa_context and lua_State, run the
 * same script at the same time (README "Reliability").  The script drives
 * every kernel (all attention, softmax and matmul algorithms, merge_states),
 * views, reductions, printing and an error, and returns its figures; each
 * thread's figures must equal, bit for bit, those of a run alone on the
 * main thread afterwards.  The threads are the first to load the module.
 * At the end the engine holds no memory.
 *
 * Built and run under ThreadSanitizer in CI (scripts/test.sh, the `tsan`
 * configuration: -fsanitize=thread, no CUDA) with OMP_NUM_THREADS=1 and
 * OPENBLAS_NUM_THREADS=1: libgomp and OpenBLAS are not built with TSan, and
 * their worker threads' synchronisation is invisible to it (false reports);
 * with one thread each they start none, so every report is about the engine
 * and the binding.  The ordinary builds run it with their default threads.
 *
 *   test_threads [threads] [rounds]      (default 2 threads, 3 rounds) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "flashattn.h"

#define MAX_FIGURES 4096

static const char *script =
    "local fa, rounds = flashattn, ...\n"
    "local out = {}\n"
    "local function put(x) out[#out + 1] = x end\n"
    "for round = 1, rounds do\n"
    "  local q = fa.randn(1, 4, 48, 32, {seed = round})\n"
    "  local k = fa.randn(1, 2, 80, 32, {seed = round + 100})\n"
    "  local v = fa.randn(1, 2, 80, 24, {seed = round + 200})\n"
    "  for _, algo in ipairs({'naive', 'two_pass', 'flash_row', 'flash'}) do\n"
    "    local o, lse = fa.attention(q, k, v, {algo = algo, causal = true, return_lse = true, tile = {16, 32}})\n"
    "    put(o:sum()); put(lse:sum())\n"
    "    put(fa.attention(q:half(), k:half(), v:half(), {algo = algo, window = {8, 0}}):norm())\n"
    "  end\n"
    "  put(fa.attention_reference(q, k, v, {causal = 'top_left'}):sum())\n"
    "  local x = fa.randn(33, 700, {seed = round + 300})\n"
    "  for _, algo in ipairs({'naive', 'safe', 'online', 'fused', 'auto'}) do\n"
    "    put(fa.softmax(x, {algo = algo}):sum())\n"
    "  end\n"
    "  put(fa.softmax(x:transpose(1, 2)):norm())\n"
    "  local a, b = fa.randn(64, 48, {seed = round + 400}), fa.randn(48, 40, {seed = round + 500})\n"
    "  for _, algo in ipairs({'naive', 'tiled', 'blas'}) do put(fa.matmul(a, b, {algo = algo}):norm()) end\n"
    "  local o1, l1 = fa.attention(q, k:narrow(3, 1, 40), v:narrow(3, 1, 40), {return_lse = true})\n"
    "  local o2, l2 = fa.attention(q, k:narrow(3, 41, 40), v:narrow(3, 41, 40), {return_lse = true})\n"
    "  local om, lm = fa.merge_states(o1, l1, o2, l2)\n"
    "  put(om:sum()); put(lm:sum())\n"
    "  put(#tostring(fa.randn(40, 40)))\n"
    "  put(fa.rand(7, 9):max())\n" /* no seed: the per-state counter */
    "  local ok, err = pcall(fa.attention, q, k, fa.randn(1, 2, 79, 24))\n"
    "  assert(not ok and err:match('^flashattn:'), 'expected a flashattn error')\n"
    "  q:free(); k:free(); v:free()\n"
    "  collectgarbage()\n"
    "end\n"
    "return out\n";

typedef struct {
  int rounds;
  int n;
  double figures[MAX_FIGURES];
  char error[512];
} run;

/* Runs the script in a new state on a new context; 0 on success. */
static int run_script(run *r) {
  fa_context *ctx = NULL;
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) {
    snprintf(r->error, sizeof r->error, "no CPU context");
    return 1;
  }
  lua_State *L = luaL_newstate();
  if (!L) {
    fa_context_destroy(ctx);
    snprintf(r->error, sizeof r->error, "no Lua state");
    return 1;
  }
  static const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},
                                  {LUA_TABLIBNAME, luaopen_table},
                                  {LUA_STRLIBNAME, luaopen_string},
                                  {LUA_MATHLIBNAME, luaopen_math},
                                  {"flashattn", luaopen_flashattn},
                                  {NULL, NULL}};
  for (const luaL_Reg *lib = libs; lib->func; lib++) {
    luaL_requiref(L, lib->name, lib->func, 1);
    lua_pop(L, 1);
  }
  fa_lua_set_context(L, ctx);
  int status = 1;
  r->n = 0;
  if (luaL_loadbuffer(L, script, strlen(script), "=threads_script") != LUA_OK) {
    snprintf(r->error, sizeof r->error, "%s", lua_tostring(L, -1));
  } else {
    lua_pushinteger(L, r->rounds);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
      snprintf(r->error, sizeof r->error, "%s", lua_tostring(L, -1));
    } else {
      lua_Integer n = luaL_len(L, -1);
      for (lua_Integer i = 1; i <= n && r->n < MAX_FIGURES; i++) {
        lua_geti(L, -1, i);
        r->figures[r->n++] = (double)lua_tonumber(L, -1);
        lua_pop(L, 1);
      }
      status = 0;
    }
  }
  lua_close(L);
  fa_context_destroy(ctx);
  return status;
}

static void *thread_main(void *arg) {
  run *r = (run *)arg;
  return run_script(r) ? r : NULL;
}

int main(int argc, char **argv) {
  int nthreads = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 3;
  if (nthreads < 1 || nthreads > 16 || rounds < 1) {
    fprintf(stderr, "usage: test_threads [threads 1-16] [rounds]\n");
    return 2;
  }
  static run alone, runs[16];
  pthread_t tid[16];
  for (int i = 0; i < nthreads; i++) {
    runs[i].rounds = rounds;
    if (pthread_create(&tid[i], NULL, thread_main, &runs[i]) != 0) {
      fprintf(stderr, "test_threads: pthread_create failed\n");
      return 1;
    }
  }
  /* the threads are the first to load the module and make contexts;
   * the run alone comes after them */
  void *res[16];
  for (int i = 0; i < nthreads; i++) pthread_join(tid[i], &res[i]);
  alone.rounds = rounds;
  if (run_script(&alone)) {
    fprintf(stderr, "test_threads: the run alone failed: %s\n", alone.error);
    return 1;
  }
  int failures = 0;
  for (int i = 0; i < nthreads; i++) {
    if (res[i]) {
      fprintf(stderr, "test_threads: thread %d failed: %s\n", i, runs[i].error);
      failures++;
    } else if (runs[i].n != alone.n || memcmp(runs[i].figures, alone.figures, sizeof(double) * (size_t)alone.n) != 0) {
      for (int j = 0; j < alone.n && j < runs[i].n; j++)
        if (memcmp(&runs[i].figures[j], &alone.figures[j], sizeof(double)) != 0) {
          fprintf(stderr, "test_threads: thread %d, figure %d: %.17g, alone %.17g\n", i, j + 1, runs[i].figures[j],
                  alone.figures[j]);
          break;
        }
      if (runs[i].n != alone.n) fprintf(stderr, "test_threads: thread %d: %d figures, alone %d\n", i, runs[i].n, alone.n);
      failures++;
    }
  }
  size_t cur, peak;
  fa_memory(FA_CPU, &cur, &peak);
  if (cur != 0) {
    fprintf(stderr, "test_threads: the engine holds %zu bytes at the end (leak)\n", cur);
    failures++;
  }
  printf("test_threads: %d threads x %d rounds, %d figures each, %s\n", nthreads, rounds, alone.n,
         failures ? "FAILED" : "identical to the run alone");
  return failures ? 1 : 0;
}
