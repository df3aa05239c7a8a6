#!/usr/bin/env bash
# Downloads the Debian packages that the GPU machine lacks (Lua, LuaUnit,
# lua-cjson, lua-argparse, lua-term, OpenBLAS) into .deps/debs, which the device tool carries.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs
cd .deps/debs
apt-get download lua5.4 liblua5.4-0 liblua5.4-dev lua-unit lua-argparse lua-term libreadline8 lua-cjson libopenblas0-pthread \
  libopenblas-dev libopenblas-pthread-dev libgomp1 libdlpack-dev
