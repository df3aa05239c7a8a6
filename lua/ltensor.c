/* The tensor userdata (metatable "flashattn.Tensor"), modelled on Lua's
 * liolib.c: a box holding one fa_tensor reference, NULL once freed;
 * __gc, __close and t:free() share one idempotent function; a freed
 * tensor raises an error on use instead of crashing.  This file has the
 * type itself, indexing, and the methods that describe, view, convert
 * and access elements. */
#include <stddef.h>
#include <string.h>

#include "lbinding.h"

/* ---- the box ------------------------------------------------------------ */

/* The addresses of these are this copy's registry keys for its metatables.
 * Two builds of the engine may be loaded into one state (flashattn-lua has
 * it linked in, and package.loadlib can open flashattn.so beside it): each
 * copy must only ever see its own boxes, whose tensors it alone can free. */
static const char tensor_mt_key = 0, pins_mt_key = 0;
/* the registry's spare pin list (FAL_MAX_PINS entries, empty), or false */
static const char pins_spare_key = 0;

/* The userdata at idx when its metatable is this copy's one under key. */
static void *toudata(lua_State *L, int idx, const void *key) {
  void *p = lua_touserdata(L, idx);
  if (!p || lua_type(L, idx) != LUA_TUSERDATA || !lua_getmetatable(L, idx)) return NULL;
  lua_rawgetp(L, LUA_REGISTRYINDEX, key);
  int ours = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return ours ? p : NULL;
}

/* Also its size and magic: the debug library can give the tensor metatable
 * to any userdata. */
fal_box *fal_tobox(lua_State *L, int idx) {
  fal_box *b = (fal_box *)toudata(L, idx, &tensor_mt_key);
  return b && lua_rawlen(L, idx) == sizeof *b && b->magic == fal_magic(b, FAL_MAGIC_TENSOR) ? b : NULL;
}

static void box_drop(fal_link *l) {
  fal_box *b = (fal_box *)((char *)l - offsetof(fal_box, link));
  fa_tensor *t = b->t;
  b->t = NULL;
  fa_tensor_release(t);
}

fa_tensor **fal_newbox(lua_State *L) {
  fal_state *s = fal_live_state(L); /* first: the state is older than every box */
  fal_gc_pressure(L);               /* before the new result: Lua cannot see tensor bytes */
  fal_tensor_metatable(L);
  fal_box *b = (fal_box *)lua_newuserdatauv(L, sizeof *b, 0);
  b->magic = fal_magic(b, FAL_MAGIC_TENSOR);
  b->t = NULL;
  fal_link_box(L, s, &b->link, box_drop);
  lua_insert(L, -2);
  lua_setmetatable(L, -2);
  return &b->t;
}

fa_tensor *fal_tensor(lua_State *L, int idx, const char *name) {
  fal_box *b = fal_tobox(L, idx);
  if (!b && lua_type(L, idx) == LUA_TUSERDATA && strcmp(fal_typename(L, idx), FAL_TENSOR_MT) == 0)
    fal_argerror(L, idx, name, "a " FAL_TENSOR_MT " of another copy of the flashattn module (another build of the "
                               "engine loaded in this lua_State): only its own copy can use it");
  if (!b) fal_typeerror(L, idx, name, FAL_TENSOR_MT);
  if (!b->t) fal_argerror(L, idx, name, "tensor has been freed");
  return b->t;
}

void fal_box_release(lua_State *L, int idx) {
  fal_box *b = fal_tobox(L, idx);
  if (b) box_drop(&b->link);
}

void fal_prefer_same(lua_State *L, int slot_idx, int orig_idx) {
  slot_idx = lua_absindex(L, slot_idx);
  orig_idx = lua_absindex(L, orig_idx);
  fal_box *slot = fal_tobox(L, slot_idx), *orig = fal_tobox(L, orig_idx);
  if (slot && orig && slot->t && slot->t == orig->t) {
    fa_tensor_release(slot->t); /* the extra reference the core handed out */
    slot->t = NULL;
    lua_pushvalue(L, orig_idx);
    lua_replace(L, slot_idx);
  }
}

