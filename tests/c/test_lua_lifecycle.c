/* The Lua binding over a lua_State's whole life (issue 21): what finalizers
 * do while lua_close runs, and tensors a host hands in.  Each case opens
 * its own state and checks after lua_close that the engine holds no memory
 * and that wrapped host buffers were released exactly once; under ASan and
 * valgrind (label valgrind) nothing may leak either, contexts and the
 * fa.bench flush buffer included.
 *
 * Lua 5.4 runs the finalizers at lua_close in the reverse order of their
 * marking, and does not mark what they create then: a tensor made by such
 * a finalizer never gets a __gc of its own.  The module's per-state __gc
 * runs after those of everything made after the module was opened. */
#include <stdint.h>
#include <stdlib.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "testutil.h"

/* ---- notes: what a finalizer's pcall gave, kept outside the state ---- */

#define MAX_NOTES 16
static int n_notes;
static int note_ok[MAX_NOTES];
static char note_msg[MAX_NOTES][256];

/* note(ok, msg): records one pcall result (finalizers cannot report otherwise). */
static int l_note(lua_State *L) {
  if (n_notes < MAX_NOTES) {
    note_ok[n_notes] = lua_toboolean(L, 1);
    const char *m = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "(no message)";
    snprintf(note_msg[n_notes], sizeof note_msg[0], "%s", m);
    n_notes++;
  }
  return 0;
}

/* Note i must be an error with a "flashattn:" message. */
static void check_refused(int i, const char *what) {
  CHECK(i < n_notes, "%s: the finalizer did not run", what);
  if (i >= n_notes) return;
  CHECK(!note_ok[i], "%s succeeded while the state closed", what);
  CHECK(strncmp(note_msg[i], "flashattn:", 10) == 0, "%s: message '%s'", what, note_msg[i]);
}

/* ---- host buffers ---- */

static int releases;
static float host_buf[64];

static void count_release(void *data, void *user) {
  (void)data;
  (void)user;
  releases++;
}

static fa_context *ctx;

/* A tensor over host_buf whose release is counted; the caller owns it. */
static fa_tensor *wrap_host(void) {
  fa_tensor *t = NULL;
  const int64_t shape[2] = {8, 8};
  CHECK_OK(ctx, fa_tensor_wrap(ctx, host_buf, FA_CPU, FA_F32, 2, shape, NULL, count_release, NULL, &t));
  return t;
}

/* ---- states ---- */

static fa_tensor *host_tensor; /* what push_host() hands a script */

/* push_host(): fa_lua_push_tensor of the host's tensor, as a host function would. */
static int l_push_host(lua_State *L) {
  fa_lua_push_tensor(L, host_tensor);
  return 1;
}

/* All the standard libraries, the module preloaded; opened (as the global
 * fa) when open_module. */
static lua_State *new_state(int open_module) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_flashattn);
  lua_setfield(L, -2, "flashattn");
  lua_pop(L, 2);
  lua_register(L, "note", l_note);
  lua_register(L, "push_host", l_push_host);
  if (open_module) {
    luaL_requiref(L, "flashattn", luaopen_flashattn, 0);
    lua_setglobal(L, "fa");
  }
  n_notes = 0;
  return L;
}

