/* NVRTC: the host-only headers the kernels name, empty. */
#pragma once