/* ---- pins (see lbinding.h) -------------------------------------------------- */

/* __close and __gc (a coroutine that dies by an error leaves its
 * to-be-closed slots open: then the collector releases, or the state's
 * __gc when the pins were made while the state closed). */
static void pins_drop(fal_link *l) {
  fal_pins *p = (fal_pins *)((char *)l - offsetof(fal_pins, link));
  while (p->n > 0) {
    fa_tensor *t = p->t[--p->n];
    p->t[p->n] = NULL;
    fa_tensor_release(t);
  }
}

/* The pin list at idx, or NULL: this copy's metatable, its size and magic. */
static fal_pins *topins(lua_State *L, int idx) {
  fal_pins *p = (fal_pins *)toudata(L, idx, &pins_mt_key);
  if (!p || lua_rawlen(L, idx) < sizeof *p || p->magic != fal_magic(p, FAL_MAGIC_PINS) || p->cap < 0) return NULL;
  return lua_rawlen(L, idx) == sizeof *p + (size_t)p->cap * sizeof p->t[0] ? p : NULL;
}

/* Closed, a list of the usual size becomes the spare when there is none:
 * the next call takes it instead of a new userdata with a finalizer (a
 * userdata and its finalizer were a tenth of a tiny decode call's host
 * time, H200).  The registry's slot for it exists from the metatable's
 * making on (false when empty), so that storing into it allocates nothing. */
static int pins_close(lua_State *L) {
  fal_pins *p = topins(L, 1);
  if (p) {
    pins_drop(&p->link);
    /* not one whose __gc ran (a finalizer closing a dead coroutine's slot, or lua_close): its later pins
     * would have no backstop */
    if (p->cap == FAL_MAX_PINS && !p->gced && lua_rawgetp(L, LUA_REGISTRYINDEX, &pins_spare_key) == LUA_TBOOLEAN) {
      lua_pushvalue(L, 1);
      lua_rawsetp(L, LUA_REGISTRYINDEX, &pins_spare_key);
    }
  }
  return 0;
}

static int pins_gc(lua_State *L) {
  fal_pins *p = topins(L, 1);
  if (p) {
    pins_drop(&p->link);
    fal_unlink(&p->link);
    p->gced = 1;
  }
  return 0;
}

/* Pushes this copy's pin-list metatable (made, with the registry's empty
 * spare slot, by fal_pins_metatable_make when the module opens). */
static void pins_metatable(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &pins_mt_key) == LUA_TTABLE) return;
  lua_pop(L, 1);
  lua_pushboolean(L, 0);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &pins_spare_key);
  lua_createtable(L, 0, 4);
  fal_guard_metatable(L, "flashattn.Pins", pins_gc, pins_close);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &pins_mt_key);
}

void fal_pins_metatable_make(lua_State *L) {
  pins_metatable(L);
  lua_pop(L, 1);
}

fal_pins *fal_pins_open(lua_State *L) { return fal_pins_open_n(L, FAL_MAX_PINS); }

fal_pins *fal_pins_open_n(lua_State *L, int cap) {
  fal_state *s = fal_live_state(L);
  if (cap <= FAL_MAX_PINS) {
    cap = FAL_MAX_PINS;
    if (lua_rawgetp(L, LUA_REGISTRYINDEX, &pins_spare_key) == LUA_TUSERDATA) { /* taken: the slot empty again */
      fal_pins *p = (fal_pins *)lua_touserdata(L, -1);
      lua_pushboolean(L, 0);
      lua_rawsetp(L, LUA_REGISTRYINDEX, &pins_spare_key);
      if (!p->gced) { /* not finalized (lua_close finalizes the spare too) */
        lua_toclose(L, -1);
        return p;
      }
    }
    lua_pop(L, 1);
  }
  pins_metatable(L);
  fal_pins *p = (fal_pins *)lua_newuserdatauv(L, sizeof *p + (size_t)cap * sizeof p->t[0], 0);
  p->magic = fal_magic(p, FAL_MAGIC_PINS), p->n = 0, p->cap = cap, p->gced = 0;
  fal_link_box(L, s, &p->link, pins_drop);
  lua_insert(L, -2);
  lua_setmetatable(L, -2);
  lua_toclose(L, -1);
  return p;
}

