/* luaopen_flashattn: the module table, and the functions about devices,
 * memory and the default device (API §3).  The module uses only the Lua C
 * API: a host may load it into a state with just the base, table, string
 * and math libraries. */
#include <string.h>

#include "lbinding.h"

extern const luaL_Reg fal_ring_funcs[]; /* lring.c: fa.shard, fa.unshard, fa.ring_attention */

/* The device argument at idx, or the context's default device. */
static fa_device opt_device(lua_State *L, int idx) {
  fa_device d;
  if (lua_isnoneornil(L, idx)) return fa_context_device(fal_ctx(L));
  fal_parse_device(L, idx, fal_arglabel(L, idx, "device"), &d); /* a bad or unusable one raises, naming it */
  return d;
}

static int l_backends(lua_State *L) {
  int n = 0;
  lua_createtable(L, 2, 0);
  if (fa_backend_available(FA_CPU)) {
    lua_pushliteral(L, "cpu");
    lua_rawseti(L, -2, ++n);
  }
  if (fa_backend_available(FA_CUDA)) {
    lua_pushliteral(L, "cuda");
    lua_rawseti(L, -2, ++n);
  }
  return 1;
}

static void set_int(lua_State *L, const char *key, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, key);
}

static void set_str(lua_State *L, const char *key, const char *v) {
  lua_pushstring(L, v);
  lua_setfield(L, -2, key);
}

/* fa.device_info([device]): backend and name, then CPU threads and SIMD
 * level, or the CUDA device's resources. */
static int l_device_info(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_device d = opt_device(L, 1);
  fa_device_info_t info;
  memset(&info, 0, sizeof info);
  FAL_CALL(L, ctx, fa_device_info(ctx, d, &info));
  lua_createtable(L, 0, 10);
  set_str(L, "backend", info.backend);
  set_str(L, "name", info.name);
  if (d == FA_CPU) {
    set_int(L, "threads", info.threads);
    set_str(L, "simd", info.simd);
  } else {
    set_int(L, "sms", info.sms);
    set_int(L, "smem_per_block", (lua_Integer)info.smem_per_block);
    set_int(L, "smem_per_sm", (lua_Integer)info.smem_per_sm);
    set_int(L, "mem_total", (lua_Integer)info.mem_total);
    set_int(L, "l2_bytes", (lua_Integer)info.l2_bytes);
    lua_pushfstring(L, "%d.%d", info.cc_major, info.cc_minor);
    lua_setfield(L, -2, "cc");
    set_int(L, "cc_major", info.cc_major);
    set_int(L, "cc_minor", info.cc_minor);
  }
  return 1;
}

static int l_memory(lua_State *L) {
  size_t cur, peak;
  fa_memory(opt_device(L, 1), &cur, &peak);
  lua_createtable(L, 0, 2);
  set_int(L, "current", (lua_Integer)cur);
  set_int(L, "peak", (lua_Integer)peak);
  return 1;
}

static int l_reset_peak(lua_State *L) {
  fa_reset_peak(opt_device(L, 1));
  return 0;
}

/* fa.set_memory_limit(bytes [, device]): 0 = none; returns the old limit. */
static int l_set_memory_limit(lua_State *L) {
  int64_t bytes = fal_checkint(L, 1, "bytes");
  if (bytes < 0) fal_argerror(L, 1, "bytes", "expected an integer >= 0 (0 = no limit), got %I", (lua_Integer)bytes);
  fa_device d = opt_device(L, 2);
  lua_pushinteger(L, (lua_Integer)fa_memory_limit(d));
  fa_set_memory_limit(d, (size_t)bytes);
  return 1;
}

static int l_memory_limit(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)fa_memory_limit(opt_device(L, 1)));
  return 1;
}

static int l_set_default_device(lua_State *L) {
  fa_device d;
  fal_parse_device(L, 1, "argument #1 (device)", &d);
  fal_state *s = fal_state_get(L);
  if (!s->host && !s->own) { /* first use: make the context on d directly */
    if (fal_make_own_context(L, d) != FA_OK)
      fal_error(L, "set_default_device: device '%s' is not available", fa_device_name(d));
    return 0;
  }
  fa_context *ctx = fal_ctx(L);
  FAL_CALL(L, ctx, fa_context_set_device(ctx, d));
  return 0;
}

static int l_default_device(lua_State *L) {
  lua_pushstring(L, fa_device_name(fa_context_device(fal_ctx(L))));
  return 1;
}

/* fa.manual_seed(n): restarts the seeds of fa.rand/fa.randn without opts.seed. */
static int l_manual_seed(lua_State *L) {
  fal_state_get(L)->seed_counter = (uint64_t)fal_checkint(L, 1, "seed");
  return 0;
}

static int l_is_tensor(lua_State *L) {
  lua_pushboolean(L, fal_tobox(L, 1) != NULL);
  return 1;
}

static const luaL_Reg module_funcs[] = {{"backends", l_backends},
                                        {"device_info", l_device_info},
                                        {"memory", l_memory},
                                        {"reset_peak", l_reset_peak},
                                        {"set_memory_limit", l_set_memory_limit},
                                        {"memory_limit", l_memory_limit},
                                        {"set_default_device", l_set_default_device},
                                        {"default_device", l_default_device},
                                        {"manual_seed", l_manual_seed},
                                        {"is_tensor", l_is_tensor},
                                        {NULL, NULL}};

FA_API int luaopen_flashattn(lua_State *L) {
  luaL_checkversion(L);
  fal_pin_module(); /* first: this copy's code must outlive whatever it leaves in L */
  fal_tensor_metatable(L); /* refuses a second copy of the module in L */
  lua_pop(L, 1);
  fal_state_get(L);
  fal_pins_metatable_make(L);
  fal_kvcache_metatable_make(L);
  fal_io_metatable_make(L);
  lua_createtable(L, 0, 48);
  luaL_setfuncs(L, module_funcs, 0);
  luaL_setfuncs(L, fal_construct_funcs, 0);
  luaL_setfuncs(L, fal_compare_funcs, 0);
  luaL_setfuncs(L, fal_kernel_funcs, 0);
  luaL_setfuncs(L, fal_bench_funcs, 0);
  luaL_setfuncs(L, fal_io_funcs, 0);
  luaL_setfuncs(L, fal_kvcache_funcs, 0);
  luaL_setfuncs(L, fal_backward_funcs, 0);
  luaL_setfuncs(L, fal_ring_funcs, 0);
  fal_trace_open(L);
  lua_createtable(L, 0, 2);
  luaL_setfuncs(L, fal_cost_funcs, 0);
  lua_setfield(L, -2, "cost");
  lua_pushstring(L, fa_version()); /* the linked library's */
  lua_setfield(L, -2, "version");
  return 1;
}
