/* fa.load and fa.save (API §7, docs/io.md): the Lua side of src/io_*.c.
 * A tensor is saved as .npy, a table {name = tensor} as .safetensors;
 * loading picks the reader by extension, else by the file's first bytes.
 *
 * Files are a capability: a script reaches them here only where the state
 * has the io library (it could open files anyway), or where the host
 * allowed it (fa_lua_set_file_access); a sandbox that left io out keeps
 * its scripts away from the file system. */
#include <string.h>

#include "lbinding.h"

static const char access_key = 0; /* registry key: the host's decision */
#define FAL_IO_RESULT_MT "flashattn.io_result"

FA_API void fa_lua_set_file_access(lua_State *L, int allowed) {
  lua_pushboolean(L, allowed != 0);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &access_key);
}

static void check_access(lua_State *L, const char *fname) {
  int allowed = 0;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &access_key) != LUA_TNIL) {
    allowed = lua_toboolean(L, -1);
  } else if (lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE) == LUA_TTABLE) {
    lua_pushliteral(L, "io");
    allowed = lua_rawget(L, -2) != LUA_TNIL; /* raw: package.loaded's metatable is the script's */
    lua_pop(L, 2);
  } else {
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (!allowed)
    fal_error(L, "%s: file access is not available in this state (no io library; a host allows it with "
                 "fa_lua_set_file_access)",
              fname);
}

static const char *check_path(lua_State *L) {
  if (lua_type(L, 1) != LUA_TSTRING) fal_typeerror(L, 1, "path", "a file path (string)");
  size_t n;
  const char *path = lua_tolstring(L, 1, &n);
  if (strlen(path) != n) fal_argerror(L, 1, "path", "contains a NUL byte");
  return path;
}

/* Whether path ends with ext (lowercase), in any case. */
static int has_ext(const char *path, const char *ext) {
  size_t n = strlen(path), m = strlen(ext);
  for (size_t i = 0; n >= m && i < m; i++) {
    char c = path[n - m + i];
    if ((c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c) != ext[i]) return 0;
  }
  return n >= m;
}

/* ---- fa.load ---------------------------------------------------------------- */

typedef struct {
  uint64_t magic; /* fal_magic(r, FAL_MAGIC_LOAD) */
  char **names;
  fa_tensor **tensors;
  size_t count;
} io_result;

/* __close and __gc: whatever the table did not take is released. */
static int result_close(lua_State *L) {
  io_result *r = (io_result *)fal_testudata(L, 1, FAL_IO_RESULT_MT, sizeof(io_result));
  if (!r || r->magic != fal_magic(r, FAL_MAGIC_LOAD)) return 0; /* another userdata given the metatable (debug) */
  fa_safetensors_free(r->names, r->tensors, r->count);
  r->names = NULL, r->tensors = NULL, r->count = 0;
  return 0;
}

/* Pushes the holder's metatable (made when the module opens:
 * fal_io_metatable_make). */
static void result_metatable(lua_State *L) {
  if (luaL_newmetatable(L, FAL_IO_RESULT_MT)) fal_guard_metatable(L, FAL_IO_RESULT_MT, result_close, result_close);
}

void fal_io_metatable_make(lua_State *L) {
  result_metatable(L);
  lua_pop(L, 1);
}

/* A to-be-closed holder for fa_load_safetensors' arrays, so that a Lua
 * error while the table is built (out of memory) leaks nothing. */
static io_result *push_result(lua_State *L) {
  io_result *r = (io_result *)lua_newuserdatauv(L, sizeof *r, 0);
  memset(r, 0, sizeof *r);
  r->magic = fal_magic(r, FAL_MAGIC_LOAD);
  result_metatable(L);
  lua_setmetatable(L, -2);
  lua_toclose(L, -1);
  return r;
}

/* The tensor on top converted to dtype (replacing it) when asked. */
static void convert_top(lua_State *L, fa_context *ctx, int has_dtype, fa_dtype dtype, fa_device device) {
  if (!has_dtype) return;
  int from = lua_gettop(L);
  fa_tensor **slot = fal_newbox(L);
  FAL_CALL(L, ctx, fa_tensor_to(ctx, fal_tensor(L, from, "tensor"), dtype, device, slot));
  fal_box_release(L, from);
  lua_remove(L, from);
}

