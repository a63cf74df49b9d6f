# What `cmake --install build --prefix P` puts under P, by component:
#   tools   bin/: hopwise-topo, hopwise-bench, hopwise-tune, codec-bench
#   dev     lib/: the static libraries; include/hopwise/; lib/cmake/hopwise: find_package(hopwise) -> hopwise::comm
#   python  the package `hopwise` (hopwise.torch) where Debian's Python finds it: lib/python3/dist-packages under
#           /usr, lib/python3.X/dist-packages under /usr/local (and under any other P, for PYTHONPATH)
#   cuda    the CUDA and NCCL libraries and GPU tools (find_package(hopwise COMPONENTS cuda))
# and what `cpack -G DEB` (run in build/) makes of them: hopwise, libhopwise-dev and python3-hopwise, each .deb
# depending on Debian's packages by name (dpkg-shlibdeps reads them off the binaries). The cuda component is not
# packaged: the CUDA toolkit and NCCL do not come from Debian.
include(CMakePackageConfigHelpers)
set(hopwise_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/hopwise)
install(EXPORT hopwiseTargets NAMESPACE hopwise:: DESTINATION ${hopwise_cmake_dir} COMPONENT dev)
if(HOPWISE_CUDA_ENABLED)
  install(EXPORT hopwiseCudaTargets NAMESPACE hopwise:: DESTINATION ${hopwise_cmake_dir} COMPONENT cuda)
endif()
configure_package_config_file(cmake/hopwiseConfig.cmake.in ${CMAKE_BINARY_DIR}/hopwiseConfig.cmake
                              INSTALL_DESTINATION ${hopwise_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/hopwiseConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/hopwiseConfig.cmake ${CMAKE_BINARY_DIR}/hopwiseConfigVersion.cmake
        DESTINATION ${hopwise_cmake_dir} COMPONENT dev)

if(HOPWISE_TORCH_ENABLED)
  # The prefix is known only when installing (--prefix P, or /usr under cpack), hence the site directory is
  # chosen then.
  install(CODE "
    if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
      set(hopwise_site lib/python3/dist-packages)
    else()
      set(hopwise_site lib/python${HOPWISE_PYTHON_VERSION}/dist-packages)
    endif()
    file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/\${hopwise_site}\" TYPE DIRECTORY
         FILES \"${CMAKE_BINARY_DIR}/python/hopwise\" PATTERN __pycache__ EXCLUDE)
  " COMPONENT python)
endif()

set(CPACK_PACKAGE_NAME hopwise)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "topology-aware collectives, gradient compression and reducers for training")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "hopwise developers <hopwise@localhost>")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL tools dev)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME hopwise)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION net)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libhopwise-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# Static libraries: what they link must come as -dev packages for find_package(hopwise) to find it.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libopenmpi-dev, libhwloc-dev, libfmt-dev, libucx-dev, pkg-config")
if(HOPWISE_TORCH_ENABLED)
  list(APPEND CPACK_COMPONENTS_ALL python)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-hopwise)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
  # The extension module is built for this Python and this torch.
  set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
      "python3 (>= ${HOPWISE_PYTHON_VERSION}), python3 (<< 3.${HOPWISE_PYTHON_NEXT_MINOR}), python3-torch")
endif()
include(CPack)
