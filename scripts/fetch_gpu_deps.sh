#!/usr/bin/env bash
# Downloads the Debian packages that the GPU machine lacks (Lua, LuaUnit,
# lua-cjson, lua-argparse, lua-term, OpenBLAS): what running a build needs into .deps/debs, which
# the device tool carries (with a build packed here, scripts/gpu_pack.sh, that alone: 7.6 MB), and
# OpenBLAS's headers and link libraries, which only a build made there needs, into .deps/debs-build
# (carry .deps whole for that; scripts/gpu_env.sh unpacks both).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs .deps/debs-build
(cd .deps/debs && apt-get download lua5.4 liblua5.4-0 liblua5.4-dev lua-unit lua-argparse lua-term libreadline8 lua-cjson \
  libopenblas0-pthread libgomp1 libdlpack-dev)
(cd .deps/debs-build && apt-get download libopenblas-dev libopenblas-pthread-dev)
