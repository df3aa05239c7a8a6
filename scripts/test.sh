#!/usr/bin/env bash
# The whole test suite, each stage through CTest (README "Reliability"):
#   release   build/: the release build (CUDA kernels compiled when nvcc is
#             found), every test;
#   asan      build-asan/: ASan+UBSan, CPU backend, every test (the Lua
#             fuzzer and the out-of-memory walks included);
#   valgrind  build-valgrind/: no sanitizers, no CUDA; the `valgrind` label
#             (memcheck: zero errors, zero leaks; a subset, see
#             tests/CMakeLists.txt);
#   tsan      build-tsan/: ThreadSanitizer (gcc), CPU backend; the `tsan`
#             label (tests/c/test_threads.c);
#   fuzz      build-fuzz/: clang, ASan+UBSan and libFuzzer coverage; the
#             `libfuzzer` label (tests/fuzz/fuzz_capi.c for 30 s, the .npy and
#             .safetensors readers, tests/fuzz/fuzz_io.c, for 20 s).
# FLASHATTN_TEST_STAGES="release asan" runs some of them (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
STAGES=" ${FLASHATTN_TEST_STAGES:-release asan valgrind tsan fuzz} "
J=-j"$(nproc)"
stage() { [[ "$STAGES" == *" $1 "* ]]; }
banner() { printf '\n==== %s ====\n' "$*"; }

bash scripts/setup.sh # packages, and build/ (needed by every stage: it installs the packages)

if stage release; then
  banner "release build: every test"
  ctest --test-dir build --output-on-failure "$J"
fi

if stage asan; then
  banner "ASan+UBSan build: every test"
  BUILD_DIR=build-asan CMAKE_ARGS="-DFLASHATTN_SANITIZE=ON -DFLASHATTN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo" \
    bash scripts/setup.sh
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure "$J"
fi

if stage valgrind; then
  banner "valgrind memcheck (label valgrind)"
  BUILD_DIR=build-valgrind \
    CMAKE_ARGS="-DFLASHATTN_CUDA=OFF -DFLASHATTN_VALGRIND=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo" bash scripts/setup.sh
  ctest --test-dir build-valgrind -L valgrind --output-on-failure "$J"
fi

if stage tsan; then
  banner "ThreadSanitizer (label tsan)"
  # FA_NO_CPU_CLONES: GCC's ifunc resolvers for the AVX2/AVX-512 clones run
  # before the TSan runtime is up and crash when instrumented
  cmake -S . -B build-tsan -DFLASHATTN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_C_FLAGS=-fsanitize=thread -DFA_NO_CPU_CLONES" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DCMAKE_MODULE_LINKER_FLAGS=-fsanitize=thread
  cmake --build build-tsan "$J" --target test_threads
  ctest --test-dir build-tsan -L tsan --output-on-failure
fi

if stage fuzz; then
  banner "libFuzzer (label libfuzzer)"
  CC=clang cmake -S . -B build-fuzz -DFLASHATTN_SANITIZE=ON -DFLASHATTN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link
  cmake --build build-fuzz "$J" --target fuzz_capi fuzz_io
  ctest --test-dir build-fuzz -L libfuzzer --output-on-failure
fi
