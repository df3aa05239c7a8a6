#!/usr/bin/env bash
# The main job: set up, build, and run the demo sweep on the default device
# (the GPU when there is one, else the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export LUA_CPATH="$PWD/build/lua/?.so;;" LUA_PATH="$PWD/build/lua/?.lua;$PWD/lua/?.lua;;"
lua5.4 scripts/demo_sweep.lua "$@"
