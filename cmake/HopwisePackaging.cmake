# What `cmake --install build --prefix P` puts under P, by component:
#   tools   bin/: hopwise-topo, hopwise-bench, hopwise-tune, codec-bench, and hopwise-sim where SimGrid is found
#   dev     lib/: the static libraries; include/hopwise/; lib/cmake/hopwise: find_package(hopwise) -> hopwise::training, ::comm
#   python  the package `hopwise` (hopwise.torch) in lib/python3.X/site-packages (for PYTHONPATH); under
#           `pip install .` (scikit-build-core, pyproject.toml) the wheel's root: the usual way to install it
#   cuda    the CUDA and NCCL libraries and GPU tools (find_package(hopwise COMPONENTS cuda))
# and what `cpack -G DEB` (run in build/) makes of them: hopwise and libhopwise-dev, each .deb depending on
# Debian's packages by name (dpkg-shlibdeps reads them off the binaries). Not packaged as .deb: the cuda component
# (the CUDA toolkit and NCCL do not come from Debian) and the Python package (torch 2.x comes from PyPI: a wheel).
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
  if(SKBUILD)
    set(hopwise_site .)  # the wheel's root
  else()
    set(hopwise_site ${CMAKE_INSTALL_LIBDIR}/python${HOPWISE_PYTHON_VERSION}/site-packages)
  endif()
  install(DIRECTORY ${CMAKE_BINARY_DIR}/python/hopwise DESTINATION ${hopwise_site} COMPONENT python
          PATTERN __pycache__ EXCLUDE PATTERN "*.so" EXCLUDE)
  install(TARGETS hopwise_torch_c LIBRARY DESTINATION ${hopwise_site}/hopwise/torch COMPONENT python)
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
include(CPack)
