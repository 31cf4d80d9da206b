# fp4moe_module(NAME DEPS ...): one static library per architecture layer, from the .cc files
# directly in the calling directory. Subdirectories (ISA variants) are added by the module itself.
function(fp4moe_module name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  if(sources)
    add_library(fp4moe_${name} STATIC ${sources})
    target_include_directories(fp4moe_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(fp4moe_${name} PUBLIC ${ARG_DEPS})
  else()  # a header-only layer
    add_library(fp4moe_${name} INTERFACE)
    target_include_directories(fp4moe_${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(fp4moe_${name} INTERFACE ${ARG_DEPS})
  endif()
endfunction()

# fp4moe_test(NAME DEPS ...): one GoogleTest executable from the .cc files in the calling directory.
function(fp4moe_test name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  add_executable(test_${name} ${sources})
  target_link_libraries(test_${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(test_${name} PRIVATE
    FP4MOE_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
  gtest_discover_tests(test_${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS ${name})
endfunction()