void fal_pins_close(lua_State *L, int idx) { lua_closeslot(L, idx); }

fa_tensor *fal_pin(lua_State *L, fal_pins *pins, int idx, const char *name) {
  fa_tensor *t = fal_tensor(L, idx, name);
  if (pins->n == pins->cap) fal_error(L, "internal error: more than %d tensors pinned in one call", pins->cap);
  fa_tensor_retain(t);
  pins->t[pins->n++] = t;
  return t;
}

/* The box for fa_lua_push_tensor, made in protected mode: the reference
 * it takes over must be released when making the box raises. */
static int push_box(lua_State *L) {
  fa_tensor *t = (fa_tensor *)lua_touserdata(L, 1);
  *fal_newbox(L) = t;
  return 1;
}

FA_API void fa_lua_push_tensor(lua_State *L, fa_tensor *t) {
  if (!t) {
    lua_pushnil(L);
    return;
  }
  /* the reference first: making the box may run a finalizer that frees the
   * box t came from (fa_lua_push_tensor(L, fa_lua_check_tensor(L, -1))) */
  fa_tensor_retain(t);
  if (!lua_checkstack(L, 2)) {
    fa_tensor_release(t);
    lua_pushliteral(L, "flashattn: fa_lua_push_tensor: Lua stack overflow");
    lua_error(L);
  }
  lua_pushcfunction(L, push_box);
  lua_pushlightuserdata(L, t);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    fa_tensor_release(t);
    lua_error(L); /* the message is on top */
  }
}

FA_API fa_tensor *fa_lua_check_tensor(lua_State *L, int idx) { return fal_tensor(L, idx, NULL); }

/* __close and t:free(): drop the reference once. */
static int t_free(lua_State *L) {
  fal_box *b = fal_tobox(L, 1);
  if (!b) return fal_typeerror(L, 1, "self", FAL_TENSOR_MT);
  box_drop(&b->link);
  return 0;
}

/* __gc: the box goes, and leaves the state's list. */
static int t_gc(lua_State *L) {
  fal_box *b = fal_tobox(L, 1);
  if (b) {
    box_drop(&b->link);
    fal_unlink(&b->link);
  }
  return 0;
}

#define SELF(L) fal_tensor((L), 1, "self")

/* ---- description ---------------------------------------------------------- */

static int t_shape(lua_State *L) {
  fa_tensor *t = SELF(L);
  int64_t shape[FA_MAX_DIMS];
  int n = fa_tensor_ndim(t);
  for (int i = 0; i < n; i++) shape[i] = fa_tensor_size(t, i);
  lua_createtable(L, n, 0); /* may run a finalizer that frees t: the sizes are copied */
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, (lua_Integer)shape[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int t_size(lua_State *L) {
  if (lua_isnoneornil(L, 2)) return t_shape(L); /* Torch: t:size() is the whole shape */
  fa_tensor *t = SELF(L);
  int64_t d = fal_checkint(L, 2, "dim");
  if (d < 1 || d > fa_tensor_ndim(t))
    fal_error(L, "size: dimension %I out of range for a %d-D tensor", (lua_Integer)d, fa_tensor_ndim(t));
  lua_pushinteger(L, (lua_Integer)fa_tensor_size(t, (int)d - 1));
  return 1;
}

static int t_dim(lua_State *L) {
  lua_pushinteger(L, fa_tensor_ndim(SELF(L)));
  return 1;
}

static int t_numel(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)fa_tensor_numel(SELF(L)));
  return 1;
}

static int t_len(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)fa_tensor_size(SELF(L), 0));
  return 1;
}

static int t_dtype(lua_State *L) {
  lua_pushstring(L, fa_dtype_name(fa_tensor_dtype(SELF(L))));
  return 1;
}

static int t_device(lua_State *L) {
  lua_pushstring(L, fa_device_name(fa_tensor_device(SELF(L))));
  return 1;
}

static int t_is_contiguous(lua_State *L) {
  lua_pushboolean(L, fa_tensor_is_contiguous(SELF(L)));
  return 1;
}

