# ---- topology model and file formats (hwloc XML, NCCL/RCCL XML, nvidia-smi topo -m, JSON, DOT) ----
# Reads the real topology files in ../shared/topologies; the tests skip where that directory is absent
# (HOPWISE_SHARED_TOPOLOGIES overrides the path at run time).
hopwise_test(test_topology_formats test_topology_formats.cpp)
target_link_libraries(test_topology_formats PRIVATE hopwise::topology hopwise::common GTest::gtest_main)
target_compile_definitions(test_topology_formats
                           PRIVATE HOPWISE_SHARED_TOPOLOGIES_DEFAULT="${CMAKE_SOURCE_DIR}/../shared/topologies")
gtest_discover_tests(test_topology_formats DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)
