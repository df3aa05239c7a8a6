/* host_plugin: a host application that embeds flashattn and lets a user
 * script drive it, without giving the script anything but the engine.
 *
 *   host_plugin [--budget N] [--seconds S] [script.lua]   (default: the bundled plugin_script.lua)
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
 *   - N Lua instructions and function calls at most (--budget, default 50
 *     million) and S seconds of wall time (--seconds, default 60): a hook
 *     counts instructions and calls (a C function that C code calls, such
 *     as a metamethod or pcall, runs no instruction) and reads the clock;
 *     past a limit it raises, and then at every instruction, so that a
 *     script cannot catch it with pcall and go on;
 *   - the engine's long loops (fa.bench's repetitions, fa.tensor's walk of a
 *     table) call the host's poll (fa_lua_set_poll), which charges the
 *     budget and reads the clock too;
 *   - the C library loops that call nothing, whose length a script picks
 *     (string.rep of empty strings, table.move/insert/remove over a huge
 *     range, the backtracking of string.find/match/gmatch/gsub), are
 *     refused past a bound on their steps, checked before they start;
 *     setmetatable refuses __gc (Lua runs finalizers with hooks off);
 *   - 256 MiB of Lua heap (the state's allocator refuses more) and 1 GiB of
 *     engine memory (fa_set_memory_limit; the process-wide engine settings
 *     fa.set_memory_limit and fa.set_default_device are taken out of the
 *     script's flashattn table);
 *   - `load` of text only: a binary chunk (string.dump's) is not verified by
 *     Lua and could break the interpreter.
 * A single engine kernel call is not interrupted (it runs C code): its
 * size is bounded by the memory limit. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static long long budget = 50000000, spent = 0, ticks = 0;
static double seconds = 60, deadline;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sandbox_hook(lua_State *L, lua_Debug *ar);

/* Raises, and from now on at every instruction: pcall cannot swallow it for good. */
static void stop(lua_State *L) {
  lua_sethook(L, sandbox_hook, LUA_MASKCOUNT | LUA_MASKCALL, 1);
  lua_error(L);
}

/* Charges n units of work; past the budget or the deadline, stops the script. */
static void charge(lua_State *L, long long n) {
  spent += n;
  if (spent > budget) {
    lua_pushfstring(L, "host_plugin: instruction budget of %I exceeded", (lua_Integer)budget);
    stop(L);
  }
  ticks += n;
  if (ticks >= HOOK_EVERY) { /* the clock every thousand units: calls are cheap */
    ticks = 0;
    if (now() > deadline) {
      lua_pushfstring(L, "host_plugin: time limit of %f s exceeded", (lua_Number)seconds);
      stop(L);
    }
  }
}

/* Count events: HOOK_EVERY instructions ran; call events: one function
 * (Lua or C) is called. */
static void sandbox_hook(lua_State *L, lua_Debug *ar) { charge(L, ar->event == LUA_HOOKCOUNT ? HOOK_EVERY : 1); }

/* The engine's poll: one bench repetition or 65536 table elements count as
 * a thousand instructions. */
static void engine_poll(lua_State *L, void *ud) {
  (void)ud;
  charge(L, HOOK_EVERY);
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

/* Calls upvalue 1 with this call's arguments and returns its results: the
 * library function a sandbox wrapper stands in front of. */
static int call_upvalue(lua_State *L) {
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* load with the mode forced to "t": the base library's, as an upvalue. */
static int text_load(lua_State *L) {
  if (lua_gettop(L) < 3) lua_settop(L, 3);
  lua_pushliteral(L, "t");
  lua_replace(L, 3);
  return call_upvalue(L);
}

/* setmetatable without __gc: Lua runs finalizers with hooks off (lgc.c,
 * GCTM), so a finalizer that loops would escape both limits. */
static int no_gc_setmetatable(lua_State *L) {
  if (lua_type(L, 2) == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, 2) != LUA_TNIL) luaL_error(L, "host_plugin: setmetatable: __gc metamethods are not allowed in the sandbox");
    lua_pop(L, 1);
  }
  return call_upvalue(L);
}

/* ---- library loops a script sizes, bounded before they start ------------- */

/* Steps one library call may take: a few tenths of a second.  A C loop runs
 * no hook, so nothing could stop it once started. */
#define STEP_LIMIT ((double)(1 << 27))
/* Elements table.move/insert/remove may shift: a table in a 256 MiB heap
 * holds fewer (16 bytes each). */
#define SHIFT_LIMIT ((lua_Integer)1 << 24)

static int too_costly(lua_State *L, const char *fname, double steps) {
  return luaL_error(L, "host_plugin: %s: would take about %f steps, more than the sandbox allows one call (%f)", fname,
                    (lua_Number)steps, (lua_Number)STEP_LIMIT);
}

