/* NVRTC has the math functions built in; the two constants of <math.h>. */
#pragma once
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
