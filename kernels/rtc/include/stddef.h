/* NVRTC has no C library: <stddef.h> for the kernels' headers. */
#pragma once
typedef unsigned long size_t;
typedef long ptrdiff_t;
#ifndef NULL
#define NULL 0
#endif