/* string.rep(s, n [, sep]) loops n times even when s and sep are empty. */
static int bounded_rep(lua_State *L) {
  int isint;
  lua_Integer n = lua_tointegerx(L, 2, &isint);
  if (isint && n > 0) {
    size_t ls = lua_type(L, 1) == LUA_TSTRING ? lua_rawlen(L, 1) : 0;
    size_t lsep = lua_type(L, 3) == LUA_TSTRING ? lua_rawlen(L, 3) : 0;
    double steps = (double)n * ((double)ls + (double)lsep + 1);
    if (steps > STEP_LIMIT) too_costly(L, "string.rep", steps);
  }
  return call_upvalue(L);
}

static void check_shift(lua_State *L, const char *fname, lua_Integer from, lua_Integer to) {
  if (to > from && (lua_Unsigned)to - (lua_Unsigned)from >= (lua_Unsigned)SHIFT_LIMIT)
    luaL_error(L, "host_plugin: %s: %I elements to shift, more than the sandbox's %I", fname,
               (lua_Integer)((lua_Unsigned)to - (lua_Unsigned)from), SHIFT_LIMIT);
}

/* table.move(a1, f, e, t [, a2]) moves e - f + 1 elements, present or not. */
static int bounded_move(lua_State *L) {
  int okf, oke;
  lua_Integer f = lua_tointegerx(L, 2, &okf), e = lua_tointegerx(L, 3, &oke);
  if (okf && oke) check_shift(L, "table.move", f, e);
  return call_upvalue(L);
}

/* table.insert and table.remove as ltablib.c's, with a bound on the
 * elements shifted: #t comes from __len, which may say anything (and say it
 * differently to a second caller, so these do not call the originals). */
static int bounded_insert(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer e = (lua_Integer)((lua_Unsigned)luaL_len(L, 1) + 1u), pos;
  switch (lua_gettop(L)) {
  case 2:
    pos = e;
    break;
  case 3:
    pos = luaL_checkinteger(L, 2);
    luaL_argcheck(L, (lua_Unsigned)pos - 1u < (lua_Unsigned)e, 2, "position out of bounds");
    check_shift(L, "table.insert", pos, e);
    for (lua_Integer i = e; i > pos; i--) {
      lua_geti(L, 1, i - 1);
      lua_seti(L, 1, i);
    }
    break;
  default:
    return luaL_error(L, "wrong number of arguments to 'insert'");
  }
  lua_seti(L, 1, pos);
  return 0;
}

static int bounded_remove(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer size = luaL_len(L, 1), pos = luaL_optinteger(L, 2, size);
  if (pos != size)
    luaL_argcheck(L, (lua_Unsigned)pos - 1u <= (lua_Unsigned)size, 2, "position out of bounds");
  check_shift(L, "table.remove", pos, size);
  lua_geti(L, 1, pos);
  for (; pos < size; pos++) {
    lua_geti(L, 1, pos + 1);
    lua_seti(L, 1, pos);
  }
  lua_pushnil(L);
  lua_seti(L, 1, pos);
  return 1;
}

/* Character classes as lstrlib.c (Lua 5.4, MIT licence) matches them, so
 * that the runs counted below are the matcher's own. */
static int match_class(int c, int cl) {
  int res;
  switch (tolower(cl)) {
  case 'a': res = isalpha(c); break;
  case 'c': res = iscntrl(c); break;
  case 'd': res = isdigit(c); break;
  case 'g': res = isgraph(c); break;
  case 'l': res = islower(c); break;
  case 'p': res = ispunct(c); break;
  case 's': res = isspace(c); break;
  case 'u': res = isupper(c); break;
  case 'w': res = isalnum(c); break;
  case 'x': res = isxdigit(c); break;
  default: return cl == c;
  }
  return isupper(cl) ? !res : res;
}

static int match_bracket(int c, const char *p, const char *ec) {
  int sig = 1;
  if (p[1] == '^') {
    sig = 0;
    p++;
  }
  while (++p < ec) {
    if (*p == '%') {
      p++;
      if (match_class(c, (unsigned char)*p)) return sig;
    } else if (p[1] == '-' && p + 2 < ec) {
      p += 2;
      if ((unsigned char)p[-2] <= c && c <= (unsigned char)*p) return sig;
    } else if ((unsigned char)*p == c) {
      return sig;
    }
  }
  return !sig;
}

static int single_match(int c, const char *p, const char *ep) {
  switch (*p) {
  case '.': return 1;
  case '%': return match_class(c, (unsigned char)p[1]);
  case '[': return match_bracket(c, p, ep - 1);
  default: return (unsigned char)*p == c;
  }
}

