# ---- discovery of the live machine and assembly of the job's cluster ----
# fake_nvml stands in for libnvidia-ml so that the dlopen path runs on machines without a GPU.
add_library(fake_nvml MODULE ${CMAKE_CURRENT_SOURCE_DIR}/support/fake_nvml.c)
set_target_properties(fake_nvml PROPERTIES PREFIX "lib" C_VISIBILITY_PRESET default)
hopwise_test(test_topology_discovery test_topology_discovery.cpp)
target_link_libraries(test_topology_discovery PRIVATE hopwise::topology hopwise::common GTest::gtest_main)
target_compile_definitions(test_topology_discovery PRIVATE HOPWISE_FAKE_NVML="$<TARGET_FILE:fake_nvml>")
add_dependencies(test_topology_discovery fake_nvml)
gtest_discover_tests(test_topology_discovery DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)

# The communicator planning on discovery (gathered over the in-process transport) and on HOPWISE_TOPO_FILE.
hopwise_test(test_comm_planning test_comm_planning.cpp)
target_link_libraries(test_comm_planning PRIVATE hopwise::comm GTest::gtest_main)
gtest_discover_tests(test_comm_planning DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)
