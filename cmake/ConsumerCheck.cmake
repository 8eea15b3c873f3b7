# Package check, run by ctest in script mode after `cmake --install` into PREFIX:
# configure SOURCE_DIR (a project that only does find_package(moonmoe REQUIRED))
# into a fresh BINARY_DIR against PREFIX, build it, and run what it built.
#
#   cmake -DSOURCE_DIR=... -DBINARY_DIR=... -DPREFIX=... -DCXX_COMPILER=...
#         [-DGENERATOR=...] [-DBUILD_TYPE=...] [-DEXPECT_CONFIGURE_ERROR=<text>] -P ConsumerCheck.cmake
#
# With EXPECT_CONFIGURE_ERROR the check passes iff configuring fails with <text> in its output (a compiler the
# package refuses).

foreach(_var SOURCE_DIR BINARY_DIR PREFIX CXX_COMPILER)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "ConsumerCheck.cmake: -D${_var}=... is required")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

foreach(_file CMakeLists.txt main.cpp)
  if(NOT EXISTS "${SOURCE_DIR}/${_file}")
    message(FATAL_ERROR "consumer project is incomplete: ${SOURCE_DIR}/${_file} does not exist")
  endif()
endforeach()
if(NOT EXISTS "${PREFIX}")
  message(FATAL_ERROR "${PREFIX} does not exist: run the consumer.install test first")
endif()

# Runs one step; on failure prints its output and stops.
function(_step name)
  string(REPLACE ";" " " _shown "${ARGN}")
  message(STATUS "consumer: ${name}: ${_shown}")
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE _rc
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(NOTICE "---- ${name} failed (exit status ${_rc}); its output:\n${_out}----")
    message(FATAL_ERROR "consumer step '${name}' failed")
  endif()
  set(_step_output "${_out}" PARENT_SCOPE)
endfunction()

# Always from scratch, so a stale cache cannot hide a broken package.
file(REMOVE_RECURSE "${BINARY_DIR}")

set(_generator_args "")
if(GENERATOR)
  set(_generator_args -G "${GENERATOR}")
endif()

set(_configure_command
  "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" ${_generator_args}
  "-DCMAKE_PREFIX_PATH=${PREFIX}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
if(DEFINED EXPECT_CONFIGURE_ERROR)
  execute_process(COMMAND ${_configure_command} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  string(REGEX REPLACE "[ \t\r\n]+" " " _flat "${_out}")  # CMake wraps its messages
  string(FIND "${_flat}" "${EXPECT_CONFIGURE_ERROR}" _pos)
  if(_rc EQUAL 0 OR _pos EQUAL -1)
    message(NOTICE "---- configure output (exit status ${_rc}):\n${_out}----")
    message(FATAL_ERROR "configuring the consumer with ${CXX_COMPILER} must fail with: ${EXPECT_CONFIGURE_ERROR}")
  endif()
  message(STATUS "consumer: configuring with ${CXX_COMPILER} fails as expected: ${EXPECT_CONFIGURE_ERROR}")
  return()
endif()
_step(configure ${_configure_command})

# The package must come from PREFIX, not from some other installation.
file(STRINGS "${BINARY_DIR}/CMakeCache.txt" _found_dir REGEX "^moonmoe_DIR:")
string(REGEX REPLACE "^moonmoe_DIR:[A-Z]+=" "" _found_dir "${_found_dir}")
file(REAL_PATH "${PREFIX}" _real_prefix)
if(EXISTS "${_found_dir}")
  file(REAL_PATH "${_found_dir}" _found_dir)
endif()
string(FIND "${_found_dir}" "${_real_prefix}/" _pos)
if(NOT _pos EQUAL 0)
  message(FATAL_ERROR "the consumer found moonmoe in '${_found_dir}', not under ${_real_prefix}")
endif()

_step(build "${CMAKE_COMMAND}" --build "${BINARY_DIR}" --config "${BUILD_TYPE}")

foreach(_name moonmoe_consumer_config moonmoe_consumer moonmoe_consumer_native)
  set(_exe "${BINARY_DIR}/bin/${_name}${CMAKE_EXECUTABLE_SUFFIX}")
  if(NOT EXISTS "${_exe}")
    message(FATAL_ERROR "the consumer build did not produce ${_exe}")
  endif()
  _step(run "${_exe}")
  message(STATUS "consumer: ran ${_exe}:\n${_step_output}")
endforeach()
