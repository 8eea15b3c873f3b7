# README code check, run by ctest in script mode after `cmake --install` into PREFIX: every C++ code block of a
# Markdown file is built against the installed package, in a project whose CMakeLists.txt is the file's own
# CMake block, and run.
#
#   cmake -DREADME=<file.md> -DBINARY_DIR=<dir> -DPREFIX=<prefix> -DCXX_COMPILER=<c++>
#         [-DGENERATOR=...] [-DBUILD_TYPE=Release] [-DRUN_TIMEOUT=<seconds, 300>] -P ReadmeCheck.cmake
#
# Conventions (README.md, "Using the package"). A block is fenced with ``` and a language: cpp (or c++, cxx, cc)
# blocks are C++, cmake blocks CMake; others are not looked at. An HTML comment on the last non-blank line before
# the opening fence (invisible on GitHub) says what the block is:
#
#   (none)                                  a complete program: built, then run; it must exit with status 0
#   <!-- readme-check: no-run -->           a complete program that needs input the test lacks (a checkpoint,
#                                           arguments): built, not run
#   <!-- readme-check: no-main -->          declarations only (types, static_asserts): built with `int main() {}`
#                                           appended
#   <!-- readme-check: fragment -->         part of a program, shown for reading: not built
#   <!-- readme-check: CMakeLists.txt -->   on the one cmake block every C++ block is built with (its first
#                                           add_executable(<name> <source>) names the program and its source)
#
# Each block is compiled with `#line` pointing into the Markdown file, so a compiler error names README.md and the
# line. The check goes through every block and then fails, naming each failed block by file and line.

foreach(_var README BINARY_DIR PREFIX CXX_COMPILER)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "ReadmeCheck.cmake: -D${_var}=... is required")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
if(NOT RUN_TIMEOUT)
  set(RUN_TIMEOUT 300)
endif()
if(NOT EXISTS "${README}")
  message(FATAL_ERROR "ReadmeCheck.cmake: no such file: ${README}")
endif()
if(NOT EXISTS "${PREFIX}")
  message(FATAL_ERROR "${PREFIX} does not exist: run the consumer.install test first")
endif()
file(REAL_PATH "${README}" README)
get_filename_component(_md_name "${README}" NAME)
set(_max_output_lines 60)

# Returns the first <count> lines of <text> in <out>.
function(_head text count out)
  set(_result "")
  set(_rest "${text}")
  foreach(_i RANGE 1 ${count})
    string(FIND "${_rest}" "\n" _nl)
    if(_nl EQUAL -1)
      string(APPEND _result "${_rest}")
      set(_rest "")
      break()
    endif()
    math(EXPR _after "${_nl} + 1")
    string(SUBSTRING "${_rest}" 0 ${_after} _line)
    string(SUBSTRING "${_rest}" ${_after} -1 _rest)
    string(APPEND _result "${_line}")
  endforeach()
  if(NOT _rest STREQUAL "")
    string(APPEND _result "... (output cut after ${count} lines)\n")
  endif()
  set(${out} "${_result}" PARENT_SCOPE)
endfunction()

# ---------------------------------------------------------------------------
# 1. Extract. Lines are walked with string(FIND) rather than as a CMake list: code is full of ';' and brackets.
#    Each C++ block goes to <BINARY_DIR>/blocks/L<line>.cpp (line = its opening fence); only line numbers are kept
#    in lists.
# ---------------------------------------------------------------------------
file(REMOVE_RECURSE "${BINARY_DIR}")
file(MAKE_DIRECTORY "${BINARY_DIR}/blocks")
file(READ "${README}" _rest)

