/* Nothing reachable from the flashattn module leads to io, os, package,
 * debug, require/dofile/loadfile, the globals or the registry (README
 * "Reliability": the sandbox of examples/host_plugin.c relies on it).
 *
 * In a state with every standard library open, the test marks those
 * objects (the library tables, each function in them, the loaders, _G, the
 * registry and package.loaded), then walks everything the module gives a
 * script - the flashattn table, a tensor, the values and results of the
 * walk - through table keys and values, metatables (raw, whatever a
 * __metatable field says), function upvalues and userdata user values: more
 * than a script can see.  No marked object may be reached.  The script-side
 * check, which also calls every function it reaches, is
 * examples/escape_script.lua. */
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "flashattn.h"

static int failures = 0;

/* marked[obj] = name: pushes nothing */
static void mark(lua_State *L, int marked, int idx, const char *name) {
  idx = lua_absindex(L, idx);
  lua_pushvalue(L, idx);
  lua_pushstring(L, name);
  lua_rawset(L, marked);
}

static void mark_library(lua_State *L, int marked, const char *lib) {
  if (lua_getglobal(L, lib) != LUA_TTABLE) {
    lua_pop(L, 1);
    return;
  }
  mark(L, marked, -1, lib);
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    if (lua_type(L, -1) == LUA_TFUNCTION || lua_type(L, -1) == LUA_TTABLE) {
      const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
      lua_pushfstring(L, "%s.%s", lib, key);
      mark(L, marked, -2, lua_tostring(L, -1));
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

static int collectable(int t) {
  return t == LUA_TTABLE || t == LUA_TFUNCTION || t == LUA_TUSERDATA || t == LUA_TTHREAD || t == LUA_TLIGHTUSERDATA;
}

/* Queues the value on top (popping it) with its path unless seen. */
static void visit(lua_State *L, int seen, int queue, const char *path) {
  if (!collectable(lua_type(L, -1))) {
    lua_pop(L, 1);
    return;
  }
  lua_pushvalue(L, -1);
  if (lua_rawget(L, seen) != LUA_TNIL) {
    lua_pop(L, 2);
    return;
  }
  lua_pop(L, 1);
  lua_pushvalue(L, -1);
  lua_pushstring(L, path);
  lua_rawset(L, seen);
  lua_rawseti(L, queue, (lua_Integer)luaL_len(L, queue) + 1);
}

int main(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "flashattn", luaopen_flashattn, 1);
  lua_pop(L, 1);

  lua_newtable(L);
  int marked = lua_gettop(L);
  static const char *const libs[] = {"io", "os", "package", "debug", "coroutine", "utf8", NULL};
  for (const char *const *lib = libs; *lib; lib++) mark_library(L, marked, *lib);
  static const char *const funcs[] = {"require", "dofile", "loadfile", "load", "collectgarbage", NULL};
  for (const char *const *f = funcs; *f; f++) {
    lua_getglobal(L, *f);
    if (!lua_isnil(L, -1)) mark(L, marked, -1, *f);
    lua_pop(L, 1);
  }
  lua_pushglobaltable(L);
  mark(L, marked, -1, "_G");
  lua_pop(L, 1);
  mark(L, marked, LUA_REGISTRYINDEX, "the registry");
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  mark(L, marked, -1, "package.loaded");
  lua_pop(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  mark(L, marked, -1, "the main thread");
  lua_pop(L, 1);

  /* the roots: the module table and a tensor */
  lua_newtable(L);
  int seen = lua_gettop(L);
  lua_newtable(L);
  int queue = lua_gettop(L);
  lua_getglobal(L, "flashattn");
  int fa = lua_gettop(L);
  lua_pushvalue(L, fa);
  visit(L, seen, queue, "flashattn");
  lua_getfield(L, fa, "zeros");
  lua_pushinteger(L, 2);
  lua_call(L, 1, 1);
  visit(L, seen, queue, "a tensor");

  int reached = 0;
  for (lua_Integer head = 1; head <= luaL_len(L, queue); head++) {
    lua_rawgeti(L, queue, head);
    int x = lua_gettop(L);
    lua_pushvalue(L, x);
    lua_rawget(L, seen);
    char path[512];
    snprintf(path, sizeof path, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    reached++;
    lua_pushvalue(L, x);
    if (lua_rawget(L, marked) != LUA_TNIL) {
      fprintf(stderr, "test_sandbox: %s is %s\n", path, lua_tostring(L, -1));
      failures++;
    }
    lua_pop(L, 1);
    char sub[600];
    if (lua_type(L, x) == LUA_TTABLE) {
      lua_pushnil(L);
      while (lua_next(L, x)) {
        const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : luaL_typename(L, -2);
        snprintf(sub, sizeof sub, "%s.%s", path, key);
        visit(L, seen, queue, sub);
        lua_pushvalue(L, -1);
        snprintf(sub, sizeof sub, "%s[key %s]", path, key);
        visit(L, seen, queue, sub);
      }
    }
    if (lua_getmetatable(L, x)) {
      snprintf(sub, sizeof sub, "metatable of %s", path);
      visit(L, seen, queue, sub);
    }
    if (lua_type(L, x) == LUA_TFUNCTION) {
      for (int i = 1; lua_getupvalue(L, x, i) != NULL; i++) {
        snprintf(sub, sizeof sub, "upvalue %d of %s", i, path);
        visit(L, seen, queue, sub);
      }
    }
    if (lua_type(L, x) == LUA_TUSERDATA) {
      for (int i = 1; lua_getiuservalue(L, x, i) != LUA_TNONE; i++) {
        snprintf(sub, sizeof sub, "user value %d of %s", i, path);
        visit(L, seen, queue, sub);
      }
      lua_pop(L, 1); /* the LUA_TNONE's nil */
    }
    lua_settop(L, x - 1);
  }
  lua_close(L);
  printf("test_sandbox: %d objects reachable from the module, %s\n", reached,
         failures ? "some lead out" : "none leads to io, os, package, debug, the globals or the registry");
  return failures ? 1 : 0;
}