/* ---- conversions ------------------------------------------------------------ */

/* A converted copy, or t itself when nothing changes. */
static int convert(lua_State *L, fa_dtype dtype, fa_device device) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 1);
  fa_tensor **r = fal_newbox(L);
  FAL_CALL(L, ctx, fa_tensor_to(ctx, SELF(L), dtype, device, r));
  fal_prefer_same(L, -1, 1);
  return 1;
}

/* t:to(x [, y]): each of x, y a dtype or a device name. */
static int t_to(lua_State *L) {
  fa_tensor *t = SELF(L);
  fa_dtype dtype = fa_tensor_dtype(t);
  fa_device device = fa_tensor_device(t);
  int n = lua_gettop(L);
  if (n < 2) fal_typeerror(L, 2, "x", "a dtype or device name");
  for (int i = 2; i <= n && i <= 3; i++) {
    if (lua_type(L, i) != LUA_TSTRING) fal_typeerror(L, i, "x", "a dtype or device name");
    const char *s = fal_cstring(L, i); /* NULL: a NUL byte, which fal_describe shows */
    if (s && fa_device_cuda_index(s) >= 0) fal_parse_device(L, i, fal_arglabel(L, i, "x"), &device); /* cuda:N */
    if (!s || (fa_dtype_parse(s, &dtype) != 0 && fa_device_parse(s, &device) != 0))
      fal_argerror(L, i, "x",
                   "expected a dtype (f32, f16, bf16, f64, bool, or float, half, bfloat16, double) or a device "
                   "(cpu, cuda, cuda:N), got %s",
                   fal_describe(L, i));
  }
  return convert(L, dtype, device);
}

static int t_cpu(lua_State *L) { return convert(L, fa_tensor_dtype(SELF(L)), FA_CPU); }
/* t:cuda([n]): n, PyTorch's device index, names the current GPU or is an error */
static int t_cuda(lua_State *L) {
  SELF(L);
  if (!lua_isnoneornil(L, 2)) {
    const lua_Integer n = fal_checkint(L, 2, "device");
    const char *label = fal_arglabel(L, 2, "device");
    if (n < 0 || n > INT32_MAX) fal_error(L, "%s: expected a GPU index from 0, got %I", label, n);
    lua_pushfstring(L, "cuda:%I", n);
    fa_device d;
    fal_parse_device(L, -1, label, &d);
    lua_settop(L, 1);
  }
  return convert(L, fa_tensor_dtype(SELF(L)), FA_CUDA);
}
static int t_float(lua_State *L) { return convert(L, FA_F32, fa_tensor_device(SELF(L))); }
static int t_half(lua_State *L) { return convert(L, FA_F16, fa_tensor_device(SELF(L))); }
static int t_bf16(lua_State *L) { return convert(L, FA_BF16, fa_tensor_device(SELF(L))); }
static int t_double(lua_State *L) { return convert(L, FA_F64, fa_tensor_device(SELF(L))); }

static int t_clone(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 1);
  fa_tensor **r = fal_newbox(L);
  FAL_CALL(L, ctx, fa_tensor_clone(ctx, SELF(L), r));
  return 1;
}

static int t_contiguous(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 1);
  fa_tensor **r = fal_newbox(L);
  FAL_CALL(L, ctx, fa_tensor_contiguous(ctx, SELF(L), r));
  fal_prefer_same(L, -1, 1);
  return 1;
}

static int t_copy_(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  SELF(L);
  fal_tensor(L, 2, "src");
  FAL_CALL(L, ctx, fa_tensor_copy(ctx, SELF(L), fal_tensor(L, 2, "src")));
  lua_settop(L, 1);
  return 1;
}

static int t_fill_(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  SELF(L);
  double v = fal_checkvalue(L, 2, "value");
  FAL_CALL(L, ctx, fa_tensor_fill(ctx, SELF(L), v));
  lua_settop(L, 1);
  return 1;
}

/* ---- elements ---------------------------------------------------------------- */

