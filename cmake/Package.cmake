# `make package`: two Debian packages with CPack, in build/packages/.
#   troupe          the shared libraries and the CLI; Depends computed by dpkg-shlibdeps
#   libtroupe-dev   headers, CMake package, troupe.pc; Depends on troupe and on the -dev packages a
#                   program built against troupe needs
#   libtroupe-rl-dev  troupe::rl and the modules under it (static), their headers and CMake file;
#                   Depends on libtroupe-dev, libtorch-dev and libtomlplusplus-dev
# An operator installs `troupe` on every node with apt; a developer adds `libtroupe-dev` (and
# `libtroupe-rl-dev` to build RL programs).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME troupe)
set(CPACK_PACKAGE_VENDOR "troupe")
set(CPACK_PACKAGE_CONTACT "troupe maintainers <maintainers@troupe.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "native actor runtime for LLM reinforcement-learning post-training")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev rl)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME troupe)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
# Its own libraries (they find each other with RUNPATH $ORIGIN): dpkg-shlibdeps looks for them here.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR}/lib)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "troupe: the actor runtime's shared libraries and the troupe CLI (node daemons, status)")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libtroupe-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "troupe (= ${PROJECT_VERSION}), libcaf-dev, libucx-dev, libmsgpack-cxx-dev, libboost-dev, libsqlite3-dev, libssl-dev, libarchive-dev, libcli11-dev, nlohmann-json3-dev, libspdlog-dev, cmake, pkg-config")
set(CPACK_COMPONENT_DEV_DESCRIPTION "troupe: headers, CMake package and pkg-config file for building programs against troupe")

set(CPACK_DEBIAN_RL_PACKAGE_NAME libtroupe-rl-dev)
set(CPACK_DEBIAN_RL_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_RL_PACKAGE_DEPENDS "libtroupe-dev (= ${PROJECT_VERSION}), libtorch-dev, libtomlplusplus-dev")
set(CPACK_COMPONENT_RL_DESCRIPTION "troupe: the RL library (troupe::rl, with actors, weights and kernels) on libtorch")

include(CPack)
