/* Per-lua_State binding state (contexts, seed counter, bench buffer, the
 * list of live boxes), error raising and small argument helpers.
 *
 * The state is a userdata in the registry with a __gc, so it lives exactly
 * as long as the lua_State and its resources go with lua_close.  It is made
 * before any box (fal_newbox asks for it first), and Lua runs finalizers in
 * the reverse order of their marking: at lua_close every box's __gc runs
 * before the state's.  What a finalizer makes while the state closes gets
 * no __gc of its own (Lua 5.4 marks nothing for finalization then): such
 * boxes stay in the state's list and the state's __gc releases them; once
 * it has run, nothing new (boxes, contexts, buffers) is made. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lbinding.h"

/* Its address is the registry key of the state (unique per process). */
static const char state_key = 0;

#define FLUSH_BYTES ((size_t)64 << 20) /* larger than the last-level caches we target */
#define GC_MIN_STEP ((size_t)64 << 20)

void fal_link_in(fal_state *s, fal_link *l, void (*drop)(fal_link *)) {
  l->drop = drop;
  l->prev = &s->live;
  l->next = s->live.next;
  s->live.next->prev = l;
  s->live.next = l;
}

void fal_link_box(lua_State *L, fal_state *s, fal_link *l, void (*drop)(fal_link *)) {
  l->prev = l->next = NULL;
  l->drop = drop;
  const int running = lua_gc(L, LUA_GCISRUNNING);
#if LUA_VERSION_RELEASE_NUM >= 50404
  const int in_finalizer = running < 0; /* 0: a collector the script stopped (collectgarbage("stop")) */
#else
  const int in_finalizer = running <= 0; /* cannot be told from a stopped collector: both linked */
#endif
  if (in_finalizer) fal_link_in(s, l, drop);
}

/* Drawn once when the library loads (a constructor: before any thread can
 * use it); from the kernel's random source, else the clock and addresses. */
static uint64_t magic_secret;

__attribute__((constructor)) static void magic_secret_draw(void) {
  uint64_t s = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(&s, sizeof s, 1, f) != 1) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    s = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&ts;
  }
  if (f) fclose(f);
  magic_secret = s | 1;
}

uint64_t fal_magic(const void *p, int kind) {
  uint64_t x = magic_secret ^ (uint64_t)(uintptr_t)p ^ (uint64_t)kind * 0x9e3779b97f4a7c15ull;
  x ^= x >> 31; /* mixed, so that neighbouring boxes do not differ in a few bits only */
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

void fal_guard_metatable(lua_State *L, const char *name, lua_CFunction gc, lua_CFunction close) {
  if (gc) {
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
  }
  if (close) {
    lua_pushcfunction(L, close);
    lua_setfield(L, -2, "__close");
  }
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__name");
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__metatable");
}

void *fal_testudata(lua_State *L, int idx, const char *mt, size_t size) {
  void *p = luaL_testudata(L, idx, mt);
  return p && lua_rawlen(L, idx) == size ? p : NULL;
}

void fal_unlink(fal_link *l) {
  if (!l->prev) return;
  l->prev->next = l->next;
  l->next->prev = l->prev;
  l->prev = l->next = NULL;
}

static int state_gc(lua_State *L) {
  fal_state *s = (fal_state *)lua_touserdata(L, 1);
  /* only the state itself (the debug library can give its metatable to another userdata) */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &state_key);
  const int ours = lua_touserdata(L, -1) == s && s;
  lua_pop(L, 1);
  if (!ours) return 0;
  s->closed = 1;
  while (s->live.next != &s->live) { /* boxes made by finalizers during lua_close */
    fal_link *l = s->live.next;
    fal_unlink(l);
    l->drop(l);
  }
  if (s->own) fa_context_destroy(s->own);
  s->own = NULL;
  s->host = NULL;
  free(s->flush);
  s->flush = NULL;
  return 0;
}

fal_state *fal_state_get(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &state_key) == LUA_TUSERDATA) {
    fal_state *s = (fal_state *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    return s;
  }
  lua_pop(L, 1);
  /* Inside a finalizer (Lua 5.4.4+ answers -1 there) a new state might be
   * made during lua_close, unmarked: its __gc would never run. */
  if (lua_gc(L, LUA_GCISRUNNING) < 0)
    fal_error(L, "the module cannot be opened inside a finalizer (__gc): require it before");
  fal_state *s = (fal_state *)lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  s->live.prev = s->live.next = &s->live;
  lua_createtable(L, 0, 3);
  fal_guard_metatable(L, "flashattn.State", state_gc, NULL);
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &state_key); /* the registry keeps it */
  return s;
}

fal_state *fal_live_state(lua_State *L) {
  fal_state *s = fal_state_get(L);
  if (s->closed) fal_error(L, "the lua_State is closing: the module can no longer be used in it");
  return s;
}

