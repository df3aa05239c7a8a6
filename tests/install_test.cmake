# Installs the build into a fresh prefix and uses it from there only, as a
# user would after `cmake --install`:
#   - the files: headers (flashattn.h, flashattn_version.h), libflashattn and
#     libflashattn-lua (.so and .a), the module, flashattn.pc and
#     flashattn-lua.pc, the CMake package, the interpreter;
#   - the module with the system lua5.4 (require through LUA_CPATH);
#   - the installed interpreter;
#   - tests/c/plain_host.c (no Lua) and examples/host_plugin.c (embeds Lua)
#     built against the prefix through pkg-config and through
#     find_package(flashattn CONFIG) (shared and static libraries), and run.
#   cmake -DBUILD_DIR=... -DPREFIX=... -DLUA=... -DLIBDIR=lib -DDATADIR=share -DSMOKE=smoke_module.lua
#         -DSRC_DIR=<repo> -DVERSION=x.y.z -DCC=cc -DPKG_CONFIG=pkg-config
#         [-DSAN_ENV=...] [-DSAN_FLAGS=...] [-DRUN_ENV=...] -P install_test.cmake
# SAN_ENV: environment for the uninstrumented lua5.4 in a sanitizer build;
# SAN_FLAGS: compiler flags the hosts need to link an instrumented library;
# RUN_ENV: environment for the hosts.
include(${CMAKE_CURRENT_LIST_DIR}/script_util.cmake)
fa_require_vars(install_test.cmake BUILD_DIR PREFIX LUA LIBDIR DATADIR SMOKE SRC_DIR VERSION CC)
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "install_test.cmake: pkg-config was not found (scripts/setup.sh installs it)")
endif()

file(REMOVE_RECURSE "${PREFIX}")
fa_run("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}")

set(libdir "${PREFIX}/${LIBDIR}")
set(module "${libdir}/lua/5.4/flashattn.so")
foreach(f "${module}" "${PREFIX}/include/flashattn.h" "${PREFIX}/include/flashattn_version.h"
          "${PREFIX}/bin/flashattn-lua" "${libdir}/libflashattn.so" "${libdir}/libflashattn.a"
          "${libdir}/libflashattn-lua.so" "${libdir}/libflashattn-lua.a"
          "${libdir}/pkgconfig/flashattn.pc" "${libdir}/pkgconfig/flashattn-lua.pc"
          "${libdir}/cmake/flashattn/flashattnConfig.cmake" "${libdir}/cmake/flashattn/flashattnConfigVersion.cmake"
          "${PREFIX}/${DATADIR}/doc/flashattn/LICENSE")
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
if(NOT IS_SYMLINK "${module}")
  message(FATAL_ERROR "${module} is not the symlink to libflashattn-lua.so.0")
endif()

# the module, from the prefix only (no build tree on any path)
# (the paths through the environment: fa_run's arguments are a list, ";" splits)
set(ENV{LUA_CPATH} "${libdir}/lua/5.4/?.so")
set(ENV{LUA_PATH} "${PREFIX}/${DATADIR}/lua/5.4/?.lua;${PREFIX}/${DATADIR}/lua/5.4/?/init.lua;;")
fa_run("the installed module with ${LUA}" "${CMAKE_COMMAND}" -E env ${SAN_ENV} "${LUA}" "${SMOKE}" "${module}")
unset(ENV{LUA_CPATH})
unset(ENV{LUA_PATH})

# the installed interpreter (engine linked in)
fa_run("the installed flashattn-lua" "${CMAKE_COMMAND}" -E env ${RUN_ENV}
    "${PREFIX}/bin/flashattn-lua" -e
    "local fa = require 'flashattn' assert(fa.zeros(2, 3):numel() == 6) assert(fa.version == '${VERSION}') print('flashattn-lua ' .. fa.version)")

set(work "${PREFIX}-hosts")
file(REMOVE_RECURSE "${work}")
file(MAKE_DIRECTORY "${work}")
set(plain_src "${SRC_DIR}/tests/c/plain_host.c")
set(plugin_src "${SRC_DIR}/examples/host_plugin.c")
set(plugin_def "-DFA_PLUGIN_SCRIPT=\"${SRC_DIR}/examples/plugin_script.lua\"")