/* The end of the class at p; NULL for a malformed one (the original raises). */
static const char *class_end(const char *p, const char *pe) {
  switch (*p++) {
  case '%':
    return p < pe ? p + 1 : NULL;
  case '[':
    if (*p == '^') p++;
    do {
      if (p >= pe) return NULL;
      if (*p++ == '%' && p < pe) p++;
    } while (*p != ']');
    return p + 1;
  default:
    return p;
  }
}

/* The longest run of subject characters in the class [p, ep). */
static double longest_run(const char *s, size_t n, const char *p, const char *ep) {
  size_t best = 0, run = 0;
  for (size_t i = 0; i < n; i++) {
    run = single_match((unsigned char)s[i], p, ep) ? run + 1 : 0;
    if (run > best) best = run;
  }
  return (double)best;
}

/* An upper bound of the steps lstrlib.c's backtracking matcher takes for
 * the pattern p over every start in the subject s (all the matches of
 * gsub/gmatch included).  The matcher walks the pattern item by item;
 * `nodes` counts the partial matches that reach an item, each repetition
 * multiplying it by its choices, at most one more than the longest run of
 * its class in s ('?': two).  An item costs its class's length per node (a
 * repetition: per character of the run it scans; %b and back references: up
 * to the subject).  A repetition that ends the pattern (only ')' after it)
 * never backtracks: the scan from where it is reached always completes a
 * match, and the matches' scans do not overlap, so it counts once for the
 * whole call.  Returns 0 for a malformed pattern (the original raises). */
static double match_steps(const char *s, size_t n, const char *p, size_t m, int anchored) {
  const char *pe = p + m;
  double N = (double)n + 1, starts = N, nodes = 1, per_start = 1, once = 0;
  if (anchored && p < pe && *p == '^') {
    p++;
    starts = 1;
  }
  while (p < pe) {
    if (starts * per_start + once > STEP_LIMIT) return starts * per_start + once;
    if (*p == '(' || *p == ')' || (*p == '$' && p + 1 == pe)) { /* captures and the end anchor */
      per_start += nodes;
      p++;
      continue;
    }
    if (*p == '%' && p + 1 < pe && (p[1] == 'b' || isdigit((unsigned char)p[1]))) { /* scan up to the subject */
      if (p[1] == 'b' && p + 3 >= pe) return 0;
      per_start += nodes * N;
      p += p[1] == 'b' ? 4 : 2;
      continue;
    }
    if (*p == '%' && p + 1 < pe && p[1] == 'f') { /* frontier: two class tests */
      if (p + 2 >= pe || p[2] != '[') return 0;
      const char *ep = class_end(p + 2, pe);
      if (!ep) return 0;
      per_start += nodes * 2 * (double)(ep - p);
      p = ep;
      continue;
    }
    const char *ep = class_end(p, pe);
    if (!ep) return 0;
    double c = (double)(ep - p); /* one test of the class */
    int rep = ep < pe ? *ep : 0;
    if (rep != '*' && rep != '+' && rep != '-' && rep != '?') {
      per_start += nodes * c;
      p = ep;
      continue;
    }
    const char *rest = ep + 1;
    while (rest < pe && *rest == ')') rest++;
    int last = rest == pe;
    if (rep == '?') {
      per_start += nodes * c;
      if (!last) nodes *= 2;
    } else {
      once += N * c; /* finding the longest run */
      if (starts * per_start + once > STEP_LIMIT) return starts * per_start + once;
      double run = longest_run(s, n, p, ep);
      if (last) {
        per_start += nodes * (c + 1);
        once += (N + starts) * (c + 1);
      } else {
        per_start += nodes * (run + 1) * (c + 1);
        nodes *= run + 1;
      }
    }
    p = ep + 1;
  }
  return starts * per_start + once;
}

enum { P_FIND, P_MATCH, P_GMATCH, P_GSUB };
static const char *const pattern_fname[] = {"string.find", "string.match", "string.gmatch", "string.gsub"};

/* string.find/match/gmatch/gsub: refused when match_steps says too many (a
 * plain find: memchr and memcmp at every start).  gmatch is checked once
 * for all its iterations. */
static int bounded_pattern(lua_State *L) {
  int kind = (int)lua_tointeger(L, lua_upvalueindex(2));
  if (lua_isstring(L, 1) && lua_isstring(L, 2)) { /* numbers too, as the original converts them */
    size_t n, m;
    const char *s = lua_tolstring(L, 1, &n), *p = lua_tolstring(L, 2, &m);
    double steps = kind == P_FIND && lua_toboolean(L, 4) ? ((double)n + 1) * ((double)m + 1)
                                                          : match_steps(s, n, p, m, kind != P_GMATCH);
    if (steps > STEP_LIMIT) too_costly(L, pattern_fname[kind], steps);
  }
  return call_upvalue(L);
}

