/* Reading option tables: every key is checked against the function's list
 * (a typo such as `caual` is an error, never silently ignored), and each
 * value is checked for its Lua type.  Value ranges are the core's job.
 * No metamethod of a key runs, and an opts table's __index runs only
 * inside fal_opts, protected (see snapshot). */
#include <string.h>

#include "lbinding.h"

/* t[key] for the protected reads of snapshot: (t, key) -> value. */
static int index_field(lua_State *L) {
  lua_gettable(L, 1);
  return 1;
}

/* An opts table with an __index runs script code at every read, and that
 * code may raise, or try to yield, which cannot cross the binding's C
 * frames ("attempt to yield across a C-call boundary").  So each allowed
 * option is read once here, in a protected call whose failure becomes a
 * "flashattn:" error naming the option, into a plain table that takes the
 * opts' place at idx: every later read (the getters below, and the
 * kernels' own reads of opts) runs no code.  The copy also keeps alive
 * what __index handed out. */
static void snapshot(lua_State *L, int idx, const char *const *allowed) {
  if (luaL_getmetafield(L, idx, "__index") == LUA_TNIL) return; /* reads are raw: nothing runs */
  lua_pop(L, 1);
  lua_newtable(L);
  int copy = lua_gettop(L);
  for (const char *const *a = allowed; *a; a++) {
    lua_pushcfunction(L, index_field);
    lua_pushvalue(L, idx);
    lua_pushstring(L, *a);
    int status = lua_pcall(L, 2, 1, 0);
    if (status == LUA_ERRMEM) lua_error(L); /* Lua's own out of memory, as everywhere else */
    if (status != LUA_OK && lua_type(L, -1) == LUA_TSTRING)
      fal_error(L, "opts.%s: the opts table's __index raised an error: %s", *a, lua_tostring(L, -1));
    if (status != LUA_OK)
      fal_error(L, "opts.%s: the opts table's __index raised an error (a %s value)", *a, fal_typename(L, -1));
    lua_setfield(L, copy, *a);
  }
  lua_replace(L, idx);
}

int fal_opts(lua_State *L, int idx, const char *fname, const char *const *allowed) {
  if (lua_isnoneornil(L, idx)) return 0;
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx)) fal_typeerror(L, idx, "opts", "table");
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1); /* the value; the key stays for lua_next */
    int known = 0;
    if (lua_type(L, -1) == LUA_TSTRING) {
      const char *key = fal_cstring(L, -1); /* {["causal\0"] = true} is no causal: an unknown option */
      for (const char *const *a = allowed; key && *a && !known; a++) known = strcmp(key, *a) == 0;
    }
    if (!known) { /* described without running a metamethod; numbers and booleans as keys: [1], [true] */
      const int bracket = lua_type(L, -1) == LUA_TNUMBER || lua_type(L, -1) == LUA_TBOOLEAN;
      const char *shown = fal_describe(L, -1);
      fal_error(L, bracket ? "opts: unknown option [%s] for %s" : "opts: unknown option %s for %s", shown, fname);
    }
  }
  snapshot(L, idx, allowed);
  return 1;
}

/* Pushes opts[key]; returns its type (nil: absent, nothing left pushed). */
static int get(lua_State *L, int idx, const char *key) {
  int tt = lua_getfield(L, idx, key);
  if (tt == LUA_TNIL) lua_pop(L, 1);
  return tt;
}

static int bad(lua_State *L, const char *key, const char *what) {
  return fal_error(L, "opts.%s: expected %s, got %s", key, what, fal_typename(L, -1));
}

/* The value on the stack's top (opts[key], popped) as an integer. */
static int64_t pop_int(lua_State *L, const char *key) {
  int isint;
  if (lua_type(L, -1) != LUA_TNUMBER) bad(L, key, "an integer");
  lua_Integer v = lua_tointegerx(L, -1, &isint);
  if (!isint) fal_error(L, "opts.%s: expected an integer, got %f", key, (double)lua_tonumber(L, -1));
  lua_pop(L, 1);
  return (int64_t)v;
}

int fal_opt_int(lua_State *L, int idx, const char *key, int64_t *out) {
  if (get(L, idx, key) == LUA_TNIL) return 0;
  *out = pop_int(L, key);
  return 1;
}

int fal_opt_num(lua_State *L, int idx, const char *key, double *out) {
  int tt = get(L, idx, key);
  if (tt == LUA_TNIL) return 0;
  if (tt != LUA_TNUMBER) bad(L, key, "number");
  *out = (double)lua_tonumber(L, -1);
  lua_pop(L, 1);
  return 1;
}

int fal_opt_bool(lua_State *L, int idx, const char *key, int *out) {
  int tt = get(L, idx, key);
  if (tt == LUA_TNIL) return 0;
  if (tt != LUA_TBOOLEAN) bad(L, key, "boolean");
  *out = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return 1;
}

