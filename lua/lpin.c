/* Keeps flashattn.so loaded until the process ends.
 *
 * lua_close() unloads C modules (dlclose).  Unloading this one would also
 * unload libgomp, whose idle worker threads are still spinning in its
 * code: the process then crashes at exit (seen with lua5.4 after any
 * OpenMP kernel).  Re-opening ourselves with RTLD_NODELETE, and never
 * closing that handle, pins the library and its dependencies.  Linking
 * the module with -Wl,-z,nodelete does the same at build time; this keeps
 * the module safe however it was linked.  A no-op where the engine is
 * linked into the executable itself. */
#if defined(__linux__) || defined(__APPLE__)
#define _GNU_SOURCE /* dladdr, RTLD_NODELETE */
#include <dlfcn.h>
#include <pthread.h>
#endif

#include "lbinding.h"

static const char anchor = 0; /* an address inside this library */

#if defined(__linux__) || defined(__APPLE__)
static void pin_once(void) {
  Dl_info info;
  if (dladdr(&anchor, &info) && info.dli_fname)
    (void)dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE); /* never closed, on purpose */
}
#endif

/* Once per process, whichever thread opens the module first (host threads
 * may each load it into their own lua_State at the same time). */
void fal_pin_module(void) {
#if defined(__linux__) || defined(__APPLE__)
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, pin_once);
#endif
}
