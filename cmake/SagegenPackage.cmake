# The C++ packages of `cmake --install` (issue 28): sagegen::dsl and sagegen::runtime, beside sagegen::c (the C ABI,
# runtime/CMakeLists.txt) and the `sagegen` CLI (tools/sagegen).
#
# Both are shared libraries built from the objects of the project's static libraries, so that an installed app needs
# a C++20 compiler and nothing else: MLIR is linked statically into libsagegen_dsl.so and hidden there (the version
# script exports `sage::` only), LLVM, NVRTC and fmt are private shared dependencies found through the libraries'
# RUNPATH, the CUDA driver is loaded with dlopen. The installed headers are the public ones below and what they
# include, nothing else (sagegen_header_closure): no MLIR, fmt or CUDA header is among them.
include_guard(GLOBAL)

# sagegen_header_closure(OUT_VAR ROOTS header... DIRS dir...): the paths of ROOTS ("sage/..." names, looked up in
# DIRS in order) and of every "sage/..." header they include, recursively. A public header that starts including an
# internal one thereby installs it, from the next configure on (the headers are not configure dependencies: editing
# one must not rerun CMake); examples/installed_cpp, built against the install tree, fails when one is missing.
function(sagegen_header_closure out_var)
  cmake_parse_arguments(arg "" "" "ROOTS;DIRS" ${ARGN})
  set(pending ${arg_ROOTS})
  set(seen "")
  set(paths "")
  while(pending)
    list(POP_FRONT pending header)
    if(header IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${header}")
    set(path "")
    foreach(dir IN LISTS arg_DIRS)
      if(EXISTS "${dir}/${header}")
        set(path "${dir}/${header}")
        break()
      endif()
    endforeach()
    if(NOT path)
      message(FATAL_ERROR "sagegen: public header ${header} is not under ${arg_DIRS}")
    endif()
    list(APPEND paths "${path}")
    file(STRINGS "${path}" include_lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"sage/")
    foreach(line IN LISTS include_lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" included "${line}")
      list(APPEND pending "${included}")
    endforeach()
  endwhile()
  set(${out_var} ${paths} PARENT_SCOPE)
endfunction()

# sagegen_add_package_library(NAME PARTS static-lib...): a shared library of every object of PARTS, linked against
# what PARTS link (MLIR archives, libLLVM, NVRTC, fmt) without re-exporting it.
function(sagegen_add_package_library name)
  cmake_parse_arguments(arg "" "" "PARTS" ${ARGN})
  add_library(${name} SHARED)
  foreach(part IN LISTS arg_PARTS)
    target_sources(${name} PRIVATE $<TARGET_OBJECTS:${part}>)
  endforeach()
  set(exports "${PROJECT_SOURCE_DIR}/cmake/sagegen_exports.map")
  # --no-undefined: a part missing from PARTS fails here, not in an app's link.
  target_link_options(${name} PRIVATE "LINKER:--version-script=${exports}" "LINKER:--no-undefined")
  set_property(TARGET ${name} APPEND PROPERTY LINK_DEPENDS "${exports}")
  target_compile_features(${name} INTERFACE cxx_std_20)
  # $ORIGIN: libsagegen_runtime.so finds libsagegen_dsl.so beside it; the link path: libLLVM, NVRTC where they were.
  set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION}
                                           INSTALL_RPATH "$ORIGIN" INSTALL_RPATH_USE_LINK_PATH TRUE)
endfunction()

set(sagegen_header_dirs "${PROJECT_SOURCE_DIR}/dsl/include" "${PROJECT_SOURCE_DIR}/schedules/include"
                        "${PROJECT_SOURCE_DIR}/codegen/include" "${PROJECT_SOURCE_DIR}/codegen/device"
                        "${PROJECT_SOURCE_DIR}/runtime/include")
set(sagegen_package_targets "")

