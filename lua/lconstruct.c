/* Tensor constructors: fa.tensor (nested tables), fa.zeros, fa.ones,
 * fa.full, fa.rand, fa.randn, fa.arange; and the shape reader shared with
 * t:view/t:reshape.  A shape is numbers (fa.zeros(2, 3)) or one table of
 * numbers (fa.zeros({2, 3})); an optional last table holds the options. */
#include "lbinding.h"

static int shape_error(lua_State *L, const char *name, lua_Integer nd) {
  return fal_error(L, "%s: expected 1 to %d dimensions, got %I", name, FA_MAX_DIMS, nd);
}

static int64_t shape_elem(lua_State *L, int t, int i) {
  int isint;
  lua_rawgeti(L, t, i);
  lua_Integer v = lua_tointegerx(L, -1, &isint);
  if (lua_type(L, -1) != LUA_TNUMBER || !isint)
    fal_error(L, "shape[%d]: expected an integer, got %s", i,
              lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : fal_typename(L, -1));
  lua_pop(L, 1);
  return (int64_t)v;
}

/* A key of table t other than the integers 1..n, described (never by its
 * __tostring), or NULL when there is none. */
static const char *stray_key(lua_State *L, int t, int64_t n) {
  lua_pushnil(L);
  while (lua_next(L, t)) {
    lua_pop(L, 1);
    int isint;
    lua_Integer k = lua_tointegerx(L, -1, &isint);
    if (lua_type(L, -1) != LUA_TNUMBER || !isint || k < 1 || k > n) return fal_describe(L, -1);
  }
  return NULL;
}

/* A shape table holds its sizes at 1..n and nothing else: {2, 3, dtype =
 * "f16"} is an error, not a silently ignored option. */
static void check_shape_keys(lua_State *L, int t, int64_t n, const char *name) {
  const char *shown = stray_key(L, t, n);
  if (shown) fal_error(L, "%s: unexpected key %s in the shape table (options go in a separate last table)", name, shown);
}

int fal_read_shape(lua_State *L, int first, int last, int64_t shape[FA_MAX_DIMS], const char *name) {
  if (first <= last && lua_type(L, first) == LUA_TTABLE) {
    if (last > first) fal_argerror(L, first + 1, NULL, "unexpected argument after the %s table", name);
    int64_t n = (int64_t)lua_rawlen(L, first);
    check_shape_keys(L, first, n, name);
    if (n < 1 || n > FA_MAX_DIMS) shape_error(L, name, (lua_Integer)n);
    for (int i = 0; i < (int)n; i++) shape[i] = shape_elem(L, first, i + 1);
    return (int)n;
  }
  int n = last - first + 1;
  if (n < 1 && !lua_isnoneornil(L, first)) fal_typeerror(L, first, name, "numbers or a table of numbers");
  if (n < 1 || n > FA_MAX_DIMS) shape_error(L, name, n < 0 ? 0 : n);
  for (int i = 0; i < n; i++) shape[i] = fal_checkint(L, first + i, name);
  return n;
}

/* ---- argument layout and options ----------------------------------------- */

typedef struct {
  int nd;
  int64_t shape[FA_MAX_DIMS];
  int value_idx; /* fa.full's value, else 0 */
  int opts_idx;
  fa_dtype dtype;
  fa_device device;
  int has_dtype; /* opts.dtype given */
  int has_seed;
  int64_t seed;
} ctor_args;

/* API §1: every constructor's opts are {dtype=, device=, seed=}; seed is checked everywhere, used by rand and randn */
static const char *const ctor_opts[] = {"dtype", "device", "seed", NULL};

static void read_opts(lua_State *L, ctor_args *a, const char *fname, const char *const *allowed) {
  int n = lua_gettop(L);
  if (n > a->opts_idx) fal_argerror(L, a->opts_idx + 1, NULL, "unexpected argument to %s", fname);
  a->dtype = FA_F32;
  a->device = fa_context_device(fal_ctx(L));
  a->has_dtype = a->has_seed = 0;
  if (!fal_opts(L, a->opts_idx, fname, allowed)) return;
  a->has_dtype = fal_opt_dtype(L, a->opts_idx, "dtype", &a->dtype);
  fal_opt_device(L, a->opts_idx, "device", &a->device);
  a->has_seed = fal_opt_int(L, a->opts_idx, "seed", &a->seed);
}