/* Reads the 1-based indices at first..first+ndim-1 into 0-based idx. */
static void read_index(lua_State *L, fa_tensor *t, int first, int given, const char *what, int64_t *idx) {
  int nd = fa_tensor_ndim(t);
  if (given != nd)
    fal_error(L, "%s: expected %d %s for a %d-D tensor, got %d", what, nd, nd == 1 ? "index" : "indices", nd, given);
  for (int i = 0; i < nd; i++) idx[i] = fal_checkindex(L, first + i, "index");
}

static int t_get(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_tensor *t = SELF(L);
  int64_t idx[FA_MAX_DIMS];
  double v;
  read_index(L, t, 2, lua_gettop(L) - 1, "get", idx);
  FAL_CALL(L, ctx, fa_tensor_get(ctx, SELF(L), idx, &v));
  lua_pushnumber(L, (lua_Number)v);
  return 1;
}

static int t_set(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_tensor *t = SELF(L);
  int64_t idx[FA_MAX_DIMS];
  int n = lua_gettop(L);
  if (n < 2) fal_error(L, "set: expected indices and a value");
  if (n - 2 != fa_tensor_ndim(t)) /* count the value in: t:set(1, 1, 1) on a 3-D tensor lacks the value */
    fal_error(L, "set: expected %d %s and a value for a %d-D tensor (%d arguments), got %d argument%s",
              fa_tensor_ndim(t), fa_tensor_ndim(t) == 1 ? "index" : "indices", fa_tensor_ndim(t),
              fa_tensor_ndim(t) + 1, n - 1, n - 1 == 1 ? "" : "s");
  read_index(L, t, 2, n - 2, "set", idx);
  double v = fal_checkvalue(L, n, "value");
  FAL_CALL(L, ctx, fa_tensor_set(ctx, SELF(L), idx, v));
  lua_settop(L, 1);
  return 1;
}

/* t[i]: the key as a 0-based index, or an error for a non-integral number. */
static int64_t key_index(lua_State *L) {
  int isint;
  lua_Integer i = lua_tointegerx(L, 2, &isint);
  if (!isint) fal_error(L, "tensor index: expected an integer, got %f", (double)lua_tonumber(L, 2));
  if (i < 1) fal_error(L, "tensor index: expected an index >= 1, got %I", i);
  return (int64_t)i - 1;
}

/* __index: methods by name, t[i] by integer (1-D: the number; N-D: the
 * view of the sub-tensor, as Torch7 does).  An integer i outside 1..#t reads
 * nil, at every rank, as a Lua sequence does: `ipairs(t)` visits every
 * element (1-D) or sub-tensor (N-D) and stops.  A key that is a number but
 * not an integer stays an error, and so does a write past the end
 * (t_newindex), as does any use of a freed tensor. */
static int t_index(lua_State *L) {
  if (lua_type(L, 2) == LUA_TUSERDATA && fal_trace_index(L)) return 1; /* slopes[h] while tracing (API §9) */
  if (lua_type(L, 2) != LUA_TNUMBER) {
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    return 1;
  }
  fa_tensor *self = SELF(L);
  int isint;
  lua_Integer key = lua_tointegerx(L, 2, &isint);
  if (!isint) fal_error(L, "tensor index: expected an integer, got %f", (double)lua_tonumber(L, 2));
  if (key < 1 || key > fa_tensor_size(self, 0)) {
    lua_pushnil(L);
    return 1;
  }
  fa_context *ctx = fal_ctx(L);
  if (fa_tensor_ndim(self) == 1) {
    int64_t i = key_index(L);
    double v;
    FAL_CALL(L, ctx, fa_tensor_get(ctx, SELF(L), &i, &v));
    lua_pushnumber(L, (lua_Number)v);
    return 1;
  }
  fa_tensor **r = fal_newbox(L);
  FAL_CALL(L, ctx, fa_tensor_select(ctx, SELF(L), 0, key_index(L), r));
  return 1;
}

/* pairs(t) walks t as ipairs(t) does (1-D: i, the number; N-D: i, the view
 * of sub-tensor i), so that a loop written for a Lua array takes a tensor
 * (without it: Lua's "bad argument #1 to 'for iterator'"). */