# sagegen::dsl: the vocabulary, the IR (parse, print, verify, legalize), the DSL and presets, numerics and the CPU
# reference (dsl/ without the MLIR dialect's headers).
if(TARGET sage_dsl AND TARGET sage_reference)
  sagegen_add_package_library(sagegen_dsl PARTS sage_vocabulary sage_numerics sage_ir sage_dsl sage_reference)
  target_link_libraries(sagegen_dsl PRIVATE sage_dsl sage_reference)
  sagegen_header_closure(
    dsl_headers
    ROOTS sage/dsl/Attention.h sage/dsl/AttentionBackward.h sage/dsl/Presets.h sage/ir/Program.h
          sage/ir/BackwardProgram.h sage/ir/Legalize.h sage/numerics/Quantizers.h sage/reference/Reference.h
          sage/reference/Backward.h sage/reference/Sla.h sage/reference/Metrics.h
    DIRS "${PROJECT_SOURCE_DIR}/dsl/include")
  target_sources(sagegen_dsl PUBLIC FILE_SET HEADERS BASE_DIRS "${PROJECT_SOURCE_DIR}/dsl/include" FILES ${dsl_headers})
  set_target_properties(sagegen_dsl PROPERTIES EXPORT_NAME dsl)
  add_library(sagegen::dsl ALIAS sagegen_dsl)
  list(APPEND sagegen_package_targets sagegen_dsl)
endif()

# sagegen::runtime: AttentionRunner, AttentionBackwardRunner, SlaRunner and what they stand on (schedules, codegen,
# the kernel cache, NVRTC, the driver). sagegen::dsl comes with it: its headers name AttentionVariant.
if(TARGET sagegen_dsl AND TARGET sage_attention_runtime)
  sagegen_add_package_library(sagegen_runtime PARTS sage_schedules sage_codegen sage_runtime sage_attention_runtime)
  # sagegen_dsl first: the vocabulary and the reference resolve to libsagegen_dsl.so, so that the static copies
  # sage_attention_runtime also links are never pulled in (one copy of each in the process).
  target_link_libraries(sagegen_runtime PUBLIC sagegen_dsl PRIVATE sage_attention_runtime)
  sagegen_header_closure(
    runtime_headers
    ROOTS sage/sage.h sage/runtime/AttentionRunner.h sage/runtime/AttentionBackwardRunner.h
          sage/runtime/SlaRunner.h sage/runtime/CudaDriver.h sage/runtime/CudaError.h sage/runtime/ArgumentError.h
          sage/runtime/NvrtcCompiler.h sage/schedules/UnsupportedError.h
    DIRS ${sagegen_header_dirs})
  list(REMOVE_ITEM runtime_headers ${dsl_headers})
  target_sources(sagegen_runtime PUBLIC FILE_SET HEADERS BASE_DIRS ${sagegen_header_dirs} FILES ${runtime_headers})
  set_target_properties(sagegen_runtime PROPERTIES EXPORT_NAME runtime)
  add_library(sagegen::runtime ALIAS sagegen_runtime)
  list(APPEND sagegen_package_targets sagegen_runtime)
endif()

if(TARGET sagegen_c)
  add_library(sagegen::c ALIAS sagegen_c)
endif()

if(sagegen_package_targets)
  install(TARGETS ${sagegen_package_targets} EXPORT sagegenTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()

# The CMake package: sagegenTargets.cmake (every exported target), its config and its version.
if(TARGET sagegen_c OR sagegen_package_targets)
  include(CMakePackageConfigHelpers)
  set(sagegen_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/sagegen)
  install(EXPORT sagegenTargets NAMESPACE sagegen:: DESTINATION ${sagegen_cmake_dir})
  configure_package_config_file(cmake/sagegenConfig.cmake.in ${PROJECT_BINARY_DIR}/sagegenConfig.cmake
                                INSTALL_DESTINATION ${sagegen_cmake_dir})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/sagegenConfigVersion.cmake COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/sagegenConfig.cmake ${PROJECT_BINARY_DIR}/sagegenConfigVersion.cmake
          DESTINATION ${sagegen_cmake_dir})
endif()