/* shape..., [value], [opts]: for fa.full the last number of a numeric
 * shape is the value (fa.full(2, 3, 7) is 2x3 of 7), unless a boolean
 * value follows the numbers. */
static void split_args(lua_State *L, ctor_args *a, int has_value, const char *fname) {
  int n = lua_gettop(L), shape_last;
  if (lua_type(L, 1) == LUA_TTABLE) {
    shape_last = 1;
  } else {
    int i = 1;
    while (i <= n && lua_type(L, i) == LUA_TNUMBER) i++;
    shape_last = i - 1;
    if (has_value && !(i <= n && lua_type(L, i) == LUA_TBOOLEAN)) shape_last--;
  }
  if (shape_last < 1 && has_value) {
    /* name what stands where the value should: fa.full(2, "x"), but not fa.full("x"), which has no shape */
    const int at = lua_type(L, 1) == LUA_TTABLE ? 2 : shape_last + 2;
    if (at >= 2 && at <= n && lua_type(L, at) != LUA_TNUMBER && lua_type(L, at) != LUA_TBOOLEAN)
      fal_error(L, "%s: argument #%d (value): expected a number or boolean, got %s", fname, at, fal_typename(L, at));
    fal_error(L, "%s: expected a shape (numbers or a table) and a value", fname);
  }
  a->nd = fal_read_shape(L, 1, shape_last, a->shape, "shape");
  a->value_idx = has_value ? shape_last + 1 : 0;
  a->opts_idx = shape_last + 1 + (has_value ? 1 : 0);
}

/* Pushes a new uninitialised tensor for the arguments. */
static fa_tensor *new_tensor(lua_State *L, fa_context *ctx, const ctor_args *a) {
  fa_tensor **r = fal_newbox(L);
  FAL_CALL(L, ctx, fa_tensor_empty(ctx, a->nd, a->shape, a->dtype, a->device, r));
  return *r;
}

static int filled(lua_State *L, double value, int has_value, const char *fname) {
  ctor_args a;
  split_args(L, &a, has_value, fname);
  if (has_value) value = fal_checkvalue(L, a.value_idx, "value");
  read_opts(L, &a, fname, ctor_opts);
  if (has_value && lua_type(L, a.value_idx) == LUA_TBOOLEAN && !a.has_dtype) a.dtype = FA_BOOL;
  fa_context *ctx = fal_ctx(L);
  fa_tensor *t = new_tensor(L, ctx, &a);
  FAL_CALL(L, ctx, fa_tensor_fill(ctx, t, value));
  return 1;
}

static int l_zeros(lua_State *L) { return filled(L, 0.0, 0, "fa.zeros"); }
static int l_ones(lua_State *L) { return filled(L, 1.0, 0, "fa.ones"); }
static int l_full(lua_State *L) { return filled(L, 0.0, 1, "fa.full"); }

static int random_fill(lua_State *L, fa_fill_kind kind, const char *fname) {
  ctor_args a;
  split_args(L, &a, 0, fname);
  read_opts(L, &a, fname, ctor_opts);
  if (a.dtype == FA_BOOL) fal_error(L, "%s: opts.dtype: expected a float dtype (f32, f16, bf16, f64), got bool", fname);
  uint64_t seed = a.has_seed ? (uint64_t)a.seed : fal_next_seed(L);
  fa_context *ctx = fal_ctx(L);
  fa_tensor *t = new_tensor(L, ctx, &a);
  FAL_CALL(L, ctx, fa_tensor_fill_random(ctx, t, kind, seed));
  return 1;
}

static int l_rand(lua_State *L) { return random_fill(L, FA_FILL_UNIFORM, "fa.rand"); }
static int l_randn(lua_State *L) { return random_fill(L, FA_FILL_NORMAL, "fa.randn"); }

static int l_arange(lua_State *L) {
  ctor_args a;
  a.nd = 1;
  a.shape[0] = fal_checkint(L, 1, "n");
  a.value_idx = 0;
  a.opts_idx = 2;
  read_opts(L, &a, "fa.arange", ctor_opts);
  fa_context *ctx = fal_ctx(L);
  fa_tensor *t = new_tensor(L, ctx, &a);
  FAL_CALL(L, ctx, fa_tensor_fill_random(ctx, t, FA_FILL_ARANGE, 0));
  return 1;
}