/* Puts the wrapper in place of lib[name], with the original as its upvalue 1
 * and `kind` as upvalue 2. */
static void wrap(lua_State *L, const char *lib, const char *name, lua_CFunction wrapper, int kind) {
  lua_getglobal(L, lib);
  lua_getfield(L, -1, name);
  lua_pushinteger(L, kind);
  lua_pushcclosure(L, wrapper, 2);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

static void bound_libraries(lua_State *L) {
  wrap(L, LUA_STRLIBNAME, "rep", bounded_rep, 0);
  wrap(L, LUA_STRLIBNAME, "find", bounded_pattern, P_FIND);
  wrap(L, LUA_STRLIBNAME, "match", bounded_pattern, P_MATCH);
  wrap(L, LUA_STRLIBNAME, "gmatch", bounded_pattern, P_GMATCH);
  wrap(L, LUA_STRLIBNAME, "gsub", bounded_pattern, P_GSUB);
  wrap(L, LUA_TABLIBNAME, "move", bounded_move, 0);
  lua_getglobal(L, LUA_TABLIBNAME);
  lua_pushcfunction(L, bounded_insert);
  lua_setfield(L, -2, "insert");
  lua_pushcfunction(L, bounded_remove);
  lua_setfield(L, -2, "remove");
  lua_pop(L, 1);
  wrap(L, LUA_GNAME, "setmetatable", no_gc_setmetatable, 0);
  wrap(L, LUA_GNAME, "load", text_load, 0);
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
  /* load of text chunks only; bounded string and table loops; no finalizers */
  bound_libraries(L);
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
  fa_lua_set_poll(L, engine_poll, NULL);
  lua_sethook(L, sandbox_hook, LUA_MASKCOUNT | LUA_MASKCALL, HOOK_EVERY);
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

/* The script's arguments (q, k, v, o, params), pushed in protected mode:
 * fa_lua_push_tensor makes a box through a Lua call, which the sandbox's
 * hook sees (and a budget can stop), and raises as lua_newuserdata does. */
static int push_args(lua_State *L) {
  fa_tensor **ts = (fa_tensor **)lua_touserdata(L, 1);
  lua_settop(L, 0);
  for (int i = 0; i < 4; i++) fa_lua_push_tensor(L, ts[i]);
  lua_createtable(L, 0, 4);
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, "causal");
  lua_pushstring(L, "host_plugin");
  lua_setfield(L, -2, "host");
  return 5;
}

static void usage(FILE *f) { fprintf(f, "usage: host_plugin [--budget N] [--seconds S] [script.lua]\n"); }

/* A whole-number or decimal option value, or -1 (with a one-line error). */
static double option_value(const char *name, const char *text, int integer) {
  char *end = NULL;
  const double v = text ? strtod(text, &end) : -1;
  if (!text || end == text || *end || !(v >= 0 && v <= 9e15) || (integer && v != (double)(long long)v)) {
    fprintf(stderr, "host_plugin: %s: expected %s, got %s\n", name,
            integer ? "a whole number >= 0" : "a number of seconds >= 0", text ? text : "nothing");
    return -1;
  }
  return v;
}

int main(int argc, char **argv) {
  int a = 1;
  for (; a < argc && strncmp(argv[a], "--", 2) == 0; a += 2) {
    if (strcmp(argv[a], "--help") == 0) {
      usage(stdout);
      return 0;
    }
    const int is_budget = strcmp(argv[a], "--budget") == 0;
    if (!is_budget && strcmp(argv[a], "--seconds") != 0) {
      fprintf(stderr, "host_plugin: unknown option %s (--budget N, --seconds S, --help)\n", argv[a]);
      return 1;
    }
    const double v = option_value(argv[a], a + 1 < argc ? argv[a + 1] : NULL, is_budget);
    if (v < 0) return 1;
    if (is_budget) budget = (long long)v;
    else seconds = v;
  }
  if (argc > a + 1) {
    usage(stderr);
    return 1;
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

  deadline = now() + seconds;
  lua_pushcfunction(L, traceback); /* 1: message handler */
  if (luaL_loadfilex(L, script, "t") != LUA_OK) { /* 2: the chunk (text only) */
    fprintf(stderr, "host_plugin: %s\n", lua_tostring(L, -1));
  } else {
    fa_tensor *args[4] = {tq, tk, tv, to};
    lua_pushcfunction(L, push_args);
    lua_pushlightuserdata(L, args);
    if (lua_pcall(L, 1, 5, 1) != LUA_OK) { /* 3..7: the script's arguments */
      fprintf(stderr, "host_plugin: the script's arguments:\n%s\n", lua_tostring(L, -1));
    } else if (lua_pcall(L, 5, 1, 1) != LUA_OK) {
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
