/* flashattn-lua: a Lua 5.4 interpreter with the flashattn engine linked in.
 *
 *   flashattn-lua script.lua [args...]
 *   flashattn-lua -e 'chunk' [args...]
 *
 * It opens the standard libraries, preloads the engine's module
 * (package.preload["flashattn"] = luaopen_flashattn, so that a sanitizer
 * build instruments the engine together with the interpreter), sets the
 * global `arg` as lua.c does (arg[0] = the script, arg[1..] = the
 * arguments), runs the script with a traceback message handler and exits
 * non-zero when it fails.  A script that calls os.exit(code, true) closes
 * the state (and so collects every tensor) before exiting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "flashattn.h"

static const char *progname = "flashattn-lua";

/* Message handler: the error text plus a traceback. */
static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static int usage(void) {
  fprintf(stderr,
          "usage: %s script.lua [args...]\n"
          "       %s -e 'lua chunk' [args...]\n"
          "Runs a Lua 5.4 script with the flashattn engine preloaded (require \"flashattn\").\n",
          progname, progname);
  return 2;
}

typedef struct {
  int argc;
  char **argv;
  int script; /* index in argv of the script (or of the -e chunk) */
  int is_chunk;
} run_args;

/* Runs in protected mode so that no Lua error (out of memory included)
 * escapes to a panic. */
static int pmain(lua_State *L) {
  const run_args *a = (const run_args *)lua_touserdata(L, 1);
  luaL_checkversion(L);
  luaL_openlibs(L);

  /* package.preload["flashattn"] = luaopen_flashattn */
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_flashattn);
  lua_setfield(L, -2, "flashattn");
  lua_pop(L, 1);

  /* arg: arg[-n..-1] = interpreter and options, arg[0] = script, arg[1..] = args */
  lua_createtable(L, a->argc - a->script - 1, a->script + 1);
  for (int i = 0; i < a->argc; i++) {
    lua_pushstring(L, a->argv[i]);
    lua_rawseti(L, -2, i - a->script);
  }
  lua_setglobal(L, "arg");

  int status;
  if (a->is_chunk)
    status = luaL_loadbuffer(L, a->argv[a->script], strlen(a->argv[a->script]), "=(command line)");
  else
    status = luaL_loadfile(L, strcmp(a->argv[a->script], "-") == 0 ? NULL : a->argv[a->script]);
  if (status != LUA_OK) return lua_error(L);

  /* the script's arguments as its varargs */
  int nargs = a->argc - a->script - 1;
  luaL_checkstack(L, nargs + 3, "too many arguments to script");
  for (int i = a->script + 1; i < a->argc; i++) lua_pushstring(L, a->argv[i]);

  int base = lua_gettop(L) - nargs; /* the chunk */
  lua_pushcfunction(L, msghandler);
  lua_insert(L, base);
  status = lua_pcall(L, nargs, 0, base);
  lua_remove(L, base);
  if (status != LUA_OK) return lua_error(L); /* already has its traceback */
  lua_pushboolean(L, 1);
  return 1;
}

int main(int argc, char **argv) {
  if (argc > 0 && argv[0] && argv[0][0]) progname = argv[0];
  if (argc < 2) return usage();

  run_args a = {argc, argv, 1, 0};
  if (strcmp(argv[1], "-e") == 0) {
    if (argc < 3) return usage();
    a.script = 2;
    a.is_chunk = 1;
  } else if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    usage();
    return 0;
  } else if (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0) {
    printf("%s (%s, flashattn %s)\n", progname, LUA_RELEASE, FA_VERSION);
    return 0;
  }

  lua_State *L = luaL_newstate();
  if (L == NULL) {
    fprintf(stderr, "%s: cannot create a Lua state: not enough memory\n", progname);
    return EXIT_FAILURE;
  }
  lua_pushcfunction(L, pmain);
  lua_pushlightuserdata(L, &a);
  int status = lua_pcall(L, 1, 1, 0);
  int ok = status == LUA_OK && lua_toboolean(L, -1);
  if (!ok) {
    const char *msg = lua_tostring(L, -1);
    fprintf(stderr, "%s: %s\n", progname, msg ? msg : "(error object is not a string)");
    fflush(stderr);
  }
  lua_close(L);
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
