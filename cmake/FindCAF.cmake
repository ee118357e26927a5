# FindCAF: the C++ Actor Framework's core library (Debian's libcaf-dev ships no CMake package).
# Defines the imported target CAF::core and CAF_FOUND. Installed with troupe's CMake package, so
# that a program built against troupe finds CAF the same way.
find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE_LIBRARY caf_core)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF REQUIRED_VARS CAF_CORE_LIBRARY CAF_INCLUDE_DIR)
if(CAF_FOUND AND NOT TARGET CAF::core)
  find_package(Threads REQUIRED)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
                        INTERFACE_LINK_LIBRARIES Threads::Threads)
  # Its headers are a system library's: no warnings of ours for them.
  set_property(TARGET CAF::core PROPERTY INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
endif()
mark_as_advanced(CAF_INCLUDE_DIR CAF_CORE_LIBRARY)
