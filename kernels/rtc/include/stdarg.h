/* NVRTC declares va_list itself; internal.h only names it. */
#pragma once