set(_lineno 0)
set(_in_block FALSE)
set(_last_mark "")       # the readme-check mark if the last non-blank line was one, else ""
set(_last_mark_line 0)   # and its line
set(_cpp_blocks "")      # fence line numbers of the C++ blocks, in order
set(_cmake_block "")     # text of the marked cmake block
set(_cmake_block_line "")
set(_mark_errors "")
set(_done FALSE)
while(NOT _done)
  string(FIND "${_rest}" "\n" _nl)
  if(_nl EQUAL -1)
    set(_line "${_rest}")
    set(_done TRUE)
    if(_line STREQUAL "")
      break()
    endif()
  else()
    string(SUBSTRING "${_rest}" 0 ${_nl} _line)
    math(EXPR _after "${_nl} + 1")
    string(SUBSTRING "${_rest}" ${_after} -1 _rest)
  endif()
  math(EXPR _lineno "${_lineno} + 1")
  string(REGEX REPLACE "\r$" "" _line "${_line}")

  if(_in_block)
    if(_line MATCHES "^[ \t]*```[ \t]*$")
      set(_in_block FALSE)
      if(_block_kind STREQUAL "cpp")
        if(_block_mode STREQUAL "no-main")
          string(APPEND _block_text "int main() {}\n")
        endif()
        file(WRITE "${BINARY_DIR}/blocks/L${_block_line}.cpp" "${_block_text}")
        set(_mode_${_block_line} "${_block_mode}")
        list(APPEND _cpp_blocks ${_block_line})
      elseif(_block_kind STREQUAL "cmake-project")
        if(NOT _cmake_block_line STREQUAL "")
          string(APPEND _mark_errors
            "${README}:${_block_line}: a second cmake block marked CMakeLists.txt (the first is at line "
            "${_cmake_block_line})\n")
        else()
          set(_cmake_block "${_block_text}")
          set(_cmake_block_line ${_block_line})
        endif()
      endif()
    else()
      string(APPEND _block_text "${_line}\n")
    endif()
    continue()
  endif()

  if(_line MATCHES "^[ \t]*```[ \t]*([A-Za-z0-9+_-]*)")
    string(TOLOWER "${CMAKE_MATCH_1}" _lang)
    set(_in_block TRUE)
    set(_block_line ${_lineno})
    set(_block_kind "other")
    math(EXPR _first "${_lineno} + 1")
    set(_block_text "#line ${_first} \"${README}\"\n")
    set(_mark "${_last_mark}")
    set(_last_mark "")
    if(_lang MATCHES "^(cpp|c\\+\\+|cxx|cc)$")
      set(_block_kind "cpp")
      set(_block_mode "run")
      if(_mark MATCHES "^(no-run|no-main|fragment)$")
        set(_block_mode "${_mark}")
      elseif(NOT _mark STREQUAL "")
        set(_block_mode "bad-mark")
        string(APPEND _mark_errors
          "${README}:${_last_mark_line}: unknown mark 'readme-check: ${_mark}' before a C++ block (use no-run, "
          "no-main or fragment)\n")
      endif()
      if(_block_mode STREQUAL "fragment")
        set(_block_kind "fragment")
        set(_mode_${_block_line} fragment)
        list(APPEND _cpp_blocks ${_block_line})
      endif()
    elseif(_lang STREQUAL "cmake" AND _mark STREQUAL "CMakeLists.txt")
      set(_block_kind "cmake-project")
      set(_block_text "")
    elseif(NOT _mark STREQUAL "")
      string(APPEND _mark_errors
        "${README}:${_last_mark_line}: mark 'readme-check: ${_mark}' before a ```${_lang} block: only C++ blocks "
        "take no-run, no-main or fragment, and only a cmake block takes CMakeLists.txt\n")
    endif()
    continue()
  endif()

  # Blank lines between a mark and its fence are allowed; any other line ends the mark.
  if(_line MATCHES "^[ \t]*<!--[ \t]*readme-check:[ \t]*([^ \t]+)[ \t]*-->[ \t]*$")
    set(_last_mark "${CMAKE_MATCH_1}")
    set(_last_mark_line ${_lineno})
  elseif(NOT _line MATCHES "^[ \t]*$")
    set(_last_mark "")
  endif()
endwhile()

if(_in_block)
  message(FATAL_ERROR "${README}:${_block_line}: code block never closed (no ``` line after it)")
endif()
if(_cmake_block_line STREQUAL "")
  message(FATAL_ERROR
    "${README} has no cmake block marked <!-- readme-check: CMakeLists.txt -->: the C++ blocks are built with it")
endif()
if(NOT _cmake_block MATCHES "add_executable[ \t\r\n]*\\([ \t\r\n]*([A-Za-z0-9_.+-]+)[ \t\r\n]+([A-Za-z0-9_./+-]+)")
  message(FATAL_ERROR
    "${README}:${_cmake_block_line}: the CMakeLists.txt block has no add_executable(<name> <source>)")
endif()
set(_exe_name "${CMAKE_MATCH_1}")
set(_source_name "${CMAKE_MATCH_2}")
list(LENGTH _cpp_blocks _block_count)
if(_block_count EQUAL 0)
  message(FATAL_ERROR "${README} has no ```cpp block: nothing to check")
endif()

# ---------------------------------------------------------------------------
# 2. One project, configured once from the Markdown file's CMake block; each block becomes its source in turn.
# ---------------------------------------------------------------------------
set(_src_dir "${BINARY_DIR}/project")
set(_build_dir "${BINARY_DIR}/build")
file(WRITE "${_src_dir}/CMakeLists.txt" "${_cmake_block}")
file(WRITE "${_src_dir}/${_source_name}" "int main() {}\n")

