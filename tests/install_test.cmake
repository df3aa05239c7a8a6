# Installs the build into a fresh prefix and loads the module from there with
# the system lua5.4, as a user would after `cmake --install`.
#   cmake -DBUILD_DIR=... -DPREFIX=... -DLUA=... -DLIBDIR=lib -DDATADIR=share
#         -DSMOKE=smoke_module.lua [-DSAN_ENV=...] -P install_test.cmake
foreach(v BUILD_DIR PREFIX LUA LIBDIR DATADIR SMOKE)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_test.cmake: ${v} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc}):\n${out}\n${err}")
endif()

set(module "${PREFIX}/${LIBDIR}/lua/5.4/flashattn.so")
foreach(f "${module}" "${PREFIX}/include/flashattn.h" "${PREFIX}/bin/flashattn-lua")
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
file(GLOB libs "${PREFIX}/${LIBDIR}/libflashattn.a" "${PREFIX}/${LIBDIR}/libflashattn.so*")
if(NOT libs)
  message(FATAL_ERROR "no libflashattn.a / libflashattn.so under ${PREFIX}/${LIBDIR}")
endif()

# the module, from the prefix only (no build tree on any path)
execute_process(COMMAND "${CMAKE_COMMAND}" -E env
                        "LUA_CPATH=${PREFIX}/${LIBDIR}/lua/5.4/?.so"
                        "LUA_PATH=${PREFIX}/${DATADIR}/lua/5.4/?.lua;${PREFIX}/${DATADIR}/lua/5.4/?/init.lua;;"
                        ${SAN_ENV}
                        "${LUA}" "${SMOKE}" "${module}"
                WORKING_DIRECTORY "${PREFIX}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed module failed to load or run (${rc}):\n${err}")
endif()

# the installed interpreter (engine linked in)
execute_process(COMMAND "${PREFIX}/bin/flashattn-lua" -e
                        "local fa = require 'flashattn'; assert(fa.zeros(2, 3):numel() == 6); print('flashattn-lua ' .. fa.version)"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed flashattn-lua failed (${rc}):\n${err}")
endif()
file(REMOVE_RECURSE "${PREFIX}")