static int t_pairs_next(lua_State *L) {
  const lua_Integer i = luaL_checkinteger(L, 2) + 1;
  lua_pushinteger(L, i);
  if (lua_geti(L, 1, i) != LUA_TNIL) return 2; /* t_index: nil past the end */
  lua_pushnil(L);
  return 1;
}
static int t_pairs(lua_State *L) {
  (void)SELF(L); /* a freed tensor is an error here, not at the first step */
  lua_pushcfunction(L, t_pairs_next);
  lua_pushvalue(L, 1);
  lua_pushinteger(L, 0);
  return 3;
}

/* t(...): Lua's "attempt to call a flashattn.Tensor value" as a flashattn: error. */
static int t_call(lua_State *L) {
  return fal_error(L, "tensor: a tensor is not callable (read elements with t[i], t:get or t:totable, "
                      "sub-tensors with t[i], select or narrow)");
}

/* __newindex: t[i] = v sets an element of a 1-D tensor; for N-D, a number
 * fills the sub-tensor and a tensor is copied into it (Torch7). */
static int t_newindex(lua_State *L) {
  if (lua_type(L, 2) != LUA_TNUMBER) /* the key described without its metamethods */
    return fal_error(L, "tensor index: expected an integer, got %s (a " FAL_TENSOR_MT " has no fields to assign)",
                     fal_describe(L, 2));
  fa_context *ctx = fal_ctx(L);
  if (fa_tensor_ndim(SELF(L)) == 1) {
    int64_t i = key_index(L);
    double v = fal_checkvalue(L, 3, "value");
    FAL_CALL(L, ctx, fa_tensor_set(ctx, SELF(L), &i, v));
    return 0;
  }
  fa_tensor **r = fal_newbox(L);
  int ri = lua_gettop(L);
  FAL_CALL(L, ctx, fa_tensor_select(ctx, SELF(L), 0, key_index(L), r));
  if (fal_tobox(L, 3)) {
    FAL_CALL(L, ctx, fa_tensor_copy(ctx, *r, fal_tensor(L, 3, "value")));
  } else {
    double v = fal_checkvalue(L, 3, "value");
    FAL_CALL(L, ctx, fa_tensor_fill(ctx, *r, v));
  }
  fal_box_release(L, ri);
  return 0;
}

/* ---- views ------------------------------------------------------------------- */

static int t_view(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  int64_t shape[FA_MAX_DIMS];
  int n = lua_gettop(L);
  int nd = fal_read_shape(L, 2, n, shape, "shape");
  fa_tensor **r = fal_newbox(L);
  FAL_CALL(L, ctx, fa_tensor_view(ctx, SELF(L), nd, shape, r));
  return 1;
}

/* A view when the strides allow it, else a view of a contiguous copy. */
static int t_reshape(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  int64_t shape[FA_MAX_DIMS];
  int n = lua_gettop(L);
  int nd = fal_read_shape(L, 2, n, shape, "shape");
  SELF(L);
  fa_tensor **r = fal_newbox(L);
  FAL_CALL(L, ctx, fa_tensor_reshape(ctx, SELF(L), nd, shape, r));
  return 1;
}

static int t_select(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 3); /* the result box must not take an absent argument's place */
  fa_tensor **r = fal_newbox(L);
  int dim = fal_dim0(fal_checkint(L, 2, "dim"));
  int64_t i = fal_checkindex(L, 3, "index");
  FAL_CALL(L, ctx, fa_tensor_select(ctx, SELF(L), dim, i, r));
  return 1;
}

static int t_narrow(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 4); /* the result box must not take an absent argument's place */
  fa_tensor **r = fal_newbox(L);
  int dim = fal_dim0(fal_checkint(L, 2, "dim"));
  int64_t start = fal_checkindex(L, 3, "start");
  int64_t len = fal_checkint(L, 4, "length");
  FAL_CALL(L, ctx, fa_tensor_narrow(ctx, SELF(L), dim, start, len, r));
  return 1;
}