set(_generator_args "")
if(GENERATOR)
  set(_generator_args -G "${GENERATOR}")
endif()
set(ENV{LC_ALL} C)
set(ENV{LANG} C)
message(STATUS "${_md_name}: configuring the project of its CMake block (line ${_cmake_block_line})")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${_src_dir}" -B "${_build_dir}" ${_generator_args}
    "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
    "-DCMAKE_RUNTIME_OUTPUT_DIRECTORY=${_build_dir}/bin"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  _head("${_out}" ${_max_output_lines} _shown)
  message(NOTICE "---- configure output:\n${_shown}----")
  message(FATAL_ERROR "${README}:${_cmake_block_line}: the project of this CMake block does not configure "
                      "against ${PREFIX}")
endif()

set(_failures "")
set(_failed 0)
set(_checked 0)
foreach(_line IN LISTS _cpp_blocks)
  set(_mode "${_mode_${_line}}")
  set(_where "${README}:${_line}")
  if(_mode STREQUAL "fragment")
    message(STATUS "${_md_name}:${_line}: fragment, not built")
    continue()
  endif()
  if(_mode STREQUAL "bad-mark")
    math(EXPR _failed "${_failed} + 1")
    continue()  # reported with the marks below
  endif()
  math(EXPR _checked "${_checked} + 1")

  configure_file("${BINARY_DIR}/blocks/L${_line}.cpp" "${_src_dir}/${_source_name}" COPYONLY)
  set(_exe "${_build_dir}/bin/${_exe_name}${CMAKE_EXECUTABLE_SUFFIX}")
  set(_exe_multi "${_build_dir}/bin/${BUILD_TYPE}/${_exe_name}${CMAKE_EXECUTABLE_SUFFIX}")  # multi-config generators
  file(REMOVE "${_exe}" "${_exe_multi}")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" --build "${_build_dir}" --config "${BUILD_TYPE}" --clean-first
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(_rc EQUAL 0 AND NOT EXISTS "${_exe}" AND EXISTS "${_exe_multi}")
    set(_exe "${_exe_multi}")
  endif()
  if(NOT _rc EQUAL 0 OR NOT EXISTS "${_exe}")
    _head("${_out}" ${_max_output_lines} _shown)
    message(NOTICE "---- ${_where}: build output (first ${_max_output_lines} lines):\n${_shown}----")
    math(EXPR _failed "${_failed} + 1")
    string(APPEND _failures "${_where}: the C++ block starting here does not compile (or link)\n")
    continue()
  endif()
  if(_mode STREQUAL "no-run" OR _mode STREQUAL "no-main")
    message(STATUS "${_md_name}:${_line}: builds (${_mode}: not run)")
    continue()
  endif()

  set(_run_dir "${BINARY_DIR}/run/L${_line}")
  file(MAKE_DIRECTORY "${_run_dir}")
  execute_process(COMMAND "${_exe}" WORKING_DIRECTORY "${_run_dir}" TIMEOUT ${RUN_TIMEOUT}
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  _head("${_out}" ${_max_output_lines} _shown)
  if(NOT _rc EQUAL 0)
    message(NOTICE "---- ${_where}: output of the program (first ${_max_output_lines} lines):\n${_shown}----")
    math(EXPR _failed "${_failed} + 1")
    if(_rc MATCHES "^[0-9]+$")
      string(APPEND _failures "${_where}: the program of the C++ block starting here exited with status ${_rc}\n")
    else()
      string(APPEND _failures "${_where}: the program of the C++ block starting here did not finish: ${_rc}\n")
    endif()
    continue()
  endif()
  message(STATUS "${_md_name}:${_line}: builds and runs (exit status 0); its output:\n${_shown}")
endforeach()

if(NOT _mark_errors STREQUAL "" OR _failed GREATER 0)
  # NOTICE, not FATAL_ERROR, for the list: FATAL_ERROR re-wraps long lines.
  message(NOTICE "==== ${_failed} of ${_block_count} C++ blocks of ${_md_name} failed:\n${_failures}${_mark_errors}"
                 "(conventions: cmake/ReadmeCheck.cmake)")
  message(FATAL_ERROR "${_md_name}: ${_failed} of ${_block_count} C++ blocks failed, see above")
endif()
message(STATUS "${_md_name}: ${_checked} C++ block(s) built (and run where marked so) against ${PREFIX}; "
               "project from line ${_cmake_block_line}")