/* ---- fa.tensor(nested_table, opts) ------------------------------------------ */

/* At most 2^27 elements from a nested table (README "Reliability"): a table
 * whose rows are shared can claim any shape from a few KiB (four levels of
 * one 1024-wide row: 2^40 elements), and a walk of that is endless.  A Lua
 * table of 2^27 distinct numbers takes 2 GiB of heap; no script builds a
 * larger one. */
#define TABLE_MAX_ELEMS ((int64_t)1 << 27)
/* elements written to the tensor at a time; the host is polled between */
#define CHUNK ((int64_t)1 << 16)

typedef struct {
  int nd;
  int64_t shape[FA_MAX_DIMS];
  int64_t path[FA_MAX_DIMS];
  int kind;      /* LUA_TNUMBER or LUA_TBOOLEAN: the first element's, LUA_TNONE when empty */
  double *chunk; /* CHUNK values (fewer for a small tensor) on their way to `flat` */
  int64_t fill, done, cap;
  fa_context *ctx;
  fa_tensor *flat;  /* the new tensor as one dimension */
  fa_tensor **part; /* a box (at part_idx) for the slice of `flat` being written */
  int part_idx;
} nest;

/* Pushes the position "[i][j]" of depth `depth`. */
static const char *path_str(lua_State *L, const nest *s, int depth) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; i < depth; i++) {
    lua_pushfstring(L, "[%I]", (lua_Integer)s->path[i]);
    luaL_addvalue(&b);
  }
  luaL_pushresult(&b);
  return lua_tostring(L, -1);
}

/* Writes the values gathered so far into their slice of the tensor. */
static void flush(lua_State *L, nest *s) {
  if (s->fill == 0) return;
  FAL_CALL(L, s->ctx, fa_tensor_narrow(s->ctx, s->flat, 0, s->done, s->fill, s->part));
  FAL_CALL(L, s->ctx, fa_tensor_write_f64(s->ctx, *s->part, s->chunk));
  fal_box_release(L, s->part_idx);
  s->done += s->fill;
  s->fill = 0;
  fal_poll(L);
}

/* Walks the table on top of the stack, at depth d, checking it is a
 * rectangular array of numbers or booleans and storing its values.  Each
 * level's length is checked against the shape, so the walk visits at most
 * the shape's element count. */
static void walk(lua_State *L, nest *s, int d) {
  if (d >= FA_MAX_DIMS) return; /* never: bounds the recursion for the compiler */
  int t = lua_gettop(L);
  int64_t n = (int64_t)lua_rawlen(L, t);
  if (n != s->shape[d])
    fal_error(L, "fa.tensor: ragged table at %s: expected %I elements, got %I", path_str(L, s, d),
              (lua_Integer)s->shape[d], (lua_Integer)n);
  luaL_checkstack(L, 4, "fa.tensor");
  /* its elements at 1..n and nothing else: a hole past the border, or a
   * key such as x = 3, would otherwise be dropped without a word */
  const char *shown = stray_key(L, t, n);
  if (shown)
    fal_error(L, "fa.tensor: ragged table at %s: key %s outside its elements 1..%I", d ? path_str(L, s, d) : "the top",
              shown, (lua_Integer)n);
  for (int64_t i = 1; i <= n; i++) {
    s->path[d] = i;
    int tt = lua_rawgeti(L, t, (lua_Integer)i);
    if (d < s->nd - 1 && d + 1 < FA_MAX_DIMS) { /* (nd <= FA_MAX_DIMS: the second test is for the compiler) */
      if (tt != LUA_TTABLE)
        fal_error(L, "fa.tensor: ragged table at %s: expected a table of %I elements, got %s", path_str(L, s, d + 1),
                  (lua_Integer)s->shape[d + 1], fal_typename(L, -1));
      walk(L, s, d + 1);
    } else {
      if (tt == LUA_TTABLE)
        fal_error(L, "fa.tensor: ragged table at %s: expected a number, got a table", path_str(L, s, d + 1));
      if (tt != LUA_TNUMBER && tt != LUA_TBOOLEAN)
        fal_error(L, "fa.tensor: element %s: expected number or boolean, got %s", path_str(L, s, d + 1),
                  fal_typename(L, -1));
      if (tt != s->kind)
        fal_error(L, "fa.tensor: element %s: expected %s like the first element, got %s", path_str(L, s, d + 1),
                  lua_typename(L, s->kind), lua_typename(L, tt));
      s->chunk[s->fill++] = tt == LUA_TBOOLEAN ? (double)lua_toboolean(L, -1) : (double)lua_tonumber(L, -1);
      if (s->fill == s->cap) flush(L, s);
    }
    lua_pop(L, 1);
  }
}

