# cmake -P driver for the install_consumer test: install the build tree into a
# scratch prefix, then configure, build and run consumer-test against it.
foreach(_v BUILD_DIR WORK_DIR CONSUMER_SOURCE_DIR GENERATOR C_COMPILER CXX_COMPILER LIBDIR CMAKEDIR
           PKGCONFIGDIR INCLUDEDIR)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "run.cmake: -D${_v}=... is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc TIMEOUT 300)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "install test: ${what} failed (${_rc})")
  endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(_config_args)
if(CONFIG)
  set(_config_args --config "${CONFIG}")
endif()
run_step("cmake --install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${_config_args})

foreach(_f "${INCLUDEDIR}/gpusock/socket.h" "${INCLUDEDIR}/gpusock/status.h"
           "${INCLUDEDIR}/gpusock/gpu.cuh" "${INCLUDEDIR}/gpusock/channel.h"
           "${CMAKEDIR}/gpusockConfig.cmake" "${CMAKEDIR}/gpusockConfigVersion.cmake"
           "${CMAKEDIR}/gpusockTargets.cmake" "${PKGCONFIGDIR}/gpusock.pc")
  if(NOT EXISTS "${prefix}/${_f}")
    message(FATAL_ERROR "install test: ${_f} was not installed")
  endif()
endforeach()

# Only the scratch prefix may satisfy the consumer.
set(ENV{PKG_CONFIG_PATH} "${prefix}/${PKGCONFIGDIR}")
set(_flags)
if(EXTRA_FLAGS)
  set(_flags "-DCMAKE_C_FLAGS=${EXTRA_FLAGS}" "-DCMAKE_CXX_FLAGS=${EXTRA_FLAGS}"
             "-DCMAKE_EXE_LINKER_FLAGS=${EXTRA_FLAGS}")
endif()
run_step("consumer configure"
         "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/consumer" -G "${GENERATOR}"
         "-DCMAKE_C_COMPILER=${C_COMPILER}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
         "-DCMAKE_PREFIX_PATH=${prefix}" "-DEXPECT_PREFIX=${prefix}" ${_flags})
run_step("consumer build" "${CMAKE_COMMAND}" --build "${WORK_DIR}/consumer")

# A missing transport is reported by the program, not fatal; it must load and run.
set(ENV{LD_LIBRARY_PATH} "${prefix}/${LIBDIR}")
foreach(_exe consumer_cmake consumer_pkgconfig consumer_static)
  if(_exe STREQUAL "consumer_static" AND NOT EXISTS "${WORK_DIR}/consumer/${_exe}")
    continue()  # no static library installed
  endif()
  message(STATUS "running ${_exe}")
  run_step("${_exe}" "${WORK_DIR}/consumer/${_exe}")
endforeach()
message(STATUS "install test: find_package(gpusock) and pkg-config consumers built and ran")