/* The module's own context on the default device; NULL when impossible. */
static fa_context *own_context(fal_state *s) {
  if (!s->own && fa_context_create(fa_default_device(), &s->own) != FA_OK) s->own = NULL;
  return s->own;
}

fa_context *fal_ctx(lua_State *L) {
  fal_state *s = fal_live_state(L);
  if (s->host) return s->host;
  fa_context *ctx = own_context(s);
  if (!ctx) {
    const char *env = getenv("FLASHATTN_DEVICE");
    if (env && *env) { /* the device parser says why, naming the value given (also "cuda:0" with no GPU) */
      fa_device d;
      lua_pushstring(L, env);
      fal_parse_device(L, -1, "cannot create a context: FLASHATTN_DEVICE (or call fa.set_default_device('cpu'))", &d);
    }
    fal_error(L, "cannot create a context on the default device '%s' (check FLASHATTN_DEVICE, or call "
                 "fa.set_default_device('cpu'))",
              fa_device_name(fa_default_device()));
  }
  return ctx;
}

FA_API fa_context *fa_lua_get_context(lua_State *L) {
  fal_state *s = fal_state_get(L);
  if (s->closed) return NULL; /* a context made now would outlive the state */
  return s->host ? s->host : own_context(s);
}

FA_API void fa_lua_set_context(lua_State *L, fa_context *ctx) { fal_state_get(L)->host = ctx; }

fa_status fal_make_own_context(lua_State *L, fa_device device) {
  fal_state *s = fal_live_state(L);
  if (s->own) return FA_OK;
  fa_status st = fa_context_create(device, &s->own);
  if (st != FA_OK) s->own = NULL;
  return st;
}

uint64_t fal_next_seed(lua_State *L) {
  /* splitmix64 of a counter: distinct, well-mixed seeds that are still
   * reproducible run to run (like PyTorch's fixed default seed) */
  return fa_seed_at(++fal_state_get(L)->seed_counter);
}

void fal_flush_host_cache(lua_State *L) {
  fal_state *s = fal_live_state(L);
  if (!s->flush) {
    s->flush = (unsigned char *)malloc(FLUSH_BYTES);
    if (!s->flush) fal_error(L, "fa.bench: cannot allocate the %d MiB cache-flush buffer", (int)(FLUSH_BYTES >> 20));
    s->flush_bytes = FLUSH_BYTES;
  }
  /* a new value each round: the stores cannot be skipped as redundant */
  memset(s->flush, (int)(++s->flush_round & 0xff), s->flush_bytes);
}

static void reset_gc_base(fal_state *s) {
  fa_memory(FA_CPU, &s->gc_base[0], NULL);
  fa_memory(FA_CUDA, &s->gc_base[1], NULL);
}

void fal_collect(lua_State *L) {
  lua_gc(L, LUA_GCCOLLECT, 0);
  reset_gc_base(fal_state_get(L));
}

void fal_gc_pressure(lua_State *L) {
  fal_state *s = fal_state_get(L);
  static const fa_device devs[2] = {FA_CPU, FA_CUDA};
  int collect = 0;
  for (int i = 0; i < 2; i++) {
    size_t cur, base = s->gc_base[i];
    fa_memory(devs[i], &cur, NULL);
    if (cur < base) s->gc_base[i] = base = cur; /* memory went back: follow it down */
    /* collect when the engine has grown by max(64 MiB, what it held after
     * the last collection), or by half the room left under a set limit */
    size_t step = base > GC_MIN_STEP ? base : GC_MIN_STEP;
    size_t limit = fa_memory_limit(devs[i]);
    if (limit > base && (limit - base) / 2 < step) step = (limit - base) / 2;
    if (cur - base > step) collect = 1;
  }
  if (collect) fal_collect(L);
}

/* ---- errors ---------------------------------------------------------- */

int fal_error(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushliteral(L, "flashattn: ");
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  return lua_error(L);
}

int fal_fail(lua_State *L, fa_context *ctx) {
  const char *msg = fa_context_error(ctx);
  if (!msg || !*msg) msg = "flashattn: the engine failed without a message";
  lua_pushstring(L, msg);
  return lua_error(L);
}

const char *fal_typename(lua_State *L, int idx) {
  int tt = luaL_getmetafield(L, idx, "__name");
  if (tt != LUA_TNIL) {
    const char *name = tt == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    lua_pop(L, 1); /* the string stays alive in the metatable */
    /* a table or other value that names itself as one of the module's userdata is not one:
     * "expected flashattn.Tensor, got flashattn.Tensor" would say nothing */
    if (name && lua_type(L, idx) != LUA_TUSERDATA && strncmp(name, "flashattn.", 10) == 0) name = NULL;
    if (name) return name;
  }
  if (lua_type(L, idx) == LUA_TLIGHTUSERDATA) return "light userdata";
  return luaL_typename(L, idx);
}

