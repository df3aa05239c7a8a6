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
#endif

#include "lbinding.h"

static const char anchor = 0; /* an address inside this library */

void fal_pin_module(void) {
#if defined(__linux__) || defined(__APPLE__)
  static int done = 0;
  Dl_info info;
  if (done) return;
  done = 1;
  if (dladdr(&anchor, &info) && info.dli_fname)
    (void)dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE); /* never closed, on purpose */
#endif
}
