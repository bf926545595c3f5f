# cedar_module(NAME DEPS ...): a static library from every .cc file in the current folder.
# New files are picked up on the next configure (CONFIGURE_DEPENDS), so adding a file never needs
# an edit here.
function(cedar_module name)
  cmake_parse_arguments(ARG "SERIAL" "" "DEPS" ${ARGN})
  file(GLOB _src CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  if(NOT _src)  # a folder with headers only
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
    return()
  endif()
  add_library(${name} STATIC ${_src})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  cedar_set_warnings(${name})
endfunction()

# cedar_test_suite(NAME DEPS ...): one GoogleTest binary from every *_test.cc in the folder,
# registered with CTest under the label NAME.
function(cedar_test_suite name)
  cmake_parse_arguments(ARG "SERIAL" "" "DEPS" ${ARGN})
  file(GLOB _src CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*_test.cc)
  if(NOT _src)
    return()
  endif()
  add_executable(test_${name} ${_src})
  target_link_libraries(test_${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(test_${name} PRIVATE
    CEDAR_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    CEDAR_BINARY_DIR="${PROJECT_BINARY_DIR}")
  cedar_set_warnings(test_${name})
  include(GoogleTest)
  # SERIAL: the suite's tests never run beside each other (they share a machine-wide resource).
  set(_lock)
  if(ARG_SERIAL)
    set(_lock RESOURCE_LOCK ${name})
  endif()
  gtest_discover_tests(test_${name} PROPERTIES LABELS ${name} ${_lock} DISCOVERY_TIMEOUT 60)
endfunction()
