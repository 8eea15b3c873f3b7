# Runs an MPI program that must fail, and checks that it failed in time with the expected message:
#   cmake -DCOMMAND="mpirun;...;prog;mode" -DEXPECT=<regex> -DLIMIT=<seconds> -P MpiFault.cmake
# Passes when the command exits non-zero within LIMIT seconds and its output matches EXPECT.
string(TIMESTAMP _start "%s")
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT ${LIMIT})
string(TIMESTAMP _end "%s")
math(EXPR _seconds "${_end} - ${_start}")
set(_all "${_out}${_err}")
if(_rc STREQUAL "0")
  message(FATAL_ERROR "expected a failure, the command succeeded:\n${_all}")
endif()
if(_rc MATCHES "timeout|Process terminated due to timeout")
  message(FATAL_ERROR "the command hung past ${LIMIT} s:\n${_all}")
endif()
if(NOT _all MATCHES "${EXPECT}")
  message(FATAL_ERROR "the failure's output does not match '${EXPECT}':\n${_all}")
endif()
message(STATUS "failed as expected in ${_seconds} s (exit ${_rc})")