const char *fal_opt_string(lua_State *L, int idx, const char *key) {
  int tt = get(L, idx, key);
  if (tt == LUA_TNIL) return NULL;
  if (tt != LUA_TSTRING) bad(L, key, "a string");
  const char *v = fal_cstring(L, -1);
  if (!v) fal_error(L, "opts.%s: expected a string without NUL bytes, got %s", key, fal_describe(L, -1));
  return v;
}

int fal_opt_enum(lua_State *L, int idx, const char *key, const char *const *names, int *out) {
  int tt = get(L, idx, key);
  if (tt == LUA_TNIL) return 0;
  if (tt == LUA_TSTRING) {
    const char *s = fal_cstring(L, -1); /* "flash\0x" is no "flash" */
    for (int i = 0; s && names[i]; i++)
      if (strcmp(s, names[i]) == 0) {
        *out = i;
        lua_pop(L, 1);
        return 1;
      }
  }
  /* "expected one of a, b, c, got 'x'" */
  luaL_Buffer b;
  int top = lua_gettop(L);
  luaL_buffinit(L, &b);
  for (int i = 0; names[i]; i++) {
    if (i) luaL_addstring(&b, ", ");
    luaL_addstring(&b, names[i]);
  }
  luaL_pushresult(&b);
  const char *choices = lua_tostring(L, -1);
  return fal_error(L, "opts.%s: expected one of %s, got %s", key, choices,
                   tt == LUA_TSTRING ? fal_describe(L, top) : fal_typename(L, top));
}

int fal_parse_dtype(lua_State *L, int idx, const char *what, fa_dtype *out) {
  const char *name = fal_cstring(L, idx);
  if (name && fa_dtype_parse(name, out) == 0) return 1; /* "bf16\0x" is no "bf16" */
  if (lua_type(L, idx) == LUA_TSTRING)
    return fal_error(L, "%s: expected one of f32, f16, bf16, f64, bool (or float, half, bfloat16, double), got %s",
                     what, fal_describe(L, idx));
  return fal_error(L, "%s: expected one of f32, f16, bf16, f64, bool (or float, half, bfloat16, double), got %s", what,
                   fal_typename(L, idx));
}

const char *fal_cstring(lua_State *L, int idx) {
  size_t len;
  const char *s = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &len) : NULL;
  return s && strlen(s) == len ? s : NULL;
}

int fal_parse_device(lua_State *L, int idx, const char *what, fa_device *out) {
  const char *name = fal_cstring(L, idx);
  if (name && fa_device_parse(name, out) == 0) {
    /* here, so that every device a script names is refused naming its argument, not
     * taken by the calls that only read figures (fa.memory("cuda") was {0, 0}) */
    if (!fa_backend_available(*out))
      return fal_error(L, "%s: device '%s' is not available (no usable GPU or no CUDA backend in this build)", what,
                       name);
    return 1;
  }
  if (fa_device_cuda_index(name) >= 0) {
    int cur = -1;
    fa_device_cuda_current(&cur);
    if (cur < 0) return fal_error(L, "%s: device '%s' is not available (no usable GPU)", what, name);
    return fal_error(L, "%s: device '%s' is not available: this version runs on one GPU, the current one (cuda:%d)",
                     what, name, cur);
  }
  if (lua_type(L, idx) == LUA_TSTRING)
    return fal_error(L, "%s: expected one of cpu, cuda, cuda:N, got %s", what, fal_describe(L, idx));
  return fal_error(L, "%s: expected one of cpu, cuda, cuda:N, got %s", what, fal_typename(L, idx));
}

int fal_opt_dtype(lua_State *L, int idx, const char *key, fa_dtype *out) {
  if (get(L, idx, key) == LUA_TNIL) return 0;
  lua_pushfstring(L, "opts.%s", key);
  fal_parse_dtype(L, -2, lua_tostring(L, -1), out);
  lua_pop(L, 2);
  return 1;
}

int fal_opt_device(lua_State *L, int idx, const char *key, fa_device *out) {
  if (get(L, idx, key) == LUA_TNIL) return 0;
  lua_pushfstring(L, "opts.%s", key);
  fal_parse_device(L, -2, lua_tostring(L, -1), out);
  lua_pop(L, 2);
  return 1;
}

fa_tensor *fal_opt_tensor(lua_State *L, int idx, const char *key, fal_pins *pins) {
  if (get(L, idx, key) == LUA_TNIL) return NULL;
  fal_box *b = fal_tobox(L, -1);
  if (!b) bad(L, key, FAL_TENSOR_MT);
  if (!b->t) fal_error(L, "opts.%s: tensor has been freed", key);
  if (pins->n == pins->cap) fal_error(L, "internal error: more than %d tensors pinned in one call", pins->cap);
  /* pinned: the value may come from an __index function (nothing else
   * keeps it alive), and later options may run code that frees it */
  fa_tensor *t = b->t;
  fa_tensor_retain(t);
  pins->t[pins->n++] = t;
  lua_pop(L, 1);
  return t;
}

static int64_t pair_elem(lua_State *L, const char *key, int i) {
  int isint;
  lua_rawgeti(L, -1, i);
  lua_Integer v = lua_tointegerx(L, -1, &isint);
  if (lua_type(L, -1) != LUA_TNUMBER || !isint)
    fal_error(L, "opts.%s[%d]: expected an integer, got %s", key, i,
              lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : fal_typename(L, -1));
  lua_pop(L, 1);
  return (int64_t)v;
}

