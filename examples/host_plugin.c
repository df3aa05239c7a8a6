/* host_plugin: a host application that embeds flashattn and lets a user
 * script drive it, without giving the script anything but the engine.
 *
 *   host_plugin [--budget N] [script.lua]   (default: the bundled plugin_script.lua)
 *
 * The host owns its Q, K, V and O buffers (plain malloc'd floats), wraps them
 * zero-copy with fa_tensor_wrap, and runs the script in a restricted Lua
 * state: the base, table, string and math libraries (no io, os, package,
 * debug; base's dofile/loadfile removed too, since they read files) plus
 * `flashattn`, preloaded with luaL_requiref and bound to the host's own
 * fa_context.  The script receives (q, k, v, o, params) as its arguments and
 * must leave the attention output in o (fa.attention with opts.out = o, or
 * o:copy_(...)).  The host then checks O against its own plain C computation.
 * A script error is reported with a Lua traceback.
 *
 * What the sandbox holds a script to (README "Reliability"):
 *   - N Lua instructions at most (--budget, default 50 million): a count hook
 *     raises an error past it, and then at every instruction, so that a
 *     script cannot catch it with pcall and go on;
 *   - 256 MiB of Lua heap (the state's allocator refuses more) and 1 GiB of
 *     engine memory (fa_set_memory_limit; the process-wide engine settings
 *     fa.set_memory_limit and fa.set_default_device are taken out of the
 *     script's flashattn table);
 *   - `load` of text only: a binary chunk (string.dump's) is not verified by
 *     Lua and could break the interpreter.
 * A single engine call is not interrupted by the hook (it runs C code):
 * its size is bounded by the memory limit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "flashattn.h"

#ifndef FA_PLUGIN_SCRIPT
#define FA_PLUGIN_SCRIPT "plugin_script.lua"
#endif

enum { B = 2, HQ = 4, HKV = 2, LQ = 48, LK = 64, D = 32 };

/* ---- the host's own buffers and computation -------------------------------- */

static void fill(float *p, size_t n, unsigned seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (float)((double)(x >> 8) / 16777216.0 * 2.0 - 1.0);
  }
}

/* Causal (bottom-right) attention with scale 1/sqrt(D), in double. */
static void host_attention(const float *q, const float *k, const float *v, double *o) {
  double s[LK];
  const double scale = 1.0 / sqrt((double)D);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HQ; h++) {
      int hk = h / (HQ / HKV);
      for (int i = 0; i < LQ; i++) {
        const float *qi = q + (((size_t)b * HQ + h) * LQ + i) * D;
        double m = -INFINITY, den = 0;
        for (int j = 0; j < LK; j++) {
          const float *kj = k + (((size_t)b * HKV + hk) * LK + j) * D;
          double dot = 0;
          for (int d = 0; d < D; d++) dot += (double)qi[d] * kj[d];
          s[j] = j <= i + LK - LQ ? scale * dot : -INFINITY;
          if (s[j] > m) m = s[j];
        }
        double *oi = o + (((size_t)b * HQ + h) * LQ + i) * D;
        for (int d = 0; d < D; d++) oi[d] = 0;
        for (int j = 0; j < LK; j++) {
          if (s[j] == -INFINITY) continue;
          double p = exp(s[j] - m);
          den += p;
          const float *vj = v + (((size_t)b * HKV + hk) * LK + j) * D;
          for (int d = 0; d < D; d++) oi[d] += p * vj[d];
        }
        for (int d = 0; d < D; d++) oi[d] /= den;
      }
    }
}

/* Counts the engine's releases of the host's buffers. */
static int releases[4];
static void on_release(void *data, void *user) {
  (void)data;
  (*(int *)user)++;
}

/* ---- the sandbox ------------------------------------------------------------ */

#define HOOK_EVERY 1000                   /* instructions between two budget checks */
#define LUA_HEAP_LIMIT ((size_t)256 << 20) /* bytes of Lua heap a script may hold */
#define ENGINE_LIMIT ((size_t)1 << 30)     /* bytes of engine memory (tensors, workspaces) */

static long long budget = 50000000, spent = 0;

