# Installing troupe: `cmake --install build --prefix P` (or `make install PREFIX=P`) puts under P
# the public headers, the shared libraries of the actor runtime (base, placement, net, transport,
# control, runtime; each with an SONAME, finding the others beside it), the
# `troupe` CLI, a CMake package (find_package(troupe) -> troupe::troupe; COMPONENTS rl ->
# troupe::rl) and a pkg-config file.
# tests/install checks both ways of building against an installed troupe.
include(CMakePackageConfigHelpers)

set(TROUPE_INSTALLED_MODULES ${TROUPE_SHARED_MODULES})
set(troupe_installed_targets troupe_troupe troupe_embedded)
foreach(m ${TROUPE_INSTALLED_MODULES})
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/${m}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)
  list(APPEND troupe_installed_targets troupe_${m})
endforeach()
set_target_properties(troupe_troupe PROPERTIES EXPORT_NAME troupe)

# Components: `runtime` (the shared libraries, the CLI: what every node needs) and `dev` (headers,
# the static registration library, the .so links, the CMake package, troupe.pc): the two Debian
# packages `make package` builds (cmake/Package.cmake).
install(TARGETS ${troupe_installed_targets} EXPORT troupeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET troupe)
  install(TARGETS troupe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
endif()

set(troupe_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${troupe_cmake_dir} COMPONENT dev)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/troupeConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/troupeConfig.cmake INSTALL_DESTINATION ${troupe_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/troupeConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/troupeConfig.cmake ${CMAKE_BINARY_DIR}/troupeConfigVersion.cmake
              ${CMAKE_SOURCE_DIR}/cmake/FindCAF.cmake
        DESTINATION ${troupe_cmake_dir} COMPONENT dev)

# troupe::rl: the RL library and the modules under it (weights, kernels, actors), static, on
# libtorch: component `rl` (the libtroupe-rl-dev package); a program asks for it with
# find_package(troupe REQUIRED COMPONENTS rl) and links troupe::rl.
set(TROUPE_RL_MODULES weights kernels actors rl)
set(troupe_rl_targets)
foreach(m ${TROUPE_RL_MODULES})
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/${m}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT rl)
  list(APPEND troupe_rl_targets troupe_${m})
endforeach()
if(TARGET troupe_nccl)   # nccl.h's directory, for weights (libnccl itself is opened at run time)
  set_target_properties(troupe_nccl PROPERTIES EXPORT_NAME nccl)
  list(APPEND troupe_rl_targets troupe_nccl)
endif()
install(TARGETS ${troupe_rl_targets} EXPORT troupeRlTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT rl
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT troupeRlTargets NAMESPACE troupe:: DESTINATION ${troupe_cmake_dir} COMPONENT rl)

configure_file(${CMAKE_SOURCE_DIR}/cmake/troupe.pc.in ${CMAKE_BINARY_DIR}/troupe.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/troupe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