/* A size a script wrote: its 0 is not the C API's 0, "the backend's
 * default" (which a script asks for by leaving the option out), but a size
 * the core rejects naming the valid range. */
static int64_t size_elem(lua_State *L, const char *key, int i) {
  int64_t v = pair_elem(L, key, i);
  return v == 0 ? FA_TILE_ZERO : v;
}

/* opts[key] as two integers; sizes: a 0 is a size the script wrote
 * (size_elem), else a value such as a window's width. */
static int read_pair(lua_State *L, int idx, const char *key, int64_t *a, int64_t *b, int sizes) {
  int tt = get(L, idx, key);
  if (tt == LUA_TNIL) return 0;
  if (tt != LUA_TTABLE) bad(L, key, "a table of 2 integers");
  if (lua_rawlen(L, -1) != 2)
    fal_error(L, "opts.%s: expected a table of 2 integers, got %d entries", key, (int)lua_rawlen(L, -1));
  *a = sizes ? size_elem(L, key, 1) : pair_elem(L, key, 1);
  *b = sizes ? size_elem(L, key, 2) : pair_elem(L, key, 2);
  lua_pop(L, 1);
  return 1;
}

int fal_opt_pair(lua_State *L, int idx, const char *key, int64_t *a, int64_t *b) {
  return read_pair(L, idx, key, a, b, 0);
}

int fal_opt_size_pair(lua_State *L, int idx, const char *key, int64_t *a, int64_t *b) {
  return read_pair(L, idx, key, a, b, 1);
}

int fal_opt_square(lua_State *L, int idx, const char *key, int64_t *n) {
  const int tt = get(L, idx, key);
  if (tt == LUA_TNIL) return 0;
  if (tt != LUA_TTABLE) {
    *n = pop_int(L, key); /* a number, or its error */
    return 1;
  }
  const lua_Unsigned len = lua_rawlen(L, -1);
  if (len < 1 || len > 2)
    fal_error(L, "opts.%s: square tiles: n, {n} or {n, n}, got a table of %d entries", key, (int)len);
  *n = pair_elem(L, key, 1);
  if (len == 2 && pair_elem(L, key, 2) != *n)
    fal_error(L, "opts.%s: square tiles: n, {n} or {n, n}, got two different sizes", key);
  lua_pop(L, 1);
  return 1;
}

/* The tensor in the box at vi, still alive, or an error. */
static fa_tensor *opt_live(lua_State *L, int vi, const char *key) {
  fal_box *b = fal_tobox(L, vi);
  if (!b || !b->t) fal_error(L, "opts.%s: tensor has been freed", key);
  return b->t;
}

double *fal_opt_numbers(lua_State *L, int idx, const char *key, int64_t *n) {
  idx = lua_absindex(L, idx);
  int tt = get(L, idx, key);
  if (tt == LUA_TNIL) return NULL;
  int vi = lua_gettop(L);
  double *buf;
  if (tt == LUA_TTABLE) {
    *n = (int64_t)lua_rawlen(L, vi);
    buf = (double *)fal_newbuffer(L, *n, sizeof *buf, key);
    for (int64_t i = 0; i < *n; i++) {
      if (lua_rawgeti(L, vi, (lua_Integer)i + 1) != LUA_TNUMBER)
        fal_error(L, "opts.%s[%I]: expected number, got %s", key, (lua_Integer)i + 1, fal_typename(L, -1));
      buf[i] = (double)lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
  } else {
    fal_box *b = fal_tobox(L, vi);
    if (!b) bad(L, key, "a table or a tensor of numbers");
    if (!b->t) fal_error(L, "opts.%s: tensor has been freed", key);
    if (fa_tensor_ndim(b->t) != 1) fal_error(L, "opts.%s: expected a 1-D tensor, got %d dimensions", key, fa_tensor_ndim(b->t));
    if (fa_tensor_dtype(b->t) == FA_BOOL) fal_error(L, "opts.%s: expected a tensor of numbers, got a bool tensor", key);
    fa_context *ctx = fal_ctx(L);
    *n = fa_tensor_numel(b->t);
    buf = (double *)fal_newbuffer(L, *n, sizeof *buf, key);
    /* the allocation may have run a finalizer that freed the tensor: look
     * again, here and on FAL_CALL's retry */
    FAL_CALL(L, ctx, fa_tensor_read_f64(ctx, opt_live(L, vi, key), buf));
  }
  lua_remove(L, vi); /* leave only the buffer */
  return buf;
}

void fal_opts_without(lua_State *L, int idx, const char *key) {
  idx = lua_absindex(L, idx);
  lua_newtable(L);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    const char *name = fal_cstring(L, -2);
    if (name && strcmp(name, key) == 0) {
      lua_pop(L, 1);
      continue;
    }
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, -4);
  }
  if (lua_getmetatable(L, idx)) lua_setmetatable(L, -2);
}
