-- luarocks make rockspecs/flashattn-scm-1.rockspec [--tree DIR] [--lua-version 5.4]
-- builds the Lua module with CMake (FLASHATTN_LUAROCKS: one self-contained
-- flashattn.so, the engine linked in, and the Lua helpers).  Needs cmake, a C
-- compiler with OpenMP and OpenBLAS (Debian: libopenblas-dev); the CUDA
-- backend is compiled when nvcc is found (FLASHATTN_CUDA=OFF in the
-- environment turns it off).  docs/packaging.md says more.
rockspec_format = "3.0"
package = "flashattn"
version = "scm-1"
source = {
  url = "git+https://example.invalid/flashattn.git",
}
description = {
  summary = "Exact attention (online softmax, FlashAttention) on the CPU and CUDA, from Lua 5.4",
  detailed = [[
Tensors, softmax and attention kernels (naive, two-pass, one-pass and tiled
flash attention; causal, sliding-window, masks, ALiBi, softcap, GQA/MQA),
f32/f16/bf16/f64, on a threaded BLAS-backed CPU backend and CUDA, with
measuring helpers (bench, cost, memory) for studying and tuning attention.
]],
  license = "MIT",
  homepage = "https://example.invalid/flashattn",
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    CMAKE_INSTALL_PREFIX = "$(PREFIX)",
    FLASHATTN_LUAROCKS = "ON",
    FLASHATTN_LUAROCKS_LIBDIR = "$(LIBDIR)",
    FLASHATTN_LUAROCKS_LUADIR = "$(LUADIR)",
    LUA_INCLUDE_DIR = "$(LUA_INCDIR)",
  },
}
