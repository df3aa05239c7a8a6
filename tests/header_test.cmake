# flashattn.h compiles as C++ and as strict C11 (API §7):
#   cmake -DCXX=g++ -DCC=gcc -DINCLUDES="dir;dir" -DLIB=libflashattn.so -DSRC=cxx_header_test.cpp
#         -DWORK=dir [-DFLAGS="-fsanitize=..."] -P header_test.cmake
# The C++ translation unit (tests/c/cxx_header_test.cpp) is compiled with
# -std=c++11 -Wall -Wextra -pedantic -Werror, linked against the shared
# library and run (C linkage checked, not only parsed); the header alone is
# compiled as C11 with the same warnings.
include(${CMAKE_CURRENT_LIST_DIR}/script_util.cmake)
fa_require_vars(header_test.cmake CXX CC INCLUDES LIB SRC WORK)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(incs "")
foreach(d ${INCLUDES})
  list(APPEND incs "-I${d}")
endforeach()
set(warn -Wall -Wextra -pedantic -Werror)
get_filename_component(libdir "${LIB}" DIRECTORY)

fa_run("g++ on flashattn.h" "${CXX}" -std=c++11 ${warn} ${incs} ${FLAGS} "${SRC}" -o "${WORK}/cxx_header_test"
    "${LIB}" "-Wl,-rpath,${libdir}")
fa_run("the C++ program" "${WORK}/cxx_header_test")

file(WRITE "${WORK}/c_header_test.c" "#include \"flashattn.h\"\nint main(void) { return fa_version() == 0; }\n")
fa_run("cc -std=c11 -pedantic on flashattn.h" "${CC}" -std=c11 ${warn} ${incs} -fsyntax-only "${WORK}/c_header_test.c")
message("flashattn.h: C++11 and C11 -Wall -Wextra -pedantic clean")
