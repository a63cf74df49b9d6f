# ---- topology planner (rings, trees, cost estimates) and the hopwise-topo CLI ----
# The shared-file cases read ../shared/topologies and skip where it is absent (HOPWISE_SHARED_TOPOLOGIES overrides).
hopwise_test(test_topology_planner test_topology_planner.cpp)
target_link_libraries(test_topology_planner PRIVATE hopwise::topology hopwise::common GTest::gtest_main)
target_compile_definitions(test_topology_planner
                           PRIVATE HOPWISE_SHARED_TOPOLOGIES_DEFAULT="${CMAKE_SOURCE_DIR}/../shared/topologies")
gtest_discover_tests(test_topology_planner DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)

# CLI smoke tests on a small `nvidia-smi topo -m` matrix written here (4 GPUs: NV pairs 0-1, 2-3, 0-3, 1-2; 2 NICs),
# plus the shared DGX-1 matrix when ../shared/topologies is present.
if(TARGET hopwise-topo)
  set(_topo_smoke ${CMAKE_CURRENT_BINARY_DIR}/planner-smoke.topo-m.txt)
  file(WRITE ${_topo_smoke}
"        GPU0    GPU1    GPU2    GPU3    mlx5_0  mlx5_1  CPU Affinity    NUMA Affinity
GPU0     X      NV2     SYS     NV1     PIX     SYS     0-15    0
GPU1    NV2      X      NV1     SYS     PIX     SYS     0-15    0
GPU2    SYS     NV1      X      NV2     SYS     PIX     16-31   1
GPU3    NV1     SYS     NV2      X      SYS     PIX     16-31   1
mlx5_0  PIX     PIX     SYS     SYS      X      SYS
mlx5_1  SYS     SYS     PIX     PIX     SYS      X

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
")
  set(_topo $<TARGET_FILE:hopwise-topo>)
  add_test(NAME topo_cli_help COMMAND ${_topo} -h)
  set_tests_properties(topo_cli_help PROPERTIES PASS_REGULAR_EXPRESSION "usage: hopwise-topo")
  add_test(NAME topo_cli_show COMMAND ${_topo} show ${_topo_smoke})
  set_tests_properties(topo_cli_show PROPERTIES PASS_REGULAR_EXPRESSION "GPU GPU3.*NVLink:")
  add_test(NAME topo_cli_matrix COMMAND ${_topo} matrix ${_topo_smoke})
  set_tests_properties(topo_cli_matrix PROPERTIES PASS_REGULAR_EXPRESSION "GPU0 +X +NV2 +SYS +NV1 +PIX")
  add_test(NAME topo_cli_plan COMMAND ${_topo} plan ${_topo_smoke})
  set_tests_properties(topo_cli_plan PROPERTIES PASS_REGULAR_EXPRESSION
                                                "ring exact.*0\\(GPU0\\) -> 1\\(GPU1\\) -> 2\\(GPU2\\) -> 3\\(GPU3\\).*bottleneck: 25.0 GB/s")
  add_test(NAME topo_cli_plan_ranks COMMAND ${_topo} plan ${_topo_smoke} --ranks 32)
  set_tests_properties(topo_cli_plan_ranks PROPERTIES PASS_REGULAR_EXPRESSION "32 ranks on 1 host.*ring heuristic")
  # Under mpirun with HOPWISE_TOPO_FILE set, the job's view is still the gathered one (the file plans the
  # communicator; it used to leave the tool without a cluster and crash it).
  add_test(NAME topo_job_show_with_topo_file_np2
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root -np 2 ${_topo} show)
  set_tests_properties(topo_job_show_with_topo_file_np2 PROPERTIES ENVIRONMENT "HOPWISE_TOPO_FILE=${_topo_smoke}"
                       PROCESSORS 2 LABELS mpi TIMEOUT 120 PASS_REGULAR_EXPRESSION "^2 rank\\(s\\) on 1 host")
  add_test(NAME topo_cli_convert COMMAND ${_topo} convert ${_topo_smoke} --to json
                                         -o ${CMAKE_CURRENT_BINARY_DIR}/planner-smoke.json)
  add_test(NAME topo_cli_convert_roundtrip COMMAND ${_topo} matrix ${CMAKE_CURRENT_BINARY_DIR}/planner-smoke.json)
  set_tests_properties(topo_cli_convert_roundtrip PROPERTIES DEPENDS topo_cli_convert
                                                             PASS_REGULAR_EXPRESSION "GPU2 +SYS +NV1 +X +NV2")
  add_test(NAME topo_cli_dot COMMAND ${_topo} dot ${_topo_smoke} -o ${CMAKE_CURRENT_BINARY_DIR}/planner-smoke.dot)
  add_test(NAME topo_cli_bad_command COMMAND ${_topo} frobnicate ${_topo_smoke})
  set_tests_properties(topo_cli_bad_command PROPERTIES PASS_REGULAR_EXPRESSION
                                                       "unknown command 'frobnicate'; use one of: show, matrix")
  add_test(NAME topo_cli_bad_flag COMMAND ${_topo} plan ${_topo_smoke} --rank 4)
  set_tests_properties(topo_cli_bad_flag PROPERTIES PASS_REGULAR_EXPRESSION "unknown option '--rank'.*--ranks")
  add_test(NAME topo_cli_missing_file COMMAND ${_topo} show ${CMAKE_CURRENT_BINARY_DIR}/no-such-topology.xml)
  set_tests_properties(topo_cli_missing_file PROPERTIES PASS_REGULAR_EXPRESSION "no-such-topology.xml")
  set_tests_properties(topo_cli_help topo_cli_show topo_cli_matrix topo_cli_plan topo_cli_plan_ranks topo_cli_convert
                       topo_cli_convert_roundtrip topo_cli_dot topo_cli_bad_command topo_cli_bad_flag
                       topo_cli_missing_file PROPERTIES LABELS unit TIMEOUT 60)
  set(_dgx1 ${CMAKE_SOURCE_DIR}/../shared/topologies/nvidia-smi/dgx1-v100-8gpu-4ib.pytorch-ddp-readme.topo-m.txt)
  if(EXISTS ${_dgx1})
    add_test(NAME topo_cli_plan_shared_dgx1 COMMAND ${_topo} plan ${_dgx1})
    set_tests_properties(topo_cli_plan_shared_dgx1 PROPERTIES PASS_REGULAR_EXPRESSION "bottleneck: 50.0 GB/s"
                                                              LABELS unit TIMEOUT 60)
  endif()
endif()

# The communicator plans its ring and trees on HOPWISE_TOPO_FILE: every collective stays correct on that plan,
# including the ring's two channels (that file's NVLink ring and its reverse; small chunks so that 64 KiB and up split).
if(TARGET hopwise-topo)
  add_test(NAME bench_check_planned_np4
           COMMAND ${CMAKE_COMMAND} -E env HOPWISE_TOPO_FILE=${_topo_smoke} HOPWISE_CHUNK_BYTES=16K
                   ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 4 $<TARGET_FILE:hopwise-bench>
                   -b 1K -e 1M -f 32 -a ring,hd,tree,hier -c 1 -n 2 -w 1)
  set_tests_properties(bench_check_planned_np4 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 4
                       FAIL_REGULAR_EXPRESSION "FAIL")
endif()

# The planner's bandwidths on every topology file (copies in tests/data/topologies, the rest of ../shared when there).
hopwise_test(test_topology_bandwidths test_topology_bandwidths.cpp)
target_link_libraries(test_topology_bandwidths PRIVATE hopwise::topology hopwise::common GTest::gtest_main)
target_compile_definitions(test_topology_bandwidths
                           PRIVATE HOPWISE_SHARED_TOPOLOGIES_DEFAULT="${CMAKE_SOURCE_DIR}/../shared/topologies"
                                   HOPWISE_TEST_TOPOLOGIES="${CMAKE_CURRENT_SOURCE_DIR}/data/topologies")
gtest_discover_tests(test_topology_bandwidths DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)
