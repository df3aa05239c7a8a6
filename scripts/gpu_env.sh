# Sourced by the GPU scripts (gpu_run.sh, gpu_ab.sh) on the device machine:
# unpacks the Debian packages of .deps (scripts/fetch_gpu_deps.sh) once and
# sets the paths that Lua, its modules and OpenBLAS are found by, and
# gpu_build DIR SRC, which configures and builds SRC for sm_90a into DIR.
D=$PWD/.deps/root
if [ ! -x "$D/usr/bin/lua5.4" ]; then
  for f in .deps/debs/*.deb .deps/debs-build/*.deb; do
    if [ -f "$f" ]; then dpkg-deb -x "$f" "$D"; fi # (debs-build: carried only for a build there)
  done
fi
ML=$D/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$ML:$ML/openblas-pthread:$D/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export LUA_PATH="$D/usr/share/lua/5.4/?.lua;$D/usr/share/lua/5.4/?/init.lua;;"
export LUA_CPATH="$ML/lua/5.4/?.so;;" PATH=$D/usr/bin:$PATH
gpu_build() { # DIR SRC [JOBS]
  cmake -S "$2" -B "$1" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DLUA_INCLUDE_DIR=$D/usr/include/lua5.4 -DLUA_LIBRARY=$ML/liblua5.4.so -DLUA_EXECUTABLE=$D/usr/bin/lua5.4 \
    -DCMAKE_LIBRARY_PATH=$ML/openblas-pthread -DCMAKE_INCLUDE_PATH="$D/usr/include/x86_64-linux-gnu/openblas-pthread" \
    -DCMAKE_C_FLAGS="-I$D/usr/include/x86_64-linux-gnu" && cmake --build "$1" -j"${3:-$(nproc)}"
}
