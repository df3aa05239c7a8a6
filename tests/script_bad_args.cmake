# Every user script under scripts/ answers an unknown option with a one-line
# error on stderr and exit status 1 (docs/perf/README.md, "Sweeps"), before
# it does any work: run with -DLUA=<flashattn-lua> -DSRC=<source dir>.
include(${CMAKE_CURRENT_LIST_DIR}/script_util.cmake)
fa_require_vars(script_bad_args.cmake LUA SRC)
file(GLOB scripts RELATIVE ${SRC} ${SRC}/scripts/*.lua)
list(LENGTH scripts count)
if(count LESS 10)
  message(FATAL_ERROR "script_bad_args.cmake: found only ${count} scripts under ${SRC}/scripts")
endif()
set(failed "")
foreach(s ${scripts})
  execute_process(COMMAND ${LUA} ${s} --no-such-option WORKING_DIRECTORY ${SRC} TIMEOUT 60
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(STRIP "${err}" line)
  string(FIND "${line}" "\n" newline)
  if(NOT rc EQUAL 1 OR line STREQUAL "" OR NOT newline EQUAL -1)
    string(APPEND failed "${s}: status ${rc}, stderr:\n${err}\n")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "scripts that do not answer --no-such-option with one line and status 1:\n${failed}")
endif()
message("${count} scripts answer an unknown option with one line and status 1")
