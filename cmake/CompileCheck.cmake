# Compile-fail check, run by ctest in script mode:
#
#   cmake -DCOMPILER=<c++> -DFLAGS=<flag|flag|...> -DSOURCE=<file.cpp> -P CompileCheck.cmake
#
# SOURCE must carry one or more lines of the form
#
#   // expect-error: <text>
#
# The check passes iff compiling SOURCE fails (non-zero exit status) and every <text>
# appears, as a plain substring, in the compiler's combined stdout + stderr.
# FLAGS is '|'-separated so that it survives being passed as one argument.
#
# Lines are scanned with string(FIND) rather than as CMake lists, because an expected
# text such as "expected ';'" would be split by list handling.

foreach(_var COMPILER SOURCE)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "CompileCheck.cmake: -D${_var}=... is required")
  endif()
endforeach()
if(NOT EXISTS "${SOURCE}")
  message(FATAL_ERROR "CompileCheck.cmake: no such file: ${SOURCE}")
endif()

set(_max_output_lines 60)
string(REPLACE "|" ";" _flags "${FLAGS}")

# Stable, plain-ASCII diagnostics (no locale-dependent quotes, no colours).
set(ENV{LC_ALL} C)
set(ENV{LANG} C)
execute_process(
  COMMAND "${COMPILER}" ${_flags} "${SOURCE}"
  RESULT_VARIABLE _rc
  OUTPUT_VARIABLE _output
  ERROR_VARIABLE _output)

string(REPLACE ";" " " _command_line "${COMPILER};${_flags};${SOURCE}")

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

function(_fail summary details)
  _head("${_output}" ${_max_output_lines} _shown)
  message(NOTICE
    "---- compile-fail check: ${SOURCE}\n"
    "${details}"
    "---- command:\n${_command_line}\n"
    "---- exit status: ${_rc}\n"
    "---- compiler output (first ${_max_output_lines} lines):\n${_shown}"
    "----")
  message(FATAL_ERROR "${summary}")
endfunction()

# Walk SOURCE line by line, checking every expectation against the output.
file(READ "${SOURCE}" _rest)
set(_expected_count 0)
set(_expected_report "")
set(_missing_report "")
set(_done FALSE)
while(NOT _done)
  string(FIND "${_rest}" "\n" _nl)
  if(_nl EQUAL -1)
    set(_line "${_rest}")
    set(_done TRUE)
  else()
    string(SUBSTRING "${_rest}" 0 ${_nl} _line)
    math(EXPR _after "${_nl} + 1")
    string(SUBSTRING "${_rest}" ${_after} -1 _rest)
  endif()
  if(_line MATCHES "^[ \t]*//[ \t]*expect-error:(.*)$")
    string(STRIP "${CMAKE_MATCH_1}" _text)
    if(_text STREQUAL "")
      _fail("empty '// expect-error:' line in ${SOURCE}" "")
    endif()
    math(EXPR _expected_count "${_expected_count} + 1")
    string(APPEND _expected_report "  ${_text}\n")
    string(FIND "${_output}" "${_text}" _pos)
    if(_pos EQUAL -1)
      string(APPEND _missing_report "  ${_text}\n")
    endif()
  endif()
endwhile()

if(_expected_count EQUAL 0)
  message(FATAL_ERROR
    "${SOURCE} has no '// expect-error: <text>' line; "
    "a compile-fail test must say which error it expects")
endif()

if(_rc EQUAL 0)
  _fail("${SOURCE} compiled, but it must fail to compile"
    "---- expected errors:\n${_expected_report}")
endif()

if(NOT _missing_report STREQUAL "")
  _fail("${SOURCE} failed to compile, but not with the expected error"
    "---- expected (all of):\n${_expected_report}---- not found in the output:\n${_missing_report}")
endif()

message(STATUS "${SOURCE}: fails to compile as expected (${_expected_count} expected text(s) found)")
