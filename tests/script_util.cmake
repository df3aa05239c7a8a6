# Helpers for the cmake -P test scripts (install_test.cmake,
# luarocks_test.cmake, header_test.cmake, library_symbols.cmake).

# fa_require_vars(script VAR...): a FATAL_ERROR naming the first -D not given.
function(fa_require_vars script)
  foreach(v ${ARGN})
    if(NOT DEFINED ${v})
      message(FATAL_ERROR "${script}: ${v} is not set")
    endif()
  endforeach()
endfunction()

# fa_run(what COMMAND...): runs the command, prints its output, stops with
# both outputs when it fails; run_out gets its standard output.  The
# arguments are a list: pass texts holding ";" through the environment.
function(fa_run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(run_out "${out}" PARENT_SCOPE)
endfunction()