static int too_many(lua_State *L, const nest *s) {
  lua_pushliteral(L, "");
  for (int j = 0; j < s->nd; j++) lua_pushfstring(L, j ? "x%I" : "%I", (lua_Integer)s->shape[j]);
  lua_concat(L, s->nd + 1);
  return fal_argerror(L, 1, "data", "a table of shape %s holds more than the %I elements fa.tensor takes",
                      lua_tostring(L, -1), (lua_Integer)TABLE_MAX_ELEMS);
}

static int l_tensor(lua_State *L) {
  if (!lua_istable(L, 1)) fal_typeerror(L, 1, "data", "a (nested) table of numbers or booleans");
  nest s = {0};
  s.kind = LUA_TNONE;
  /* the shape from the first element at each depth, and the first element's type */
  lua_pushvalue(L, 1);
  while (lua_type(L, -1) == LUA_TTABLE) {
    if (s.nd == FA_MAX_DIMS) fal_error(L, "fa.tensor: more than %d levels of nesting (at most %d dimensions)", FA_MAX_DIMS, FA_MAX_DIMS);
    int64_t n = (int64_t)lua_rawlen(L, -1);
    s.shape[s.nd++] = n;
    if (n == 0) break;
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
  }
  if (lua_type(L, -1) == LUA_TNUMBER || lua_type(L, -1) == LUA_TBOOLEAN) s.kind = lua_type(L, -1);
  lua_pop(L, 1);

  /* the element count from the shape, before any walk */
  int64_t numel = 1;
  for (int i = 0; i < s.nd; i++)
    if (s.shape[i] == 0) numel = 0;
  for (int i = 0; i < s.nd && numel > 0; i++) {
    if (s.shape[i] > TABLE_MAX_ELEMS / numel) too_many(L, &s);
    numel *= s.shape[i];
  }

  ctor_args a;
  a.nd = s.nd;
  for (int i = 0; i < s.nd; i++) a.shape[i] = s.shape[i];
  a.value_idx = 0;
  a.opts_idx = 2;
  read_opts(L, &a, "fa.tensor", ctor_opts);
  if (s.kind == LUA_TBOOLEAN && !a.has_dtype) a.dtype = FA_BOOL; /* booleans make a mask */

  /* the tensor first: past the memory limit the call fails before any walk */
  lua_settop(L, 2);
  s.ctx = fal_ctx(L);
  fa_tensor *t = new_tensor(L, s.ctx, &a); /* 3: only this call holds it */
  fa_tensor **flat = fal_newbox(L);          /* 4 */
  if (numel > 0) FAL_CALL(L, s.ctx, fa_tensor_view(s.ctx, t, 1, &numel, flat));
  s.flat = *flat;
  s.part = fal_newbox(L); /* 5 */
  s.part_idx = 5;
  s.cap = numel < CHUNK ? numel : CHUNK;
  s.chunk = (double *)fal_newbuffer(L, s.cap, sizeof(double), "fa.tensor"); /* 6 */
  lua_pushvalue(L, 1);
  walk(L, &s, 0);
  lua_pop(L, 1);
  flush(L, &s);
  fal_box_release(L, 4);
  lua_settop(L, 3);
  return 1;
}

const luaL_Reg fal_construct_funcs[] = {{"tensor", l_tensor}, {"zeros", l_zeros}, {"ones", l_ones},
                                        {"full", l_full},     {"rand", l_rand},   {"randn", l_randn},
                                        {"arange", l_arange}, {NULL, NULL}};