static int l_load(lua_State *L) {
  static const char *const allowed[] = {"device", "dtype", NULL};
  const char *path = check_path(L);
  if (lua_gettop(L) > 2) fal_argerror(L, 3, NULL, "unexpected argument to load");
  fa_context *ctx = fal_ctx(L);
  fa_device device = fa_context_device(ctx);
  fa_dtype dtype = FA_F32;
  int has_dtype = 0;
  if (fal_opts(L, 2, "load", allowed)) {
    fal_opt_device(L, 2, "device", &device);
    has_dtype = fal_opt_dtype(L, 2, "dtype", &dtype);
  }
  check_access(L, "load");
  fa_file_format fmt;
  FAL_CALL(L, ctx, fa_file_format_of(ctx, path, &fmt));
  if (fmt == FA_FILE_NPY) {
    fa_tensor **slot = fal_newbox(L);
    FAL_CALL(L, ctx, fa_load_npy(ctx, path, device, slot));
    convert_top(L, ctx, has_dtype, dtype, device);
    return 1;
  }
  io_result *r = push_result(L);
  FAL_CALL(L, ctx, fa_load_safetensors(ctx, path, device, &r->names, &r->tensors, &r->count));
  lua_createtable(L, 0, r->count > 1000000 ? 1000000 : (int)r->count);
  for (size_t i = 0; i < r->count; i++) {
    fa_tensor **slot = fal_newbox(L);
    *slot = r->tensors[i]; /* the box owns it from here */
    r->tensors[i] = NULL;
    convert_top(L, ctx, has_dtype, dtype, device);
    lua_setfield(L, -2, r->names[i]); /* a new table without a metatable: no script runs */
  }
  return 1; /* the holder closes as the function returns */
}

/* ---- fa.save ------------------------------------------------------------------ */

/* The table's names and tensors into the arrays (n entries counted
 * before): nothing here allocates, so no finalizer can run between this
 * and the call that uses them. */
static void fill(lua_State *L, int tbl, size_t n, const char **names, fa_tensor **tensors) {
  size_t i = 0;
  lua_pushnil(L);
  while (lua_next(L, tbl)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      fal_error(L, "save: the table's keys must be tensor names (strings), got %s", fal_describe(L, -2));
    size_t len;
    const char *name = lua_tolstring(L, -2, &len);
    if (strlen(name) != len) fal_error(L, "save: tensor name '%s' contains a NUL byte", name);
    fal_box *b = fal_tobox(L, -1);
    if (!b) fal_error(L, "save: value of '%s': expected a " FAL_TENSOR_MT ", got %s", name, fal_typename(L, -1));
    if (!b->t) fal_error(L, "save: value of '%s': tensor has been freed", name);
    if (i == n) fal_error(L, "save: the table changed while it was read");
    names[i] = name;
    tensors[i++] = b->t;
    lua_pop(L, 1);
  }
  if (i != n) fal_error(L, "save: the table changed while it was read");
}

static int l_save(lua_State *L) {
  const char *path = check_path(L);
  if (lua_gettop(L) > 2) fal_argerror(L, 3, NULL, "unexpected argument to save");
  int is_tensor = fal_tobox(L, 2) != NULL;
  if (!is_tensor && lua_type(L, 2) != LUA_TTABLE)
    fal_typeerror(L, 2, "value", "a " FAL_TENSOR_MT " (.npy) or a table {name = tensor, ...} (.safetensors)");
  if (is_tensor && has_ext(path, ".safetensors"))
    fal_argerror(L, 2, "value", "a .safetensors file holds named tensors: pass a table {name = tensor}");
  if (!is_tensor && has_ext(path, ".npy"))
    fal_argerror(L, 2, "value", "an .npy file holds one tensor, not a table: pass a tensor, or use a .safetensors path");
  check_access(L, "save");
  fa_context *ctx = fal_ctx(L);
  if (is_tensor) {
    FAL_CALL(L, ctx, fa_save_npy(ctx, path, fal_tensor(L, 2, "value")));
    return 0;
  }
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    lua_pop(L, 1);
    n++;
  }
  const char **names = (const char **)fal_newbuffer(L, (int64_t)n, sizeof *names, "save");
  fa_tensor **tensors = (fa_tensor **)fal_newbuffer(L, (int64_t)n, sizeof *tensors, "save");
  fill(L, 2, n, names, tensors);
  fa_status st = fa_save_safetensors(ctx, path, n, names, tensors);
  if (st == FA_ERR_OUT_OF_MEMORY) { /* collect (finalizers may change the table), then read it again */
    fal_collect(L);
    fill(L, 2, n, names, tensors);
    st = fa_save_safetensors(ctx, path, n, names, tensors);
  }
  if (st) fal_fail(L, ctx);
  return 0;
}

const luaL_Reg fal_io_funcs[] = {{"load", l_load}, {"save", l_save}, {NULL, NULL}};
