# moonmoe_nvcc_program(<prefix> <dir> <program> SOURCES <file>... FLAGS <flag>... [LINK <arg>...])
# CI's nvcc checks of a whole program (no GPU needed, nothing is run): one ctest test <prefix>.<stem> per source
# compiling it with nvcc into <dir>/<stem>.o (label nvcc), then <prefix>.link linking the objects with cuBLAS (and
# LINK's arguments) into <dir>/<program>, after all of them (a fixture).
function(moonmoe_nvcc_program prefix dir program)
  cmake_parse_arguments(P "" "" "SOURCES;FLAGS;LINK" ${ARGN})
  file(MAKE_DIRECTORY "${dir}")
  set(_objects "")
  foreach(_src IN LISTS P_SOURCES)
    get_filename_component(_stem "${_src}" NAME_WLE)
    list(APPEND _objects "${dir}/${_stem}.o")
    add_test(NAME "${prefix}.${_stem}"
      COMMAND "${MOONMOE_NVCC_EXECUTABLE}" ${P_FLAGS} -c "${_src}" -o "${dir}/${_stem}.o")
    set_tests_properties("${prefix}.${_stem}" PROPERTIES LABELS nvcc FIXTURES_SETUP "${prefix}.objects")
  endforeach()
  add_test(NAME "${prefix}.link"
    COMMAND "${MOONMOE_NVCC_EXECUTABLE}" -arch=sm_90 -ccbin "${CMAKE_CXX_COMPILER}" ${_objects} -lcublas ${P_LINK}
      -o "${dir}/${program}")
  set_tests_properties("${prefix}.link" PROPERTIES LABELS nvcc FIXTURES_REQUIRED "${prefix}.objects")
endfunction()
