# Test registration shared by every test folder.
#
# Labels say where a test runs. Besides the layer labels (core, fabric,
# socket, preload, gpu_host, reliability, ...) two say where it does not:
#   no_asan  left out of scripts/test's AddressSanitizer stage
#   no_tsan  left out of its ThreadSanitizer stage
# Each is given where the test is defined, with the reason beside it.

# gs_discover_tests(TARGET [PREFIX p] [TIMEOUT s] [LABELS l...] [ENVIRONMENT e...]
#                   [ENVIRONMENT_MODIFICATION m...] [FILTER gtest-filter]
#                   [CASES gtest-filter CASE_LABELS l...])
# gtest_discover_tests once, with lists that stay lists: CMake 3.25 passes
# PROPERTIES through a command line that flattens them, so LABELS "a;b" would
# keep only "a". LABELS and ENVIRONMENT are set here instead, from an include
# file that ctest reads after the discovered tests. CASES names the cases that
# also get CASE_LABELS (discovered separately, same prefix).
function(gs_discover_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "PREFIX;TIMEOUT;FILTER;CASES"
                        "LABELS;ENVIRONMENT;ENVIRONMENT_MODIFICATION;CASE_LABELS")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "gs_discover_tests(${target}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(arg_CASES AND arg_FILTER)
    message(FATAL_ERROR "gs_discover_tests(${target}): CASES and FILTER together are not supported")
  endif()
  if(arg_CASES)
    _gs_discover_once(${target} "-${arg_CASES}" "${arg_LABELS}")
    _gs_discover_once(${target} "${arg_CASES}" "${arg_LABELS};${arg_CASE_LABELS}")
  else()
    _gs_discover_once(${target} "${arg_FILTER}" "${arg_LABELS}")
  endif()
endfunction()

# One discovery of `target` with gtest filter `filter` (may be empty) and
# `labels`; reads PREFIX, TIMEOUT, ENVIRONMENT, ENVIRONMENT_MODIFICATION from
# the caller's arg_ variables.
function(_gs_discover_once target filter labels)
  get_property(count GLOBAL PROPERTY _gs_discover_count)
  if("${count}" STREQUAL "")
    set(count 0)
  endif()
  math(EXPR count "${count} + 1")
  set_property(GLOBAL PROPERTY _gs_discover_count ${count})
  set(list_var "gs_tests_${count}")

  set(discover_args TEST_LIST ${list_var} DISCOVERY_TIMEOUT 60)
  if(arg_PREFIX)
    list(APPEND discover_args TEST_PREFIX "${arg_PREFIX}")
  endif()
  if(filter)
    list(APPEND discover_args TEST_FILTER "${filter}")
  endif()
  set(properties "")
  if(arg_TIMEOUT)
    list(APPEND properties TIMEOUT ${arg_TIMEOUT})
  endif()
  if(properties)
    gtest_discover_tests(${target} ${discover_args} PROPERTIES ${properties})
  else()
    gtest_discover_tests(${target} ${discover_args})
  endif()

  set(set_props "")
  foreach(prop LABELS ENVIRONMENT ENVIRONMENT_MODIFICATION)
    if(prop STREQUAL "LABELS")
      set(value "${labels}")
    else()
      set(value "${arg_${prop}}")
    endif()
    if(value MATCHES "[\"\\]|\\$<|\\$\\{")
      message(FATAL_ERROR "gs_discover_tests(${target}): ${prop} \"${value}\": quotes, backslashes, "
                          "generator expressions and variable references are not carried into the test file")
    endif()
    if(value)
      string(APPEND set_props " ${prop} \"${value}\"")
    endif()
  endforeach()
  if(set_props)
    set(file "${CMAKE_CURRENT_BINARY_DIR}/${list_var}_properties.cmake")
    file(WRITE "${file}" "if(${list_var})\n  set_tests_properties(\${${list_var}} PROPERTIES${set_props})\nendif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${file}")
  endif()
endfunction()
