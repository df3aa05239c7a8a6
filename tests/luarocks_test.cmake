# `luarocks make` of rockspecs/ into a local tree, then require "flashattn"
# from that tree with the system lua5.4 and run a small attention call:
#   cmake -DSRC_DIR=<repo> -DWORK=dir -DLUAROCKS=luarocks -DLUA=lua5.4 -DSMOKE=smoke_module.lua
#         -DVERSION=x.y.z -P luarocks_test.cmake
# The sources are copied to WORK first (luarocks builds in ./build.luarocks),
# the CUDA backend is off (FLASHATTN_CUDA=OFF) and the build uses 2 jobs.
include(${CMAKE_CURRENT_LIST_DIR}/script_util.cmake)
fa_require_vars(luarocks_test.cmake SRC_DIR WORK LUAROCKS LUA SMOKE VERSION)

file(REMOVE_RECURSE "${WORK}")
set(src "${WORK}/src")
set(tree "${WORK}/tree")
file(MAKE_DIRECTORY "${src}")
foreach(d cmake include src kernels lua rockspecs)
  file(COPY "${SRC_DIR}/${d}" DESTINATION "${src}")
endforeach()
file(COPY "${SRC_DIR}/CMakeLists.txt" "${SRC_DIR}/LICENSE" DESTINATION "${src}")
file(GLOB rockspec RELATIVE "${src}" "${src}/rockspecs/flashattn-*.rockspec")

execute_process(COMMAND "${CMAKE_COMMAND}" -E env FLASHATTN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=2
                        "${LUAROCKS}" make --tree "${tree}" --lua-version 5.4 ${rockspec}
                WORKING_DIRECTORY "${src}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "luarocks make ${rockspec} failed (${rc}):\n${out}\n${err}")
endif()
message("luarocks make ${rockspec}: installed into ${tree}")

set(module "${tree}/lib/lua/5.4/flashattn.so")
foreach(f "${module}" "${tree}/share/lua/5.4/flashattn/sweep.lua")
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR "luarocks make did not install ${f}")
  endif()
endforeach()
# (the paths through the environment: fa_run's arguments are a list, ";" splits)
set(ENV{LUA_CPATH} "${tree}/lib/lua/5.4/?.so")
set(ENV{LUA_PATH} "${tree}/share/lua/5.4/?.lua;${tree}/share/lua/5.4/?/init.lua;;")
fa_run("require 'flashattn' from the rock tree" "${LUA}" "${SMOKE}" "${module}")
fa_run("fa.version from the rock tree" "${LUA}" -e
    "local fa = require 'flashattn' assert(fa.version == '${VERSION}', fa.version) print('rock: flashattn ' .. fa.version)")
file(REMOVE_RECURSE "${WORK}")
