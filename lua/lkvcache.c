/* fa.kv_cache{...} (API §8): the paged KV cache of the C API
 * (fa_kv_cache_*) as a Lua object with append, attend, lengths, reset,
 * info and free (also __close and __gc).  Any use after free is a
 * "flashattn:" error.  The cache pointer is taken from its box inside each
 * core call's own expression: a finalizer or an opts __index may free the
 * cache while the arguments are read, and FAL_CALL's retry after a
 * collection takes it again. */
#include <stddef.h>
#include <string.h>

#include "lbinding.h"

#define FAL_KVCACHE_MT "flashattn.KVCache"

typedef struct {
  uint64_t magic; /* fal_magic(box, FAL_MAGIC_KVCACHE) */
  fa_kv_cache *c; /* NULL once freed */
  fal_link link;  /* fal_link_box's */
} fal_kvbox;

/* The cache box at idx, or NULL: its metatable, size and magic (the debug
 * library can give the metatable to any userdata). */
static fal_kvbox *kv_testbox(lua_State *L, int idx) {
  fal_kvbox *b = (fal_kvbox *)luaL_testudata(L, idx, FAL_KVCACHE_MT);
  return b && lua_rawlen(L, idx) == sizeof *b && b->magic == fal_magic(b, FAL_MAGIC_KVCACHE) ? b : NULL;
}

static void kv_drop(fal_link *l) {
  fal_kvbox *b = (fal_kvbox *)((char *)l - offsetof(fal_kvbox, link));
  fa_kv_cache *c = b->c;
  b->c = NULL;
  fa_kv_cache_destroy(c);
}

static fal_kvbox *kv_box(lua_State *L, int idx) {
  fal_kvbox *b = kv_testbox(L, idx);
  if (!b) fal_typeerror(L, idx, "self", FAL_KVCACHE_MT);
  return b;
}

/* The live cache at index 1. */
static fa_kv_cache *kv_self(lua_State *L) {
  fal_kvbox *b = kv_box(L, 1);
  if (!b->c) fal_error(L, "kv_cache: the cache has been freed");
  return b->c;
}

static int kv_free(lua_State *L) {
  kv_drop(&kv_box(L, 1)->link);
  return 0;
}

static int kv_gc(lua_State *L) {
  fal_kvbox *b = kv_testbox(L, 1);
  if (b) {
    kv_drop(&b->link);
    fal_unlink(&b->link);
  }
  return 0;
}

static fa_kv_cache_info kv_info_of(lua_State *L) {
  fa_kv_cache_info info;
  fa_context *ctx = fal_ctx(L);
  FAL_CALL(L, ctx, fa_kv_cache_get_info(ctx, kv_self(L), &info));
  return info;
}

static void set_int(lua_State *L, const char *key, int64_t v) {
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, key);
}

/* cache:info(): the sizes, dtype and device, and the free pages. */
static int kv_info(lua_State *L) {
  fa_kv_cache_info i = kv_info_of(L);
  lua_createtable(L, 0, 10);
  set_int(L, "batch", i.batch), set_int(L, "heads", i.heads), set_int(L, "dim", i.dim), set_int(L, "dim_v", i.dim_v);
  set_int(L, "capacity", i.capacity), set_int(L, "page_size", i.page_size), set_int(L, "pages", i.pages);
  set_int(L, "free_pages", i.free_pages);
  lua_pushstring(L, fa_dtype_name(i.dtype));
  lua_setfield(L, -2, "dtype");
  lua_pushstring(L, fa_device_name(i.device));
  lua_setfield(L, -2, "device");
  return 1;
}

static int kv_tostring(lua_State *L) {
  fal_kvbox *b = kv_box(L, 1);
  if (!b->c) {
    lua_pushliteral(L, FAL_KVCACHE_MT "(freed)");
    return 1;
  }
  fa_kv_cache_info i = kv_info_of(L);
  lua_pushfstring(L, FAL_KVCACHE_MT "(batch=%I, heads=%I, dim=%I, dim_v=%I, capacity=%I, page_size=%I, pages=%I, %s, %s)",
                  (lua_Integer)i.batch, (lua_Integer)i.heads, (lua_Integer)i.dim, (lua_Integer)i.dim_v,
                  (lua_Integer)i.capacity, (lua_Integer)i.page_size, (lua_Integer)i.pages, fa_dtype_name(i.dtype),
                  fa_device_name(i.device));
  return 1;
}