static void run(lua_State *L, const char *code) {
  if (luaL_dostring(L, code) != LUA_OK) {
    CHECK(0, "script failed: %s", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
}

/* Leaves garbage whose finalizer runs `body` (Lua statements). */
/* The object is kept (a global list), so that its finalizer runs at
 * lua_close and not at a collection the module's opening happens to end. */
static void add_finalizer(lua_State *L, const char *body) {
  lua_pushfstring(L, "kept_finalizers = kept_finalizers or {}\n"
                     "kept_finalizers[#kept_finalizers + 1] = setmetatable({}, {__gc = function()\n%s\nend})",
                  body);
  run(L, lua_tostring(L, -1));
  lua_pop(L, 1);
}

/* The engine must hold what it held before the state. */
static void check_mem(size_t base) {
  CHECK(tu_mem_now() == base, "the engine holds %zu bytes after lua_close (was %zu)", tu_mem_now(), base);
}

static void close_state(lua_State *L, size_t base) {
  lua_close(L);
  check_mem(base);
}

/* ---- 1. tensors made by finalizers while the state closes ---- */

static void test_close_made_tensors(void) {
  tu_test = "close_made_tensors";
  size_t base = tu_mem_now();
  releases = 0;
  lua_State *L = new_state(1);
  host_tensor = wrap_host();
  fa_lua_push_tensor(L, host_tensor);
  lua_setglobal(L, "h");
  fa_tensor_release(host_tensor); /* the script's box holds the buffer now */
  host_tensor = NULL;
  run(L, "q = fa.zeros(4, 4)");
  add_finalizer(L, "  keep = q:view(-1)          -- a view: q's storage must go too\n"
                   "  keep2 = h:view(-1)         -- the host's buffer, wrapped\n"
                   "  keep3 = h + 1\n"
                   "  local t <close> = fa.ones(3) -- closed at once, never collected\n"
                   "  keep4 = fa.softmax(fa.rand(2, 5))");
  close_state(L, base);
  CHECK(releases == 1, "the wrapped buffer was released %d times", releases);
}

/* ---- 2. finalizers that run after the module's own ---- */

/* The finalizer's table is made before the module is opened: at lua_close
 * it runs after the module's state is gone.  Then nothing may be made: a
 * context (fa.sync), a tensor, the bench flush buffer, a pushed host
 * tensor. */
static void test_after_state_closed(void) {
  tu_test = "after_state_closed";
  size_t base = tu_mem_now();
  releases = 0;
  lua_State *L = new_state(0);
  add_finalizer(L, "  local fa = require 'flashattn'\n"
                   "  note(pcall(fa.sync))\n"
                   "  note(pcall(fa.zeros, 2))\n"
                   "  note(pcall(fa.bench, function() end, {warmup = 0, rep = 1, flush_cache = true}))\n"
                   "  note(pcall(push_host))\n"
                   "  note(pcall(function() return q:view(-1) end))");
  run(L, "fa = require 'flashattn'\n"
         "q = fa.ones(3)\n");
  host_tensor = wrap_host();
  lua_close(L);
  check_refused(0, "fa.sync");
  check_refused(1, "fa.zeros");
  check_refused(2, "fa.bench{flush_cache = true}");
  check_refused(3, "fa_lua_push_tensor");
  check_refused(4, "q:view of a tensor already released");
  fa_tensor_release(host_tensor);
  host_tensor = NULL;
  CHECK(releases == 1, "the wrapped buffer was released %d times", releases);
  check_mem(base);
}

/* Finalizers that run before the module's state: they may use everything,
 * the context and the flush buffer included, and the state's __gc frees it. */
static void test_before_state_closed(void) {
  tu_test = "before_state_closed";
  size_t base = tu_mem_now();
  lua_State *L = new_state(1);
  add_finalizer(L, "note(pcall(fa.bench, function() keep = fa.zeros(2) end, {warmup = 0, rep = 1, flush_cache = true}))\n"
                   "note(pcall(fa.sync))");
  close_state(L, base);
  CHECK(n_notes == 2 && note_ok[0] && note_ok[1], "bench and sync in an early finalizer: %s / %s",
        n_notes > 0 ? note_msg[0] : "-", n_notes > 1 ? note_msg[1] : "-");
}

/* The module opened for the first time by a finalizer while the state
 * closes: its state would never be finalized. */
static void test_first_open_while_closing(void) {
  tu_test = "first_open_while_closing";
  size_t base = tu_mem_now();
  lua_State *L = new_state(0);
  add_finalizer(L, "note(pcall(function() local fa = require 'flashattn'; fa.sync(); keep = fa.zeros(3) end))");
  close_state(L, base);
  check_refused(0, "require 'flashattn' in a finalizer");
}

/* ---- 3. fa_lua_push_tensor(L, fa_lua_check_tensor(L, -1)) ---- */

/* The new box is made before the host's tensor is referenced: a full
 * collection there (the binding's memory-pressure collection, forced here
 * by a small memory limit) runs a finalizer that frees the box the tensor
 * came from, and the tensor with it. */
/* In protected mode: pushed = <the box of victim's tensor, pushed again>. */
static int push_checked(lua_State *L) {
  lua_getglobal(L, "victim");
  fa_lua_push_tensor(L, fa_lua_check_tensor(L, -1));
  lua_setglobal(L, "pushed");
  return 0;
}

static void test_push_checked_tensor(void) {
  tu_test = "push_checked_tensor";
  size_t base = tu_mem_now();
  lua_State *L = new_state(1);
  size_t old_limit = fa_memory_limit(FA_CPU);
  fa_set_memory_limit(FA_CPU, (size_t)1 << 20);
  /* 600 kB: past half the room under the limit, so the next box collects;
   * Lua's own collector waits so that the finalizer runs only then */
  run(L, "collectgarbage('stop')\n"
         "victim = fa.full(150000, 2, {device = 'cpu'})\n" /* the CPU's limit, whatever FLASHATTN_DEVICE says */
         "setmetatable({}, {__gc = function() victim:free() end})\n");
  lua_pushcfunction(L, push_checked);
  if (lua_pcall(L, 0, 0, 0) != LUA_OK) {
    CHECK(0, "push failed: %s", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  fa_set_memory_limit(FA_CPU, old_limit);
  run(L, "collectgarbage('restart')\n"
         "assert(not pcall(victim.sum, victim), 'the finalizer freed victim')\n"
         "assert(pushed:sum() == 300000, 'the pushed tensor is intact')\n"
         "pushed:free()\n");
  close_state(L, base);
}

/* ---- 4. another copy of the module in the same state ---- */

/* requiref(luaopen_flashattn) in protected mode. */
static int open_ours(lua_State *L) {
  luaL_requiref(L, "flashattn", luaopen_flashattn, 0);
  return 1;
}

/* fa_lua_check_tensor(L, 1). */
static int check_foreign(lua_State *L) {
  fa_lua_check_tensor(L, 1);
  return 0;
}

static void expect_refused(lua_State *L, lua_CFunction f, int nargs, const char *what) {
  lua_pushcfunction(L, f);
  lua_insert(L, -1 - nargs);
  int st = lua_pcall(L, nargs, 0, 0);
  const char *msg = st == LUA_OK ? "" : lua_tostring(L, -1);
  CHECK(st != LUA_OK, "%s succeeded", what);
  CHECK(st == LUA_OK || (msg && strncmp(msg, "flashattn:", 10) == 0 && strstr(msg, "another copy")),
        "%s: message '%s'", what, msg ? msg : "(not a string)");
  if (st != LUA_OK) lua_pop(L, 1);
}

/* flashattn.so (its own copy of the engine, from LUA_CPATH) opened first:
 * this program's copy must refuse to open in that state, and neither copy
 * may take the other's tensors. */
static void test_foreign_copy_first(void) {
  tu_test = "foreign_copy_first";
  lua_State *L = new_state(0);
  run(L, "local so = package.searchpath('flashattn', package.cpath)\n"
         "if so then fb = assert(package.loadlib(so, 'luaopen_flashattn'))(); theirs = fb.ones(1000) end\n");
  if (lua_getglobal(L, "theirs") != LUA_TUSERDATA) {
    printf("test_lua_lifecycle: flashattn.so not on LUA_CPATH: foreign_copy_first skipped\n");
    lua_pop(L, 1);
    lua_close(L);
    return;
  }
  size_t base = tu_mem_now(); /* this copy's count: the other copy keeps its own */
  expect_refused(L, check_foreign, 1, "fa_lua_check_tensor of the other copy's tensor");
  expect_refused(L, open_ours, 0, "luaopen_flashattn beside another copy");
  releases = 0;
  host_tensor = wrap_host();
  expect_refused(L, l_push_host, 0, "fa_lua_push_tensor beside another copy");
  fa_tensor_release(host_tensor);
  host_tensor = NULL;
  CHECK(releases == 1, "the wrapped buffer was released %d times", releases);
  run(L, "assert(fb.memory().current >= 4000 and theirs:sum() == 1000)\n"
         "theirs = nil; collectgarbage(); collectgarbage()\n"
         "assert(fb.memory().current == 0, 'the other copy got its memory back')\n");
  close_state(L, base);
}

int main(void) {
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) {
    fprintf(stderr, "test_lua_lifecycle: no CPU context\n");
    return 1;
  }
  test_close_made_tensors();
  test_after_state_closed();
  test_before_state_closed();
  test_first_open_while_closing();
  test_push_checked_tensor();
  test_foreign_copy_first();
  fa_context_destroy(ctx);
  return tu_summary("test_lua_lifecycle");
}
