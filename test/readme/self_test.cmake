# The README check must catch what is wrong: runs cmake/ReadmeCheck.cmake on broken.md (next to this file) and
# expects it to fail, naming exactly the three broken blocks (a compile error, a failing program, a misspelt mark)
# by file and line, with the compiler's error pointing into broken.md, and passing the good blocks.
#
#   cmake -DBINARY_DIR=... -DPREFIX=... -DCXX_COMPILER=... [-DGENERATOR=...] [-DBUILD_TYPE=...] -P self_test.cmake

set(_md "${CMAKE_CURRENT_LIST_DIR}/broken.md")
set(_script "${CMAKE_CURRENT_LIST_DIR}/../../cmake/ReadmeCheck.cmake")
file(REAL_PATH "${_md}" _md)

# Line numbers from the fixture itself: the fence after each BROKEN-* paragraph, the misspelt mark, and the line of
# the typo. Walked with string(FIND): the lines hold ';', which a CMake list would split.
file(READ "${_md}" _rest)
set(_n 0)
set(_want "")
while(NOT _rest STREQUAL "")
  string(FIND "${_rest}" "\n" _nl)
  if(_nl EQUAL -1)
    set(_l "${_rest}")
    set(_rest "")
  else()
    string(SUBSTRING "${_rest}" 0 ${_nl} _l)
    math(EXPR _after "${_nl} + 1")
    string(SUBSTRING "${_rest}" ${_after} -1 _rest)
  endif()
  math(EXPR _n "${_n} + 1")
  if(_l MATCHES "^BROKEN-([A-Z]+):")
    set(_want "${CMAKE_MATCH_1}")
  elseif(_want STREQUAL "MARK" AND _l MATCHES "^<!-- readme-check")
    set(_line_MARK ${_n})
    set(_want "")
  elseif(NOT _want STREQUAL "" AND _l MATCHES "^```")
    set(_line_${_want} ${_n})
    set(_want "")
  elseif(_l MATCHES "KimiK3")
    set(_line_TYPO ${_n})
  endif()
endwhile()
foreach(_what COMPILE TYPO RUN MARK)
  if(NOT _line_${_what})
    message(FATAL_ERROR "self_test.cmake: broken.md has lost its ${_what} case")
  endif()
endforeach()

execute_process(
  COMMAND "${CMAKE_COMMAND}" "-DREADME=${_md}" "-DBINARY_DIR=${BINARY_DIR}" "-DPREFIX=${PREFIX}"
    "-DCXX_COMPILER=${CXX_COMPILER}" "-DGENERATOR=${GENERATOR}" "-DBUILD_TYPE=${BUILD_TYPE}" -P "${_script}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message(STATUS "ReadmeCheck.cmake on broken.md (exit status ${_rc}):\n${_out}")

set(_missing "")
foreach(_expect
    "${_md}:${_line_COMPILE}: the C++ block starting here does not compile"
    "${_md}:${_line_TYPO}:"
    "${_md}:${_line_RUN}: the program of the C++ block starting here exited with status 3"
    "${_md}:${_line_MARK}: unknown mark 'readme-check: no-rnu'"
    "3 of 7 C++ blocks of broken.md failed:"
    "broken.md:17: builds and runs (exit status 0)"
    "broken.md:26: builds (no-main: not run)"
    "broken.md:34: fragment, not built"
    "broken.md:41: builds (no-run: not run)")
  string(FIND "${_out}" "${_expect}" _pos)
  if(_pos EQUAL -1)
    string(APPEND _missing "  ${_expect}\n")
  endif()
endforeach()
if(_rc EQUAL 0)
  message(FATAL_ERROR "ReadmeCheck.cmake passed broken.md, which has three broken blocks")
endif()
if(NOT _missing STREQUAL "")
  message(FATAL_ERROR "ReadmeCheck.cmake failed on broken.md, but its output lacks:\n${_missing}")
endif()
message(STATUS "ReadmeCheck.cmake names every broken block of broken.md and passes the others")
