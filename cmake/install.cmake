# Install rules, the exported CMake package (find_package(gpusock) ->
# gpusock::gpusock) and the pkg-config file. Included last from the top-level
# CMakeLists.txt, so every target exists by now; each is optional while the
# tree is being built up, hence the if(TARGET) guards.

include(CMakePackageConfigHelpers)

set(GPUSOCK_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/gpusock"
    CACHE STRING "Where gpusockConfig.cmake is installed (relative to the prefix)")
set(GPUSOCK_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig"
    CACHE STRING "Where gpusock.pc is installed (relative to the prefix)")

# Every public header, subfolders included: the C API, and the header-only
# device API (gpusock/gpu.cuh and its parts in gpusock/gpu/).
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/gpusock"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        COMPONENT gpusock_development
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp" PATTERN "*.cuh")

# The installed libraries, then everything built here that their link
# interface names: a static library's private dependencies appear there as
# $<LINK_ONLY:...> and must be installed and exported with it; a shared
# library's private ones are linked in already and stay out.
set(_gs_roots)
foreach(_t IN ITEMS gpusock gpusock_static)
  if(TARGET ${_t})
    list(APPEND _gs_roots ${_t})
  endif()
endforeach()

set(_gs_export_targets)   # project targets, breadth-first from the roots
set(_gs_imported_deps)    # imported targets they need (PkgConfig::X, Threads::Threads, ...)
set(_gs_queue ${_gs_roots})
while(_gs_queue)
  list(POP_FRONT _gs_queue _t)
  if(_t IN_LIST _gs_export_targets)
    continue()
  endif()
  list(APPEND _gs_export_targets ${_t})
  get_target_property(_links ${_t} INTERFACE_LINK_LIBRARIES)
  if(NOT _links)
    set(_links)
  endif()
  foreach(_dep IN LISTS _links)
    # Static libraries record private deps as $<LINK_ONLY:dep>; other generator
    # expressions ($<BUILD_INTERFACE:...>) never reach the installed package.
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" _dep "${_dep}")
    if(_dep MATCHES "^\\$<" OR _dep MATCHES "^::@" OR NOT TARGET "${_dep}")
      continue()
    endif()
    get_target_property(_imported ${_dep} IMPORTED)
    if(_imported)
      list(APPEND _gs_imported_deps ${_dep})
    else()
      list(APPEND _gs_queue ${_dep})
    endif()
  endforeach()
endwhile()
list(REMOVE_DUPLICATES _gs_imported_deps)

# pkg-config modules behind the imported deps, as PREFIX=module pairs, so that the
# package config can recreate PkgConfig::PREFIX exactly as the build made it.
set(_gs_pc_modules)
set(_gs_pkg_pairs)
set(_gs_need_threads FALSE)
foreach(_dep IN LISTS _gs_imported_deps)
  if(_dep MATCHES "^PkgConfig::(.+)$")
    set(_prefix "${CMAKE_MATCH_1}")
    set(_module "${${_prefix}_MODULE_NAME}")
    if(NOT _module)
      string(TOLOWER "${_prefix}" _module)
    endif()
    list(APPEND _gs_pc_modules "${_module}")
    list(APPEND _gs_pkg_pairs "${_prefix}=${_module}")
  elseif(_dep STREQUAL "Threads::Threads")
    set(_gs_need_threads TRUE)
  else()
    message(WARNING "gpusock install: exported targets link ${_dep}; "
                    "gpusockConfig.cmake does not know how to find it")
  endif()
endforeach()
# libfabric is the transport every build has; require it even if the library
# happens to link it only privately.
if(NOT "libfabric" IN_LIST _gs_pc_modules)
  list(APPEND _gs_pc_modules libfabric)
endif()

# An install(EXPORT) with a source-tree include path is a hard configure error;
# report it and skip the package instead of breaking everyone's build.
set(_gs_export_ok TRUE)
foreach(_t IN LISTS _gs_export_targets)
  get_target_property(_dirs ${_t} INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT _dirs)
    continue()
  endif()
  foreach(_d IN LISTS _dirs)
    if(NOT _d MATCHES "^\\$<" AND
       (_d MATCHES "^${PROJECT_SOURCE_DIR}(/|$)" OR _d MATCHES "^${PROJECT_BINARY_DIR}(/|$)"))
      message(WARNING "gpusock install: target ${_t} has the build-tree include path ${_d} "
                      "without $<BUILD_INTERFACE:...>; the CMake package is not exported")
      set(_gs_export_ok FALSE)
    endif()
  endforeach()
endforeach()

