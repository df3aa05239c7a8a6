#!/usr/bin/env bash
# Installs what the build needs (Debian packages, as root or through sudo),
# then configures and builds.  BUILD_DIR (default build) and CMAKE_ARGS
# choose the build tree and extra CMake options.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="cmake make gcc pkg-config lua5.4 liblua5.4-dev lua-unit libopenblas-dev lua-cjson lua-argparse gnuplot-nox"
# the reliability stages of scripts/test.sh: valgrind; clang with libFuzzer and OpenMP
PKGS="$PKGS valgrind clang libclang-rt-dev libomp-dev"
# the scripts' progress bar: drawn only when stderr is a terminal (term.isatty)
PKGS="$PKGS lua-term"
PKGS="$PKGS libdlpack-dev python3-numpy"  # DLPack (issue 23)
# packaging (issue 23): flashattn.h compiled as C++ (g++), the rockspec built by luarocks make
PKGS="$PKGS g++ luarocks"
missing=()
for p in $PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$BUILD" -j"$(nproc)"
