/* The host's poll (fa_lua_set_poll, README "Reliability"): the module's long
 * loops, which run no Lua instruction, call it; a poll that raises stops
 * them, the module keeps nothing, and the state stays usable.
 *   - fa.bench whose fn is a table with __call = pcall (a chain of C calls
 *     every repetition) at the largest counts: polled every repetition;
 *   - fa.tensor of a table with shared rows (2^27 elements, its cap): polled
 *     every 65536 elements. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "testutil.h"

static long polls, stop_after;

static void poll(lua_State *L, void *ud) {
  (void)ud;
  if (++polls >= stop_after) luaL_error(L, "test_budget: stopped after %d polls", (int)polls);
}

/* Runs the chunk and returns its error message ("" when it succeeds). */
static const char *run(lua_State *L, const char *chunk) {
  lua_settop(L, 0);
  if (luaL_dostring(L, chunk) == LUA_OK) return "";
  return lua_tostring(L, -1) ? lua_tostring(L, -1) : "(not a string)";
}

/* 2^17 rows of one 1024-wide row: 2^27 elements */
#define SHARED(rows) "local row = {} for i = 1, 1024 do row[i] = 1 end local t = {} for i = 1, " rows " do t[i] = row end "

int main(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "flashattn", luaopen_flashattn, 1);
  lua_pop(L, 1);
  size_t base;
  fa_memory(FA_CPU, &base, NULL);

  tu_test = "bench";
  fa_lua_set_poll(L, poll, NULL);
  polls = 0;
  stop_after = 1000;
  const char *err = run(L, "flashattn.bench(setmetatable({}, {__call = pcall}), {warmup = 1000000, rep = 1000000})");
  CHECK(strstr(err, "test_budget: stopped after 1000 polls") != NULL, "bench: %s", err);
  CHECK(polls == 1000, "bench polled %ld times", polls);

  tu_test = "bench fn runs between polls";
  polls = 0;
  stop_after = 1L << 30;
  err = run(L, "local n = 0 local r = flashattn.bench(function() n = n + 1 end, {warmup = 2, rep = 5}) "
               "assert(n == 7 and r.n == 5)");
  CHECK(*err == 0, "%s", err);
  CHECK(polls == 7, "7 repetitions, %ld polls", polls);

  tu_test = "tensor";
  polls = 0;
  stop_after = 100;
  err = run(L, SHARED("1 << 17") "flashattn.tensor(t)");
  CHECK(strstr(err, "test_budget: stopped after 100 polls") != NULL, "tensor: %s", err);

  tu_test = "tensor to the end";
  polls = 0;
  stop_after = 1L << 30;
  err = run(L, SHARED("1 << 10") "local x = flashattn.tensor(t, {dtype = 'bool'}) assert(x:numel() == 1 << 20) x:free()");
  CHECK(*err == 0, "%s", err);
  CHECK(polls == 16, "2^20 elements in chunks of 65536: %ld polls", polls);

  tu_test = "no poll";
  fa_lua_set_poll(L, NULL, NULL);
  polls = 0;
  err = run(L, "flashattn.bench(function() end, {rep = 3})");
  CHECK(*err == 0 && polls == 0, "%s, %ld polls", err, polls);

  lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT, 0);
  lua_gc(L, LUA_GCCOLLECT, 0);
  size_t cur;
  fa_memory(FA_CPU, &cur, NULL);
  tu_test = "memory";
  CHECK(cur == base, "the engine holds %zu bytes, %zu before", cur, base);
  lua_close(L);
  return tu_summary("test_budget");
}
