include(${doctest_DIR}/doctest.cmake)   # doctest_discover_tests

# One library per top-level module: troupe_add_module(<name> SOURCES ... DEPS ...)
# creates troupe_<name> (alias troupe::<name>) with <module>/include as its public include dir.
# The modules a program links to use actors (TROUPE_SHARED_MODULES: the ones installed) are
# shared libraries with an SONAME (libtroupe_runtime.so.0.1), so a job binary needs only the
# runtime package on each node; the others (weights, kernels, actors, rl) stay static.
set(TROUPE_SHARED_MODULES base placement net transport control runtime)
function(troupe_add_module name)
  cmake_parse_arguments(M "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  if(name IN_LIST TROUPE_SHARED_MODULES)
    add_library(troupe_${name} SHARED ${M_SOURCES})
    set_target_properties(troupe_${name} PROPERTIES VERSION ${PROJECT_VERSION}
                          SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
                          INSTALL_RPATH "$ORIGIN")   # installed side by side
    # Calls inside a library bind there (no PLT hop through an interposable symbol), and its
    # thread_locals (the codec's per-thread zone) are reached without __tls_get_addr: these
    # libraries are loaded with the program, never dlopen'ed. The in-process call path crosses
    # both at every call.
    target_compile_options(troupe_${name} PRIVATE
                           $<$<COMPILE_LANGUAGE:CXX>:-fno-semantic-interposition -ftls-model=initial-exec>)
  else()
    add_library(troupe_${name} STATIC ${M_SOURCES})
  endif()
  add_library(troupe::${name} ALIAS troupe_${name})
  target_include_directories(troupe_${name} PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
                                                   $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
                                            PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  set_target_properties(troupe_${name} PROPERTIES EXPORT_NAME ${name})   # troupe::<name> when installed
  target_link_libraries(troupe_${name} PUBLIC ${M_PUBLIC_DEPS} PRIVATE ${M_PRIVATE_DEPS})
endfunction()

# Test binaries are few and grouped (one per module): troupe_add_tests(<name> SOURCES ... LIBS ...)
# builds tests/<name> with doctest's main and registers each TEST_CASE with ctest.
# Every discovered test gets these properties: a name ctest cannot pass back intact (e.g. one with
# ';') would select no test case and pass vacuously, so a run of zero test cases fails.
set(TROUPE_TEST_FAIL_IF_EMPTY FAIL_REGULAR_EXPRESSION "test cases: +0 [|]")
# A case that cannot run its subject here prints this marker (tests/support/skip.hpp): skipped.
set(TROUPE_TEST_SKIP SKIP_REGULAR_EXPRESSION "TROUPE-TEST-SKIPPED")

function(troupe_add_tests name)
  cmake_parse_arguments(T "" "TIMEOUT;MAIN" "SOURCES;LIBS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  if(NOT T_MAIN)   # a binary whose tests start worker processes has a main that serves them
    set(T_MAIN ${CMAKE_SOURCE_DIR}/tests/doctest_main.cpp)
  endif()
  add_executable(${name} ${T_MAIN} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE doctest::doctest ${T_LIBS})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  doctest_discover_tests(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} ${TROUPE_TEST_FAIL_IF_EMPTY} ${TROUPE_TEST_SKIP})
endfunction()

# Benchmarks land in build/bench/: troupe_add_bench(<name> SOURCES ... LIBS ...)
function(troupe_add_bench name)
  cmake_parse_arguments(B "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(bench_${name} ${B_SOURCES})
  set_target_properties(bench_${name} PROPERTIES OUTPUT_NAME ${name}
                        RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
  target_link_libraries(bench_${name} PRIVATE ${B_LIBS})
endfunction()
