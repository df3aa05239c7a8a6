#!/usr/bin/env bash
# The whole test suite: a release build, then an ASan+UBSan build (CPU
# backend), each through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
BUILD_DIR=build-asan CMAKE_ARGS="-DFLASHATTN_SANITIZE=ON -DFLASHATTN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo" \
  bash scripts/setup.sh
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)"
