/* The library's version at run time (flashattn_version.h, generated from
 * project(VERSION) in CMakeLists.txt). */
#include "flashattn.h"

const char *fa_version(void) { return FA_VERSION; }
