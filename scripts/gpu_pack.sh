#!/usr/bin/env bash
# Packs a CUDA build made here (scripts/setup.sh builds build/ for sm_90a
# where nvcc is installed) for the device machine, so that a device call
# spends no time compiling:
#   bash scripts/fetch_gpu_deps.sh        # once: Lua and OpenBLAS as .debs in .deps/debs
#   bash scripts/gpu_pack.sh [build]      # .snap/bg.tar.xz (libflashattn.so, libflashattn-lua.so) + .snap/commit
#   bash scripts/gpu_pack.sh BUILD NAME   # .snap/ab/NAME.tar.xz + .snap/ab/NAME.commit (gpu_ab.sh, FA_CARRIED=1)
# then, on the device (carrying .deps/debs and .snap; the two must stay
# under the tool's 64 MiB), a command that begins with
#   . scripts/gpu_carried.sh
# finds the build in bg/ ($B), Lua on its paths and FLASHATTN_DEVICE=cuda.
#   bash scripts/gpu_pack.sh --bundle     # every .snap/ab/NAME.tar.xz (and an earlier bundle's builds) into one .snap/ab/bundle.tar.xz
# The bundle is a folder a build, compressed with a dictionary larger than one build (128 MiB): the
# builds of an A/B share most of their bytes, so a second build added about 3.5 MB where its own file
# was 23 MB.  On 2026-12-06 a build packed to 28.5 MB and each further one added about 9.7 MB: three
# fit beside .deps/debs (7.6 MB since the OpenBLAS -dev packages, which only a build made there
# needs, went into .deps/debs-build).  gpu_ab.sh's carried mode takes the bundle
# when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --bundle ]; then
  shopt -s nullglob
  tars=(.snap/ab/*.tar.xz)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # the builds of an earlier bundle stay, but for those packed again since
  [ -f .snap/ab/bundle.tar.xz ] && xz -dc .snap/ab/bundle.tar.xz | tar -xf - -C "$tmp"
  for t in "${tars[@]}"; do
    name=$(basename "$t" .tar.xz)
    [ "$name" = bundle ] && continue
    rm -rf "${tmp:?}/$name" && mkdir -p "$tmp/$name" && xz -dc "$t" | tar -xf - -C "$tmp/$name"
  done
  [ -n "$(ls "$tmp")" ] || { echo "gpu_pack: no .snap/ab/NAME.tar.xz to bundle" >&2; exit 1; }
  (cd "$tmp" && tar -cf - -- *) | xz -T1 --lzma2=preset=6,dict=128MiB > .snap/ab/bundle.tar.xz
  for t in "${tars[@]}"; do [ "$(basename "$t")" = bundle.tar.xz ] || rm -f "$t"; done
  ls -la .snap/ab/bundle.tar.xz
  exit 0
fi
B=${1:-build}
NAME=${2:-} # given: .snap/ab/NAME.tar.xz and .snap/ab/NAME.commit, a build for scripts/gpu_ab.sh's carried mode
[ -f "$B/libflashattn-lua.so.0.1.0" ] && [ -f "$B/libflashattn.so.0.1.0" ] || { echo "gpu_pack: no build in $B" >&2; exit 1; }
grep -qs "sm_90a" "$B/CMakeFiles/flashattn_objects.dir/flags.make" || { echo "gpu_pack: $B was not built for sm_90a" >&2; exit 1; }
mkdir -p .snap
# the shared libraries only: flashattn-lua holds the engine whole again (twice the bytes), so
# scripts/gpu_carried.sh links tests/c/lua_runner.c against them there
# (a build for sm_90a alone, -DCMAKE_CUDA_ARCHITECTURES=90a-real, packs to about 17 MB: two fit
# beside .deps/debs for an A/B)
tar_file=.snap/bg.tar.xz commit_file=.snap/commit
[ -n "$NAME" ] && mkdir -p .snap/ab && tar_file=.snap/ab/$NAME.tar.xz commit_file=.snap/ab/$NAME.commit
tar -cf - -C "$B" libflashattn.so.0.1.0 libflashattn-lua.so.0.1.0 include/flashattn_version.h | xz -T2 -7 > "$tar_file"
# the commit of the tree the build was made from (a base for an A/B may be a git worktree)
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt")
# (HEAD-dirty where the tree had changes not committed, as git describe --dirty says it)
commit=$(git -C "${src:-.}" rev-parse --short HEAD)
if ! git -C "${src:-.}" diff --quiet HEAD -- . ':!.snap'; then
  commit=$commit-dirty
  echo "gpu_pack: the tree of $B has changes not committed; $commit_file says $commit" >&2
fi
echo "$commit" > "$commit_file"
ls -la "$tar_file"