if(_gs_export_targets)
  install(TARGETS ${_gs_export_targets}
          EXPORT gpusockTargets
          RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT gpusock_runtime
          LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT gpusock_runtime
                  NAMELINK_COMPONENT gpusock_development
          ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT gpusock_development
          OBJECTS DESTINATION "${CMAKE_INSTALL_LIBDIR}/gpusock-objects" COMPONENT gpusock_development
          INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
endif()

if(_gs_export_targets AND _gs_export_ok)
  install(EXPORT gpusockTargets
          NAMESPACE gpusock::
          DESTINATION "${GPUSOCK_INSTALL_CMAKEDIR}"
          COMPONENT gpusock_development)

  set(GPUSOCK_CONFIG_PKG_MODULES "${_gs_pkg_pairs}")
  set(GPUSOCK_CONFIG_NEED_THREADS ${_gs_need_threads})
  configure_package_config_file(
    "${PROJECT_SOURCE_DIR}/cmake/gpusockConfig.cmake.in"
    "${PROJECT_BINARY_DIR}/gpusockConfig.cmake"
    INSTALL_DESTINATION "${GPUSOCK_INSTALL_CMAKEDIR}")
  # 0.x: minor versions may break the API, so only the same minor is compatible.
  write_basic_package_version_file(
    "${PROJECT_BINARY_DIR}/gpusockConfigVersion.cmake"
    VERSION "${PROJECT_VERSION}"
    COMPATIBILITY SameMinorVersion)
  install(FILES "${PROJECT_BINARY_DIR}/gpusockConfig.cmake"
                "${PROJECT_BINARY_DIR}/gpusockConfigVersion.cmake"
          DESTINATION "${GPUSOCK_INSTALL_CMAKEDIR}"
          COMPONENT gpusock_development)
endif()

# pkg-config: -lgpusock (the shared library when there is one). The prefix is
# derived from ${pcfiledir} so that `cmake --install --prefix X` works anywhere.
if(TARGET gpusock OR TARGET gpusock_static)
  if(TARGET gpusock)
    set(_gs_pc_main gpusock)
  else()
    set(_gs_pc_main gpusock_static)
  endif()
  get_target_property(_gs_pc_libname ${_gs_pc_main} OUTPUT_NAME)
  if(NOT _gs_pc_libname)
    set(_gs_pc_libname ${_gs_pc_main})
  endif()
  # A static-only install needs the internal archives too, dependents first.
  set(_gs_pc_private_libs)
  get_target_property(_main_type ${_gs_pc_main} TYPE)
  if(_main_type STREQUAL "STATIC_LIBRARY")
    foreach(_t IN LISTS _gs_export_targets)
      get_target_property(_type ${_t} TYPE)
      if(_type STREQUAL "STATIC_LIBRARY" AND NOT _t STREQUAL _gs_pc_main)
        get_target_property(_name ${_t} OUTPUT_NAME)
        if(NOT _name)
          set(_name ${_t})
        endif()
        string(APPEND _gs_pc_private_libs " -l${_name}")
      endif()
    endforeach()
    string(APPEND _gs_pc_private_libs " -lstdc++")
  endif()

  if(IS_ABSOLUTE "${GPUSOCK_INSTALL_PKGCONFIGDIR}")
    set(GPUSOCK_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  else()
    file(RELATIVE_PATH _rel "/root/${GPUSOCK_INSTALL_PKGCONFIGDIR}" "/root")
    string(REGEX REPLACE "/$" "" _rel "${_rel}")
    set(GPUSOCK_PC_PREFIX "\${pcfiledir}/${_rel}")
  endif()
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(GPUSOCK_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
  else()
    set(GPUSOCK_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  endif()
  if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(GPUSOCK_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
  else()
    set(GPUSOCK_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  endif()
  list(JOIN _gs_pc_modules " " GPUSOCK_PC_REQUIRES_PRIVATE)
  set(GPUSOCK_PC_LIBNAME "${_gs_pc_libname}")
  set(GPUSOCK_PC_LIBS_PRIVATE "${_gs_pc_private_libs} -pthread")
  string(STRIP "${GPUSOCK_PC_LIBS_PRIVATE}" GPUSOCK_PC_LIBS_PRIVATE)
  configure_file("${PROJECT_SOURCE_DIR}/cmake/gpusock.pc.in" "${PROJECT_BINARY_DIR}/gpusock.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/gpusock.pc"
          DESTINATION "${GPUSOCK_INSTALL_PKGCONFIGDIR}"
          COMPONENT gpusock_development)
endif()

# Install into a scratch prefix and build a consumer with find_package(gpusock)
# and with pkg-config. Needs a finished build, as every ctest run has.
if(GPUSOCK_TESTS AND _gs_roots AND _gs_export_ok)
  set(_gs_consumer_flags "")
  if(GPUSOCK_SANITIZE)
    set(_gs_consumer_flags "-fsanitize=address,undefined")
  endif()
  add_test(NAME install_consumer
           COMMAND "${CMAKE_COMMAND}"
                   "-DBUILD_DIR=${PROJECT_BINARY_DIR}"
                   "-DWORK_DIR=${PROJECT_BINARY_DIR}/install-test"
                   "-DCONSUMER_SOURCE_DIR=${PROJECT_SOURCE_DIR}/cmake/consumer-test"
                   "-DGENERATOR=${CMAKE_GENERATOR}"
                   "-DC_COMPILER=${CMAKE_C_COMPILER}"
                   "-DCXX_COMPILER=${CMAKE_CXX_COMPILER}"
                   "-DEXTRA_FLAGS=${_gs_consumer_flags}"
                   "-DCONFIG=$<CONFIG>"
                   "-DLIBDIR=${CMAKE_INSTALL_LIBDIR}"
                   "-DCMAKEDIR=${GPUSOCK_INSTALL_CMAKEDIR}"
                   "-DPKGCONFIGDIR=${GPUSOCK_INSTALL_PKGCONFIGDIR}"
                   "-DINCLUDEDIR=${CMAKE_INSTALL_INCLUDEDIR}"
                   -P "${PROJECT_SOURCE_DIR}/cmake/consumer-test/run.cmake")
  set_tests_properties(install_consumer PROPERTIES LABELS install TIMEOUT 600)
endif()