/* t:transpose(d1, d2); a 2-D tensor may omit them (Torch's t:t()). */
static int t_transpose(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 3); /* the result box must not take an absent argument's place */
  fa_tensor **r = fal_newbox(L);
  int d1 = 0, d2 = 1;
  if (!lua_isnoneornil(L, 2) || fa_tensor_ndim(SELF(L)) != 2) {
    d1 = fal_dim0(fal_checkint(L, 2, "dim1"));
    d2 = fal_dim0(fal_checkint(L, 3, "dim2"));
  }
  FAL_CALL(L, ctx, fa_tensor_transpose(ctx, SELF(L), d1, d2, r));
  return 1;
}

/* ---- totable ------------------------------------------------------------------ */

static void build_table(lua_State *L, const double *v, const int64_t *shape, int nd, int d, int64_t *pos) {
  luaL_checkstack(L, 2, "totable");
  lua_createtable(L, shape[d] > 0x7fffffff ? 0 : (int)shape[d], 0);
  for (int64_t i = 0; i < shape[d]; i++) {
    if (d == nd - 1) lua_pushnumber(L, (lua_Number)v[(*pos)++]);
    else build_table(L, v, shape, nd, d + 1, pos);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

static int t_totable(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_tensor *t = SELF(L);
  int64_t shape[FA_MAX_DIMS], pos = 0;
  int nd = fa_tensor_ndim(t);
  for (int i = 0; i < nd; i++) shape[i] = fa_tensor_size(t, i);
  double *v = (double *)fal_newbuffer(L, fa_tensor_numel(t), sizeof *v, "totable");
  FAL_CALL(L, ctx, fa_tensor_read_f64(ctx, SELF(L), v)); /* t may be freed by now */
  build_table(L, v, shape, nd, 0, &pos);
  return 1;
}

/* ---- the metatable ------------------------------------------------------------ */

static const luaL_Reg methods[] = {
    {"shape", t_shape},       {"size", t_size},
    {"dim", t_dim},           {"numel", t_numel},
    {"dtype", t_dtype},       {"device", t_device},
    {"to", t_to},             {"cpu", t_cpu},
    {"cuda", t_cuda},         {"float", t_float},
    {"half", t_half},         {"bf16", t_bf16},
    {"double", t_double},     {"clone", t_clone},
    {"copy_", t_copy_},       {"fill_", t_fill_},
    {"get", t_get},           {"set", t_set},
    {"view", t_view},         {"reshape", t_reshape},
    {"select", t_select},     {"narrow", t_narrow},
    {"transpose", t_transpose}, {"contiguous", t_contiguous},
    {"is_contiguous", t_is_contiguous}, {"totable", t_totable},
    {"free", t_free},         {NULL, NULL}};

static const luaL_Reg meta[] = {{"__gc", t_gc},         {"__close", t_free}, {"__len", t_len},
                                {"__newindex", t_newindex}, {"__tostring", fal_tensor_tostring},
                                {"__pairs", t_pairs},       {"__call", t_call},  {NULL, NULL}};

void fal_tensor_metatable(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &tensor_mt_key) == LUA_TTABLE) return;
  lua_pop(L, 1);
  /* registry[FAL_TENSOR_MT] but not ours: another copy owns this state */
  if (luaL_getmetatable(L, FAL_TENSOR_MT) != LUA_TNIL)
    fal_error(L, "another copy of the flashattn module (another build of the engine) is already loaded in this "
                 "lua_State; a state can hold only one");
  lua_pop(L, 1);
  luaL_newmetatable(L, FAL_TENSOR_MT); /* sets __name */
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &tensor_mt_key);
  /* getmetatable(t) gives this string: a script that could reach the table
   * might remove __gc (every later tensor would leak) or call __gc itself */
  lua_pushliteral(L, FAL_TENSOR_MT);
  lua_setfield(L, -2, "__metatable");
  luaL_setfuncs(L, meta, 0);
  luaL_setfuncs(L, fal_tensor_op_meta, 0);
  fal_tensor_unsupported_ops(L);
  /* __index: a closure over the methods table so that integer keys work too */
  lua_createtable(L, 0, 48);
  luaL_setfuncs(L, methods, 0);
  luaL_setfuncs(L, fal_tensor_op_methods, 0);
  lua_pushcclosure(L, t_index, 1);
  lua_setfield(L, -2, "__index");
}