/* cache:lengths(): a table of B lengths. */
static int kv_lengths(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_kv_cache_info i = kv_info_of(L);
  int64_t *lens = (int64_t *)fal_newbuffer(L, i.batch, sizeof *lens, "lengths");
  FAL_CALL(L, ctx, fa_kv_cache_lengths(ctx, kv_self(L), lens)); /* a finalizer cannot change B: same cache or an error */
  lua_createtable(L, (int)(i.batch < 1 << 20 ? i.batch : 1 << 20), 0);
  for (int64_t b = 0; b < i.batch; b++) {
    lua_pushinteger(L, (lua_Integer)lens[b]);
    lua_rawseti(L, -2, (lua_Integer)b + 1);
  }
  return 1;
}

/* cache:reset([b]): all sequences, or sequence b (1-based). */
static int kv_reset(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  int64_t b = lua_isnoneornil(L, 2) ? -1 : fal_checkindex(L, 2, "b");
  fa_kv_cache *c = kv_self(L);
  fa_kv_cache_info i;
  FAL_CALL(L, ctx, fa_kv_cache_get_info(ctx, c, &i));
  if (b >= i.batch) /* the C API counts from 0: say it in Lua's numbering */
    fal_argerror(L, 2, "b", "sequence %I is out of range 1 to %I", (lua_Integer)(b + 1), (lua_Integer)i.batch);
  FAL_CALL(L, ctx, fa_kv_cache_reset(ctx, c, b));
  return 0;
}

/* cache:append(k, v [, lens]) */
static int kv_append(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 4);
  fal_pins *pins = fal_pins_open(L); /* 5 */
  fa_tensor *k = fal_pin(L, pins, 2, "k"), *v = fal_pin(L, pins, 3, "v");
  int64_t *lens = NULL, n = 0;
  if (!lua_isnil(L, 4)) {
    if (!lua_istable(L, 4)) fal_typeerror(L, 4, "lens", "a table of counts");
    n = (int64_t)lua_rawlen(L, 4);
    lens = (int64_t *)fal_newbuffer(L, n ? n : 1, sizeof *lens, "lens"); /* 6 */
    for (int64_t i = 0; i < n; i++) {
      lua_rawgeti(L, 4, (lua_Integer)i + 1);
      int isint = 0; /* a number: lua_tointegerx alone would take the string "2" as 2 */
      lua_Integer x = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
      if (!isint) fal_error(L, "kv_cache append: lens[%I]: expected an integer, got %s", (lua_Integer)i + 1, fal_describe(L, -1));
      lens[i] = (int64_t)x;
      lua_pop(L, 1);
    }
  }
  FAL_CALL(L, ctx, fa_kv_cache_append(ctx, kv_self(L), k, v, lens, n));
  return 0;
}

static const char *const attend_keys[] = {"scale", "causal",  "window", "alibi",  "softcap",
                                          "return_lse", "out", "lse_out", "splits", NULL};
static const char *const causal_names[] = {"bottom_right", "top_left", NULL};

/* cache:attend(q [, opts]) -> o [, lse] */
static int kv_attend(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_attention_opts o;
  lua_settop(L, 3);
  fa_tensor **out = fal_newbox(L); /* 4 */
  fa_tensor **lse = fal_newbox(L); /* 5 */
  fal_pins *pins = fal_pins_open(L); /* 6 */
  fa_tensor *q = fal_pin(L, pins, 2, "q");
  fa_attention_opts_init(&o);
  if (fal_opts(L, 3, "cache:attend", attend_keys)) {
    o.has_scale = fal_opt_num(L, 3, "scale", &o.scale);
    int tt = lua_getfield(L, 3, "causal"), which;
    if (tt == LUA_TBOOLEAN) o.causal = lua_toboolean(L, -1) ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
    lua_pop(L, 1);
    if (tt != LUA_TBOOLEAN && fal_opt_enum(L, 3, "causal", causal_names, &which))
      o.causal = which ? FA_CAUSAL_TOP_LEFT : FA_CAUSAL_BOTTOM_RIGHT;
    o.has_window = fal_opt_pair(L, 3, "window", &o.window_left, &o.window_right);
    o.alibi = fal_opt_numbers(L, 3, "alibi", &o.n_alibi); /* pushed: stays until the call is done */
    fal_opt_num(L, 3, "softcap", &o.softcap);
    fal_opt_bool(L, 3, "return_lse", &o.return_lse);
    o.out = fal_opt_tensor(L, 3, "out", pins);
    o.lse_out = fal_opt_tensor(L, 3, "lse_out", pins);
    fal_opt_splits(L, 3, &o.splits);
  }
  FAL_CALL(L, ctx, fa_kv_cache_attend(ctx, kv_self(L), q, &o, out, lse));
  const int want_lse = o.return_lse || o.lse_out;
  fal_pins_close(L, 6);
  lua_settop(L, 5);
  if (lua_istable(L, 3)) {
    lua_getfield(L, 3, "out");
    fal_prefer_same(L, 4, -1);
    lua_pop(L, 1);
  }
  if (!want_lse) {
    fal_box_release(L, 5);
    lua_settop(L, 4);
    return 1;
  }
  if (lua_istable(L, 3)) {
    lua_getfield(L, 3, "lse_out");
    fal_prefer_same(L, 5, -1);
    lua_pop(L, 1);
  }
  return 2;
}

