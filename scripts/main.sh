#!/usr/bin/env bash
# The main job: set up, build, and run the default sweep (scripts/sweep.lua)
# on the default device: the GPU when there is one, else the CPU.  Should the
# GPU have no attention kernel (a build without one), its attention points
# are recorded as failed, with the engine's message, and the same points run
# on the CPU.  Leaves out/<part>.csv, out/<part>.json and charts
# (out/<part>_*.png and .svg) for the parts softmax, attention, masks, tiles.
# Extra arguments go to scripts/sweep.lua (e.g. --out DIR, --progress lines).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export LUA_CPATH="$PWD/build/lua/?.so;;" LUA_PATH="$PWD/lua/?.lua;$PWD/build/lua/?.lua;;"
lua5.4 scripts/sweep.lua "$@"
