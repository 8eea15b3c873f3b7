# Checks that nvcc fuses no product and sum into one FMA in the kernels of a .cu file (ctest nvcc.contraction over
# test/nvcc/contraction_kernels.cu: the CUDA functors claimed bitwise equal to the CPU, which rounds a product and a
# sum apart). No GPU needed.
#
#   cmake -DNVCC=<nvcc> -DSOURCE=<file.cu> -DFLAGS="<flag>|<flag>|..." -DBINARY_DIR=<dir> -P ContractionCheck.cmake
#
# The file is compiled to PTX twice, with -fmad=true (nvcc's default) and -fmad=false. A kernel fails when
#   - it holds more fma.rn instructions with contraction than without (an explicit fmaf counts the same in both), or
#   - with contraction, an unrounded mul.f32 / mul.f64 feeds an unrounded add / sub: ptxas may fuse that pair itself
#     (PTX ISA, "mul": no rounding modifier lets the code generator use FMA). __fmul_rn / __fadd_rn carry .rn.
# Only the kernels written in the file are checked (extern "C", so that the PTX keeps their names); the message
# names every failing one.

cmake_minimum_required(VERSION 3.25)  # the project's; IN_LIST and list(JOIN) below

foreach(_var NVCC SOURCE FLAGS BINARY_DIR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "ContractionCheck.cmake: -D${_var}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" _flags "${FLAGS}")
file(MAKE_DIRECTORY "${BINARY_DIR}")
get_filename_component(_stem "${SOURCE}" NAME_WLE)

# Compiles SOURCE to PTX with -fmad=<mode>; sets <out> to the PTX as a list of lines (';', '[' and ']' dropped,
# so that the lines are list elements).
function(_ptx_lines mode out)
  set(_ptx "${BINARY_DIR}/${_stem}.fmad_${mode}.ptx")
  execute_process(COMMAND "${NVCC}" ${_flags} -ptx "-fmad=${mode}" "${SOURCE}" -o "${_ptx}"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "nvcc -ptx -fmad=${mode} ${SOURCE} failed (${_rc}):\n${_out}${_err}")
  endif()
  file(READ "${_ptx}" _text)
  string(REGEX REPLACE "[][;]" "" _text "${_text}")
  string(REPLACE "\n" ";" _text "${_text}")
  set(${out} "${_text}" PARENT_SCOPE)
endfunction()

# For every function defined in the PTX lines: <prefix>_names, <prefix>_fma_<name> (its fma.rn count) and
# <prefix>_fusable_<name> (the unrounded mul -> add / sub pairs, as text).
function(_scan lines prefix)
  set(_names "")
  set(_name "")
  set(_in_body OFF)
  foreach(_line IN LISTS ${lines})
    if(NOT _in_body)
      if(_line MATCHES "^[.a-z ]*\\.(entry|func)[ \t]+(\\([^)]*\\)[ \t]*)?([A-Za-z_$][A-Za-z0-9_$]*)")
        set(_name "${CMAKE_MATCH_3}")
      elseif(_line MATCHES "^{" AND _name)
        set(_in_body ON)
        list(APPEND _names "${_name}")
        set(_fma 0)
        set(_mul_regs "")
        set(_fusable "")
      endif()
      continue()
    endif()
    if(_line MATCHES "^}")
      set(${prefix}_fma_${_name} ${_fma} PARENT_SCOPE)
      set(${prefix}_fusable_${_name} "${_fusable}" PARENT_SCOPE)
      set(_in_body OFF)
      set(_name "")
    elseif(_line MATCHES "^[ \t]*fma\\.rn\\.f(32|64)[ \t]")
      math(EXPR _fma "${_fma} + 1")
    elseif(_line MATCHES "^[ \t]*mul\\.f(32|64)[ \t]+(%[a-z]+[0-9]+),")
      list(APPEND _mul_regs "${CMAKE_MATCH_2}")
    elseif(_line MATCHES "^[ \t]*(add|sub)\\.f(32|64)[ \t]+%[a-z]+[0-9]+,(.*)$")
      string(REGEX MATCHALL "%[a-z]+[0-9]+" _operands "${CMAKE_MATCH_3}")
      foreach(_reg IN LISTS _operands)
        if(_reg IN_LIST _mul_regs)
          string(STRIP "${_line}" _stripped)
          list(APPEND _fusable "${_stripped} (${_reg} from an unrounded mul)")
        endif()
      endforeach()
    endif()
  endforeach()
  set(${prefix}_names "${_names}" PARENT_SCOPE)
endfunction()

_ptx_lines(true _fused_lines)
_ptx_lines(false _plain_lines)
_scan(_fused_lines fused)
_scan(_plain_lines plain)

# The kernels written in SOURCE (`__global__ void name(`, extern "C" so that the PTX keeps the name): the headers
# bring other kernels along (Thrust's, the fast paths'), which are not checked here.
file(STRINGS "${SOURCE}" _decls REGEX "__global__ void [A-Za-z_][A-Za-z0-9_]*\\(")
set(_kernels "")
foreach(_decl IN LISTS _decls)
  string(REGEX MATCH "__global__ void ([A-Za-z_][A-Za-z0-9_]*)\\(" _ "${_decl}")
  list(APPEND _kernels "${CMAKE_MATCH_1}")
endforeach()
list(LENGTH _kernels _count)
if(_count EQUAL 0)
  message(FATAL_ERROR "ContractionCheck.cmake: no `__global__ void name(` kernel in ${SOURCE}")
endif()
foreach(_name IN LISTS _kernels)
  if(NOT _name IN_LIST fused_names)
    message(FATAL_ERROR "ContractionCheck.cmake: kernel ${_name} of ${SOURCE} is not in its PTX (extern \"C\"?)")
  endif()
endforeach()

set(_failures "")
foreach(_name IN LISTS _kernels)
  set(_why "")
  if(NOT DEFINED plain_fma_${_name})
    set(_why "missing from the -fmad=false PTX")
  elseif(fused_fma_${_name} GREATER plain_fma_${_name})
    set(_why "${fused_fma_${_name}} fma.rn with contraction, ${plain_fma_${_name}} without")
  endif()
  if(fused_fusable_${_name})
    list(JOIN fused_fusable_${_name} "\n      " _pairs)
    if(_why)
      string(APPEND _why "; ")
    endif()
    string(APPEND _why "pairs ptxas may fuse:\n      ${_pairs}")
  endif()
  if(_why)
    string(APPEND _failures "  ${_name}: ${_why}\n")
  else()
    message(STATUS "no contraction: ${_name} (${plain_fma_${_name}} explicit fma)")
  endif()
endforeach()
if(_failures)
  message(FATAL_ERROR "nvcc contracts a product and a sum into one FMA (or leaves a pair ptxas may fuse) in "
                      "kernels of ${SOURCE}, where the CPU rounds twice; write them with fn::add_product "
                      "(backend/functors.hpp):\n${_failures}")
endif()
message(STATUS "${_count} kernels of ${SOURCE}: no contraction")