# ---- pkg-config ----
set(pc_env "PKG_CONFIG_PATH=${libdir}/pkgconfig")
function(pc_flags var)
  execute_process(COMMAND "${CMAKE_COMMAND}" -E env "${pc_env}" "${PKG_CONFIG}" ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config ${ARGN} failed (${rc}): ${err}")
  endif()
  separate_arguments(out UNIX_COMMAND "${out}")
  set(${var} ${out} PARENT_SCOPE)
endfunction()
pc_flags(pc_version --modversion flashattn)
if(NOT pc_version STREQUAL VERSION)
  message(FATAL_ERROR "pkg-config --modversion flashattn: ${pc_version}, expected ${VERSION}")
endif()
pc_flags(fa_cflags --cflags flashattn)
pc_flags(fa_libs --libs flashattn)
pc_flags(fa_lua_cflags --cflags flashattn-lua)
pc_flags(fa_lua_libs --libs flashattn-lua)
foreach(flag ${fa_cflags} ${fa_libs})
  if(flag MATCHES "lua")
    message(FATAL_ERROR "pkg-config flashattn names Lua: ${flag}")
  endif()
endforeach()
fa_run("cc plain_host.c $(pkg-config flashattn)" "${CC}" ${SAN_FLAGS} ${fa_cflags} "${plain_src}" -o "${work}/plain_host_pc"
    ${fa_libs} -lm "-Wl,-rpath,${libdir}")
fa_run("plain_host (pkg-config)" "${CMAKE_COMMAND}" -E env ${RUN_ENV} "${work}/plain_host_pc" "${VERSION}")
fa_run("cc host_plugin.c $(pkg-config flashattn-lua)" "${CC}" ${SAN_FLAGS} ${fa_lua_cflags} "${plugin_def}" "${plugin_src}"
    -o "${work}/host_plugin_pc" ${fa_lua_libs} -lm "-Wl,-rpath,${libdir}")
fa_run("host_plugin (pkg-config)" "${CMAKE_COMMAND}" -E env ${RUN_ENV} "${work}/host_plugin_pc")
if(NOT run_out MATCHES "host_plugin: OK")
  message(FATAL_ERROR "host_plugin (pkg-config) did not report OK")
endif()

# ---- find_package(flashattn CONFIG) ----
file(MAKE_DIRECTORY "${work}/consumer")
file(WRITE "${work}/consumer/CMakeLists.txt" "cmake_minimum_required(VERSION 3.24)
project(flashattn_consumer C)
find_package(flashattn ${VERSION} CONFIG REQUIRED)
if(NOT flashattn_VERSION STREQUAL \"${VERSION}\")
  message(FATAL_ERROR \"flashattn_VERSION \${flashattn_VERSION}\")
endif()
add_executable(plain_host \"${plain_src}\")
target_link_libraries(plain_host PRIVATE flashattn::flashattn m)
add_executable(plain_host_static \"${plain_src}\")
target_link_libraries(plain_host_static PRIVATE flashattn::flashattn_static m)
add_executable(host_plugin \"${plugin_src}\")
target_compile_definitions(host_plugin PRIVATE [[${plugin_def}]])
target_link_libraries(host_plugin PRIVATE flashattn::lua m)
add_executable(host_plugin_static \"${plugin_src}\")
target_compile_definitions(host_plugin_static PRIVATE [[${plugin_def}]])
target_link_libraries(host_plugin_static PRIVATE flashattn::lua_static m)
")
string(REPLACE ";" " " san_flags "${SAN_FLAGS}")
fa_run("cmake configure of a find_package(flashattn) project"
    "${CMAKE_COMMAND}" -S "${work}/consumer" -B "${work}/consumer/build" "-DCMAKE_PREFIX_PATH=${PREFIX}"
    "-DCMAKE_C_COMPILER=${CC}" "-DCMAKE_C_FLAGS=${san_flags}" -DCMAKE_BUILD_TYPE=Release)
fa_run("cmake build of the find_package(flashattn) project" "${CMAKE_COMMAND}" --build "${work}/consumer/build")
foreach(exe plain_host plain_host_static)
  fa_run("${exe} (find_package)" "${CMAKE_COMMAND}" -E env ${RUN_ENV} "${work}/consumer/build/${exe}" "${VERSION}")
endforeach()
foreach(exe host_plugin host_plugin_static)
  fa_run("${exe} (find_package)" "${CMAKE_COMMAND}" -E env ${RUN_ENV} "${work}/consumer/build/${exe}")
  if(NOT run_out MATCHES "host_plugin: OK")
    message(FATAL_ERROR "${exe} (find_package) did not report OK")
  endif()
endforeach()

file(REMOVE_RECURSE "${PREFIX}" "${work}")
