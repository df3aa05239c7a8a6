#!/usr/bin/env bash
# Packs a CUDA build made here (scripts/setup.sh builds build/ for sm_90a
# where nvcc is installed) for the device machine, so that a device call
# spends no time compiling:
#   bash scripts/fetch_gpu_deps.sh        # once: Lua and OpenBLAS as .debs in .deps/debs
#   bash scripts/gpu_pack.sh [build]      # .snap/bg.tar.xz (libflashattn.so, libflashattn-lua.so) + .snap/commit
# then, on the device (carrying .deps/debs and .snap; the two must stay
# under the tool's 64 MiB), a command that begins with
#   . scripts/gpu_carried.sh
# finds the build in bg/ ($B), Lua on its paths and FLASHATTN_DEVICE=cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
[ -f "$B/libflashattn-lua.so.0.1.0" ] && [ -f "$B/libflashattn.so.0.1.0" ] || { echo "gpu_pack: no build in $B" >&2; exit 1; }
grep -qs "sm_90a" "$B/CMakeFiles/flashattn_objects.dir/flags.make" || { echo "gpu_pack: $B was not built for sm_90a" >&2; exit 1; }
mkdir -p .snap
# the shared libraries only: flashattn-lua holds the engine whole again (twice the bytes), so
# scripts/gpu_carried.sh links tests/c/lua_runner.c against them there
tar -cf - -C "$B" libflashattn.so.0.1.0 libflashattn-lua.so.0.1.0 include/flashattn_version.h | xz -T2 -7 > .snap/bg.tar.xz
git rev-parse --short HEAD > .snap/commit
git diff --quiet HEAD -- . ':!.snap' || echo "gpu_pack: the tree has changes not committed; .snap/commit names HEAD" >&2
ls -la .snap/bg.tar.xz
