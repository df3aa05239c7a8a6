# Sourced first by a device command that runs a build packed by
# scripts/gpu_pack.sh: Lua from .deps (scripts/gpu_env.sh), the build
# unpacked into bg/ (always: a warm machine may keep an older one), $B,
# $COMMIT, $OUT, FLASHATTN_DEVICE=cuda.  The device tool brings back at most
# 8 files of $OUT: put logs elsewhere and tar them.
. scripts/gpu_env.sh
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT" bg
xz -dc .snap/bg.tar.xz | tar -xf - -C bg
ln -sf libflashattn.so.0.1.0 bg/libflashattn.so.0
ln -sf libflashattn.so.0.1.0 bg/libflashattn.so
ln -sf libflashattn-lua.so.0.1.0 bg/libflashattn-lua.so.0
ln -sf libflashattn-lua.so.0.1.0 bg/libflashattn-lua.so
# the interpreter with the module preloaded (CMake's flashattn-lua, linked here against the libraries)
cc -O2 -Iinclude -Ibg/include -I"$D/usr/include/lua5.4" -I"$D/usr/include/x86_64-linux-gnu" tests/c/lua_runner.c -o bg/flashattn-lua -Lbg -lflashattn-lua -lflashattn \
  "$ML/liblua5.4.so" -Wl,-rpath,"$PWD/bg"
export LD_LIBRARY_PATH=$PWD/bg:$LD_LIBRARY_PATH
export LUA_PATH="$PWD/tests/lua/?.lua;$PWD/lua/?.lua;$LUA_PATH"
export FLASHATTN_DEVICE=cuda
B=bg
COMMIT=$(cat .snap/commit 2>/dev/null || echo unknown)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