static const luaL_Reg kv_methods[] = {{"append", kv_append}, {"attend", kv_attend}, {"lengths", kv_lengths},
                                      {"reset", kv_reset},   {"info", kv_info},     {"free", kv_free},
                                      {NULL, NULL}};

static const char *const create_keys[] = {"batch", "heads", "dim", "dim_v", "capacity", "page_size",
                                          "pages", "dtype", "device", NULL};

/* Pushes the cache metatable (made when the module opens:
 * fal_kvcache_metatable_make). */
static void kv_metatable(lua_State *L) {
  if (!luaL_newmetatable(L, FAL_KVCACHE_MT)) return;
  fal_guard_metatable(L, FAL_KVCACHE_MT, kv_gc, kv_free);
  lua_pushcfunction(L, kv_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_createtable(L, 0, 8);
  luaL_setfuncs(L, kv_methods, 0);
  lua_setfield(L, -2, "__index");
}

/* fa.kv_cache{batch =, heads =, dim =, dim_v =, capacity =, page_size =, pages =, dtype =, device =} */
static int l_kv_cache(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_kv_cache_opts o;
  fa_kv_cache_opts_init(&o);
  lua_settop(L, 1);
  if (!lua_istable(L, 1)) fal_typeerror(L, 1, "opts", "a table {batch =, heads =, dim =, capacity =, ...}");
  fal_opts(L, 1, "fa.kv_cache", create_keys);
  static const char *const required[] = {"batch", "heads", "dim", "capacity"}; /* named when absent, not read as 0 */
  for (int i = 0; i < 4; i++) {
    lua_getfield(L, 1, required[i]);
    if (lua_isnil(L, -1)) fal_error(L, "fa.kv_cache: opts.%s is required (an integer >= 1)", required[i]);
    lua_pop(L, 1);
  }
  fal_opt_int(L, 1, "batch", &o.batch);
  fal_opt_int(L, 1, "heads", &o.heads);
  fal_opt_int(L, 1, "dim", &o.dim);
  fal_opt_int(L, 1, "dim_v", &o.dim_v);
  fal_opt_int(L, 1, "capacity", &o.capacity);
  fal_opt_int(L, 1, "page_size", &o.page_size);
  fal_opt_int(L, 1, "pages", &o.pages);
  fal_opt_dtype(L, 1, "dtype", &o.dtype);
  fal_opt_device(L, 1, "device", &o.device);
  fal_state *s = fal_live_state(L);
  fal_kvbox *b = (fal_kvbox *)lua_newuserdatauv(L, sizeof *b, 0);
  b->magic = fal_magic(b, FAL_MAGIC_KVCACHE);
  b->c = NULL;
  fal_link_box(L, s, &b->link, kv_drop);
  kv_metatable(L);
  lua_setmetatable(L, -2);
  FAL_CALL(L, ctx, fa_kv_cache_create(ctx, &o, &b->c));
  return 1;
}

const luaL_Reg fal_kvcache_funcs[] = {{"kv_cache", l_kv_cache}, {NULL, NULL}};

void fal_kvcache_metatable_make(lua_State *L) {
  kv_metatable(L);
  lua_pop(L, 1);
}
