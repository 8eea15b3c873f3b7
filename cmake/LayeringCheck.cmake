# Layering check, run by ctest in script mode: one backend's headers include nothing of another backend's.
#
#   cmake -DDIR=<include/moonmoe/backend/cuda> [-DUMBRELLA=<include/moonmoe/backend/cuda.hpp>] -DFORBIDDEN=cpu
#         -P LayeringCheck.cmake
#
# Every file under DIR (*.hpp, *.cuh, *.h, *.cu), and UMBRELLA if given, is scanned for an #include whose path names
# the FORBIDDEN backend's directory or umbrella header ("../cpu/memory.hpp", "cpu/x.hpp", "cpu.hpp",
# <moonmoe/backend/cpu/x.hpp>, <moonmoe/backend/cpu.hpp>). The check fails naming each such file and line. What two
# backends share belongs in the backend contract (include/moonmoe/backend/*.hpp, docs/backends.md), which both may
# include: so the CUDA backend builds without the CPU backend's headers (mmap, Eigen, its thread pool) and a change
# to one backend cannot break the other.

foreach(_var DIR FORBIDDEN)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "LayeringCheck.cmake: -D${_var}=... is required")
  endif()
endforeach()
if(NOT IS_DIRECTORY "${DIR}")
  message(FATAL_ERROR "LayeringCheck.cmake: no such directory: ${DIR}")
endif()

file(GLOB_RECURSE _files "${DIR}/*.hpp" "${DIR}/*.cuh" "${DIR}/*.h" "${DIR}/*.cu")
if(DEFINED UMBRELLA AND NOT "${UMBRELLA}" STREQUAL "")
  if(NOT EXISTS "${UMBRELLA}")
    message(FATAL_ERROR "LayeringCheck.cmake: no such file: ${UMBRELLA}")
  endif()
  list(APPEND _files "${UMBRELLA}")
endif()
if(NOT _files)
  message(FATAL_ERROR "LayeringCheck.cmake: no headers under ${DIR}: nothing was checked")
endif()
list(SORT _files)

# An #include of <...>/FORBIDDEN/... or <...>/FORBIDDEN.hpp, the path's leading part optional.
set(_regex "^[ \t]*#[ \t]*include[ \t]*[<\"]([^\">]*/)?${FORBIDDEN}(/[^\">]*|\\.hpp)[\">]")

get_filename_component(_dir_name "${DIR}" NAME)
set(_offences "")
set(_count 0)
foreach(_file IN LISTS _files)
  # Lines as a list, counted from 1: ';', '[' and ']' (which CMake's list splitting treats specially) stand aside.
  file(READ "${_file}" _text)
  string(REPLACE ";" "<semicolon>" _text "${_text}")
  string(REPLACE "[" "<open>" _text "${_text}")
  string(REPLACE "]" "<close>" _text "${_text}")
  string(REPLACE "\n" ";" _lines "${_text}")
  set(_number 0)
  foreach(_line IN LISTS _lines)
    math(EXPR _number "${_number} + 1")
    if(_line MATCHES "${_regex}")
      string(STRIP "${_line}" _line)
      string(APPEND _offences "\n  ${_file}:${_number}: ${_line}")
      math(EXPR _count "${_count} + 1")
    endif()
  endforeach()
endforeach()

list(LENGTH _files _checked)
if(_count GREATER 0)
  message(FATAL_ERROR "layering: ${_count} include(s) of backend/${FORBIDDEN}/ from backend/${_dir_name}/:"
    "${_offences}\n"
    "backend/${_dir_name}/ may include nothing of backend/${FORBIDDEN}/: move what both backends share into the "
    "backend contract (include/moonmoe/backend/*.hpp, docs/backends.md).")
endif()
message(STATUS "layering: ${_checked} files of backend/${_dir_name}/ include nothing of backend/${FORBIDDEN}/")