/* Counts instructions; past the budget every instruction raises. */
static void budget_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  spent += HOOK_EVERY;
  if (spent > budget) {
    lua_sethook(L, budget_hook, LUA_MASKCOUNT, 1); /* pcall cannot swallow it for good */
    luaL_error(L, "host_plugin: instruction budget of %I exceeded", (lua_Integer)budget);
  }
}

/* The state's allocator: the C library's, with a cap on the bytes in use. */
typedef struct {
  size_t used, limit;
} heap;

static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  heap *h = (heap *)ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    h->used -= old;
    return NULL;
  }
  if (nsize > old && nsize - old > h->limit - h->used) return NULL; /* Lua raises "not enough memory" */
  void *p = realloc(ptr, nsize);
  if (p) h->used = h->used - old + nsize;
  return p;
}

/* load with the mode forced to "t": the base library's, as an upvalue. */
static int text_load(lua_State *L) {
  int n = lua_gettop(L);
  if (n < 3) lua_settop(L, n = 3);
  lua_pushliteral(L, "t");
  lua_replace(L, 3);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static heap lua_heap = {0, LUA_HEAP_LIMIT};

static lua_State *new_sandbox(fa_context *ctx) {
  lua_State *L = lua_newstate(capped_alloc, &lua_heap);
  if (!L) return NULL;
  static const luaL_Reg libs[] = {
      {LUA_GNAME, luaopen_base}, {LUA_TABLIBNAME, luaopen_table}, {LUA_STRLIBNAME, luaopen_string},
      {LUA_MATHLIBNAME, luaopen_math}, {NULL, NULL}};
  for (const luaL_Reg *lib = libs; lib->func; lib++) {
    luaL_requiref(L, lib->name, lib->func, 1);
    lua_pop(L, 1);
  }
  /* base's file loaders reach the file system: not for plugins */
  lua_pushnil(L);
  lua_setglobal(L, "dofile");
  lua_pushnil(L);
  lua_setglobal(L, "loadfile");
  /* load: text chunks only */
  lua_getglobal(L, "load");
  lua_pushcclosure(L, text_load, 1);
  lua_setglobal(L, "load");
  /* the engine, as the global `flashattn`, on the host's context; the
   * process-wide settings stay the host's */
  luaL_requiref(L, "flashattn", luaopen_flashattn, 1);
  lua_pushnil(L);
  lua_setfield(L, -2, "set_memory_limit");
  lua_pushnil(L);
  lua_setfield(L, -2, "set_default_device");
  lua_pop(L, 1);
  fa_lua_set_context(L, ctx);
  fa_set_memory_limit(FA_CPU, ENGINE_LIMIT);
  lua_sethook(L, budget_hook, LUA_MASKCOUNT, HOOK_EVERY);
  return L;
}

/* Nothing outside the four libraries and flashattn is reachable. */
static int check_sandbox(lua_State *L) {
  static const char *const absent[] = {"io", "os", "package", "require", "debug", "dofile", "loadfile", "coroutine",
                                       "utf8", NULL};
  int ok = 1;
  for (const char *const *name = absent; *name; name++) {
    if (lua_getglobal(L, *name) != LUA_TNIL) {
      fprintf(stderr, "host_plugin: the sandbox exposes '%s'\n", *name);
      ok = 0;
    }
    lua_pop(L, 1);
  }
  if (lua_getglobal(L, "flashattn") != LUA_TTABLE) {
    fprintf(stderr, "host_plugin: flashattn is not loaded\n");
    ok = 0;
  }
  lua_pop(L, 1);
  return ok;
}

int main(int argc, char **argv) {
  int a = 1;
  if (argc > 2 && strcmp(argv[1], "--budget") == 0) {
    budget = atoll(argv[2]);
    a = 3;
  }
  const char *script = argc > a ? argv[a] : FA_PLUGIN_SCRIPT;
  const size_t nq = (size_t)B * HQ * LQ * D, nk = (size_t)B * HKV * LK * D, no = nq;
  float *Q = malloc(nq * sizeof *Q), *K = malloc(nk * sizeof *K), *V = malloc(nk * sizeof *V);
  float *O = malloc(no * sizeof *O);
  double *R = malloc(no * sizeof *R);
  if (!Q || !K || !V || !O || !R) {
    fprintf(stderr, "host_plugin: out of memory\n");
    return 1;
  }
  fill(Q, nq, 1);
  fill(K, nk, 2);
  fill(V, nk, 3);
  for (size_t i = 0; i < no; i++) O[i] = NAN; /* whatever the script does not write shows */
  host_attention(Q, K, V, R);

  int status = 1;
  fa_context *ctx = NULL;
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) {
    fprintf(stderr, "host_plugin: no CPU context\n");
    return 1;
  }

  /* the host's buffers as tensors: zero copy, released back through the callback */
  const int64_t sq[4] = {B, HQ, LQ, D}, sk[4] = {B, HKV, LK, D};
  fa_tensor *tq = NULL, *tk = NULL, *tv = NULL, *to = NULL;
  if (fa_tensor_wrap(ctx, Q, FA_CPU, FA_F32, 4, sq, NULL, on_release, &releases[0], &tq) != FA_OK ||
      fa_tensor_wrap(ctx, K, FA_CPU, FA_F32, 4, sk, NULL, on_release, &releases[1], &tk) != FA_OK ||
      fa_tensor_wrap(ctx, V, FA_CPU, FA_F32, 4, sk, NULL, on_release, &releases[2], &tv) != FA_OK ||
      fa_tensor_wrap(ctx, O, FA_CPU, FA_F32, 4, sq, NULL, on_release, &releases[3], &to) != FA_OK) {
    fprintf(stderr, "host_plugin: fa_tensor_wrap: %s\n", fa_context_error(ctx));
    return 1;
  }

  lua_State *L = new_sandbox(ctx);
  if (!L || !check_sandbox(L)) {
    fprintf(stderr, "host_plugin: could not set up the sandbox\n");
    return 1;
  }

  lua_pushcfunction(L, traceback); /* 1: message handler */
  if (luaL_loadfilex(L, script, "t") != LUA_OK) { /* 2: the chunk (text only) */
    fprintf(stderr, "host_plugin: %s\n", lua_tostring(L, -1));
  } else {
    /* the script's arguments: q, k, v, o, params */
    fa_lua_push_tensor(L, tq);
    fa_lua_push_tensor(L, tk);
    fa_lua_push_tensor(L, tv);
    fa_lua_push_tensor(L, to);
    lua_createtable(L, 0, 4);
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "causal");
    lua_pushstring(L, "host_plugin");
    lua_setfield(L, -2, "host");
    if (lua_pcall(L, 5, 1, 1) != LUA_OK) {
      fprintf(stderr, "host_plugin: the script failed:\n%s\n", lua_tostring(L, -1));
    } else {
      /* the result lies in the host's own O buffer */
      double maxd = 0;
      int nan = 0;
      for (size_t i = 0; i < no; i++) {
        double d = fabs((double)O[i] - R[i]);
        if (d != d) nan++;
        else if (d > maxd) maxd = d;
      }
      const char *note = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
      if (nan || maxd > 1e-5) {
        fprintf(stderr, "host_plugin: O differs from the host's computation: max |diff| = %g, %d NaN\n", maxd, nan);
      } else {
        printf("host_plugin: OK: %s; O (%dx%dx%dx%d) matches the host's computation, max |diff| = %.3g\n", note, B,
               HQ, LQ, D, maxd);
        status = 0;
      }
    }
  }
  lua_close(L);

  /* the host drops its references: every buffer comes back exactly once */
  fa_tensor_release(tq);
  fa_tensor_release(tk);
  fa_tensor_release(tv);
  fa_tensor_release(to);
  for (int i = 0; i < 4; i++)
    if (releases[i] != 1) {
      fprintf(stderr, "host_plugin: buffer %d released %d times\n", i, releases[i]);
      status = 1;
    }
  fa_context_destroy(ctx);
  size_t cur, peak;
  fa_memory(FA_CPU, &cur, &peak);
  if (cur != 0) {
    fprintf(stderr, "host_plugin: the engine still holds %zu bytes\n", cur);
    status = 1;
  }
  free(Q);
  free(K);
  free(V);
  free(O);
  free(R);
  return status;
}
