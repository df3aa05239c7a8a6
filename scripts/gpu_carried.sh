# Sourced first by a device command that runs a build packed by
# scripts/gpu_pack.sh: Lua from .deps (scripts/gpu_env.sh), the build
# unpacked into bg/ (always: a warm machine may keep an older one), $B,
# $COMMIT (the pack's, also exported as FA_COMMIT unless that is set), $OUT,
# FLASHATTN_DEVICE=cuda.  The device tool brings back at most
# 8 files of $OUT: put logs elsewhere and tar them.  FA_NO_BG=1: only the
# paths and carried_unpack (scripts/gpu_ab.sh's carried builds).
. scripts/gpu_env.sh
export OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
# carried_unpack TAR DIR: a packed build into DIR, with the interpreter (CMake's flashattn-lua:
# tests/c/lua_runner.c, the module preloaded) linked there against its libraries, both needed by
# the interpreter itself (the module's RUNPATH names the build tree here) and found by its DT_RPATH
# before LD_LIBRARY_PATH: two builds side by side must not take each other's
carried_unpack() {
  mkdir -p "$2"
  xz -dc "$1" | tar -xf - -C "$2"
  carried_finish "$2"
}
# carried_bundle TAR DIR: every build of a bundle (scripts/gpu_pack.sh --bundle: a folder a build) into
# DIR/NAME, each finished as carried_unpack does
carried_bundle() {
  mkdir -p "$2"
  xz -dc "$1" | tar -xf - -C "$2"
  local d
  for d in "$2"/*/; do carried_finish "${d%/}" || return 1; done
}
# carried_finish DIR: the libraries' links and the interpreter, for a build unpacked into DIR
carried_finish() {
  ln -sf libflashattn.so.0.1.0 "$1/libflashattn.so.0" && ln -sf libflashattn.so.0.1.0 "$1/libflashattn.so"
  ln -sf libflashattn-lua.so.0.1.0 "$1/libflashattn-lua.so.0" && ln -sf libflashattn-lua.so.0.1.0 "$1/libflashattn-lua.so"
  local dir
  dir=$(cd "$1" && pwd)
  cc -O2 -Iinclude -I"$dir/include" -I"$D/usr/include/lua5.4" -I"$D/usr/include/x86_64-linux-gnu" tests/c/lua_runner.c \
    -o "$dir/flashattn-lua" -L"$dir" -Wl,--no-as-needed -lflashattn-lua -lflashattn -Wl,--as-needed "$ML/liblua5.4.so" \
    -Wl,--disable-new-dtags,-rpath,"$dir"
}
export LUA_PATH="$PWD/tests/lua/?.lua;$PWD/lua/?.lua;$LUA_PATH"
export FLASHATTN_DEVICE=cuda
if [[ ${FA_NO_BG:-0} != 1 ]]; then
  carried_unpack .snap/bg.tar.xz bg
  export LD_LIBRARY_PATH=$PWD/bg:$LD_LIBRARY_PATH
  B=bg
  COMMIT=$(cat .snap/commit 2>/dev/null || echo unknown)
  # the commit that the results' JSONs name (lua/flashattn/sweep.lua's commit(), the scripts' --commit): the
  # build's, not the working tree's HEAD that this copy carries
  export FA_COMMIT=${FA_COMMIT:-$COMMIT}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