void fal_push_weak_keyed(lua_State *L, const void *key) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, key) == LUA_TTABLE) return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, key);
}

/* Pushes "argument #n (name)", or "self" for the receiver of a method call. */
const char *fal_arglabel(lua_State *L, int idx, const char *name) {
  lua_Debug ar;
  int n = idx;
  if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar) && ar.namewhat && strcmp(ar.namewhat, "method") == 0)
    n--; /* like luaL_argerror: obj:m(x) calls x argument #1 */
  if (idx < 0 && name) lua_pushstring(L, name); /* an element of a table argument: os[2] */
  else if (n == 0) lua_pushliteral(L, "self");
  else if (name) lua_pushfstring(L, "argument #%d (%s)", n, name);
  else lua_pushfstring(L, "argument #%d", n);
  return lua_tostring(L, -1);
}

int fal_argerror(lua_State *L, int idx, const char *name, const char *fmt, ...) {
  va_list ap;
  lua_pushliteral(L, "flashattn: ");
  fal_arglabel(L, idx, name);
  lua_pushliteral(L, ": ");
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 4);
  return lua_error(L);
}

int fal_nargs(lua_State *L) {
  int n = lua_gettop(L);
  while (n > 0 && lua_isnil(L, n)) n--;
  return n;
}

#define DESCRIBE_MAX 48 /* longer strings are cut in messages */

const char *fal_describe(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  switch (lua_type(L, idx)) {
  case LUA_TSTRING: {
    size_t n;
    const char *str = lua_tolstring(L, idx, &n); /* a string already: nothing converted */
    luaL_Buffer b; /* a NUL byte shown as \0: the message is a C string */
    luaL_buffinit(L, &b);
    luaL_addchar(&b, '\'');
    for (size_t i = 0; i < n && i < DESCRIBE_MAX; i++) {
      if (str[i]) luaL_addchar(&b, str[i]);
      else luaL_addstring(&b, "\\0");
    }
    luaL_addstring(&b, n > DESCRIBE_MAX ? "...'" : "'");
    if (strlen(str) != n) luaL_addstring(&b, " (a string with a NUL byte)");
    luaL_pushresult(&b);
    break;
  }
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) lua_pushfstring(L, "%I", lua_tointeger(L, idx));
    else lua_pushfstring(L, "%f", lua_tonumber(L, idx));
    break;
  case LUA_TBOOLEAN:
    lua_pushstring(L, lua_toboolean(L, idx) ? "true" : "false");
    break;
  default: /* never __tostring: it may fail, return a non-string or run for long */
    lua_pushfstring(L, "a %s", fal_typename(L, idx));
  }
  return lua_tostring(L, -1);
}

int fal_typeerror(lua_State *L, int idx, const char *name, const char *what) {
  return fal_argerror(L, idx, name, "expected %s, got %s", what, fal_typename(L, idx));
}

/* ---- argument helpers -------------------------------------------------- */

int64_t fal_checkint(lua_State *L, int idx, const char *name) {
  int isint;
  lua_Integer v;
  if (lua_type(L, idx) != LUA_TNUMBER) fal_typeerror(L, idx, name, "an integer");
  v = lua_tointegerx(L, idx, &isint);
  if (!isint) fal_argerror(L, idx, name, "expected an integer, got %f", (double)lua_tonumber(L, idx));
  return (int64_t)v;
}

int64_t fal_checkindex(lua_State *L, int idx, const char *name) {
  int64_t v = fal_checkint(L, idx, name);
  if (v < 1) fal_argerror(L, idx, name, "expected an index >= 1, got %I", (lua_Integer)v);
  return v - 1;
}

double fal_checknum(lua_State *L, int idx, const char *name) {
  if (lua_type(L, idx) != LUA_TNUMBER) fal_typeerror(L, idx, name, "number");
  return (double)lua_tonumber(L, idx);
}

double fal_checkvalue(lua_State *L, int idx, const char *name) {
  if (lua_type(L, idx) == LUA_TBOOLEAN) return lua_toboolean(L, idx) ? 1.0 : 0.0;
  if (lua_type(L, idx) != LUA_TNUMBER) fal_typeerror(L, idx, name, "number or boolean");
  return (double)lua_tonumber(L, idx);
}

int fal_dim0(int64_t dim1) {
  /* out-of-range values stay out of range (the core names them) */
  if (dim1 > 1000) return 1000;
  if (dim1 < -1000) return -1000;
  return (int)dim1 - 1;
}

void *fal_newbuffer(lua_State *L, int64_t n, size_t size, const char *what) {
  if (n < 0 || (uint64_t)n > (SIZE_MAX / 2) / (size ? size : 1))
    fal_error(L, "%s: %I elements is too many", what, (lua_Integer)n);
  return lua_newuserdatauv(L, (size_t)n * size, 0);
}
