# The emulated cluster (scripts/local-cluster.sh): 4 hosts as network namespaces, 2 slots each, brought up once
# for all these tests (fixture) and removed after them; jobs on 2, 3 or 4 of its hosts, by slot and by node.
# Every test runs through expect_run.cmake with CLUSTER=1: skipped, with the reason, unless root can make namespaces. The
# cluster is named after the ctest process (t<pid>h0..3, in 10.201.0.0/24): a cluster a user has up, and those of
# test runs going at the same time, are left alone.
hopwise_test(cluster_probe cluster_probe.cpp)
target_link_libraries(cluster_probe PRIVATE hopwise::comm MPI::MPI_C)

set(HOPWISE_CLUSTER_SCRIPT ${CMAKE_SOURCE_DIR}/scripts/local-cluster.sh)
set(HOPWISE_CLUSTER_ENV HOPWISE_CLUSTER_SUBNET=10.201.0)

# hopwise_cluster_test(NAME MAX_SECONDS s [EXIT ...] [FIXTURE setup|cleanup] COMMAND words... [EXPECT regex...]
#                      [REJECT regex...])
function(hopwise_cluster_test name)
  cmake_parse_arguments(C "" "MAX_SECONDS;EXIT;FIXTURE" "COMMAND;EXPECT;REJECT" ${ARGN})
  if(NOT C_EXIT)
    set(C_EXIT zero)
  endif()
  hopwise_expect_test(${name} CLUSTER EXIT ${C_EXIT} MAX_SECONDS ${C_MAX_SECONDS} EXPECT ${C_EXPECT}
                      REJECT ${C_REJECT} COMMAND ${C_COMMAND})
  set_tests_properties(${name} PROPERTIES LABELS cluster TIMEOUT 180 PROCESSORS 2 RESOURCE_LOCK hopwise_cluster
                       SKIP_REGULAR_EXPRESSION "SKIPPED \\(emulated cluster\\)" ENVIRONMENT "${HOPWISE_CLUSTER_ENV}")
  if(C_FIXTURE STREQUAL "setup")
    set_tests_properties(${name} PROPERTIES FIXTURES_SETUP hopwise_cluster)
  elseif(C_FIXTURE STREQUAL "cleanup")
    set_tests_properties(${name} PROPERTIES FIXTURES_CLEANUP hopwise_cluster)
  else()
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED hopwise_cluster)
  endif()
endfunction()

# Clusters left by test runs that were interrupted are taken down first.
hopwise_cluster_test(cluster_up FIXTURE setup MAX_SECONDS 30
                     COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cluster_fixture.sh up EXPECT "cluster '@HOST@' up: 4 hosts")
hopwise_cluster_test(cluster_down FIXTURE cleanup MAX_SECONDS 30
                     COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cluster_fixture.sh down EXPECT "cluster '@HOST@' down")

set(run ${HOPWISE_CLUSTER_SCRIPT} run)
set(hosts2 --host @HOST@0:2,@HOST@1:2 -np 4)
set(hosts3 --host @HOST@0:2,@HOST@1:2,@HOST@2:2 -np 6)
set(hosts4 -np 8)  # the cluster's hostfile

# Separate hosts, as hopwise and MPI see them: host names, processor names, host ids, ranks per host, placement.
hopwise_cluster_test(cluster_hosts_2x2 MAX_SECONDS 60
                     COMMAND ${run} ${hosts2} $<TARGET_FILE:cluster_probe> --hosts 2 --map slot
                     EXPECT "4 ranks on 2 hosts" "rank   1: host @HOST@0 .* host id  0, local rank 1 of 2"
                            "rank   2: host @HOST@1 .* host id  1, local rank 0 of 2"
                     REJECT "PROBLEM")
hopwise_cluster_test(cluster_hosts_3x2_bynode MAX_SECONDS 60
                     COMMAND ${run} ${hosts3} --map-by node $<TARGET_FILE:cluster_probe> --hosts 3 --map node
                     EXPECT "6 ranks on 3 hosts" "rank   1: host @HOST@1 .* host id  1" "rank   3: host @HOST@0 .* host id  0"
                     REJECT "PROBLEM")
hopwise_cluster_test(cluster_hosts_4x2 MAX_SECONDS 60
                     COMMAND ${run} ${hosts4} $<TARGET_FILE:cluster_probe> --hosts 4 --map slot
                     EXPECT "8 ranks on 4 hosts" "rank   7: host @HOST@3 .* host id  3, local rank 1 of 2"
                     REJECT "PROBLEM")

# Every collective and algorithm, checked against references (test_collectives_suite): all of it but the
# million-element cases and the overlap timing on 2 hosts; on 3 and 4 hosts the chunked allreduces, allgather,
# broadcast, send/recv and the communicator's basics (hopwise-bench below checks the rest there).
set(skip_slow "--gtest_filter=-*MillionElements*:Async.AllreduceOverlapsComputation")
set(subset "--gtest_filter=Table/PerAlgorithm.AllreduceAcrossChunks/*:Table/RingOrNative.Allgather/*:Table/TreeOrNative.BroadcastFromEveryRoot/*:P2P.*:MpiComm.*")
hopwise_cluster_test(cluster_collectives_2x2 MAX_SECONDS 120
                     COMMAND ${run} ${hosts2} $<TARGET_FILE:test_collectives_suite> ${skip_slow}
                     EXPECT "PASSED")
hopwise_cluster_test(cluster_collectives_3x2_bynode MAX_SECONDS 120
                     COMMAND ${run} ${hosts3} --map-by node $<TARGET_FILE:test_collectives_suite> ${subset}
                     EXPECT "PASSED")
hopwise_cluster_test(cluster_collectives_4x2 MAX_SECONDS 120
                     COMMAND ${run} ${hosts4} $<TARGET_FILE:test_collectives_suite> ${subset}
                     EXPECT "PASSED")

# hopwise-bench -c 1: every collective, each row bit for bit against a serial reference, on 4 hosts.
foreach(coll allreduce reduce_scatter allgather broadcast reduce)
  hopwise_cluster_test(cluster_bench_${coll}_4x2 MAX_SECONDS 60
                       COMMAND ${run} ${hosts4} $<TARGET_FILE:hopwise-bench> --coll ${coll} -b 1K -e 1M -f 32 -a all
                               -c 1 -n 2 -w 1
                       EXPECT "8 ranks on 4 host" " ok$" REJECT "FAIL")
endforeach()

# The job's topology, discovered on every host and gathered: with ranks placed --map-by node (0 and 2 on host 0,
# 1 and 3 on host 1) the planned ring keeps each host's ranks together, crossing each host boundary once
# (rank order would cross it at every hop).
hopwise_cluster_test(cluster_topo_plan_bynode MAX_SECONDS 60
                     COMMAND ${run} ${hosts2} --map-by node $<TARGET_FILE:hopwise-topo> plan
                     EXPECT "4 rank\\(s\\) on 2 host\\(s\\)" "plan: 4 ranks on 2 host\\(s\\)"
                            "ring: [02]\\([^)]*\\) -> [02]\\([^)]*\\) -> [13]\\([^)]*\\) -> [13]\\("
                            "rank-order ring: bottleneck")
hopwise_cluster_test(cluster_topo_show MAX_SECONDS 60
                     COMMAND ${run} ${hosts2} $<TARGET_FILE:hopwise-topo> show
                     EXPECT "Host @HOST@0" "Host @HOST@1" "network Network network" "rank 3: host @HOST@1")

# Faults across hosts (TCP): a stopped rank is named by all others; a killed one ends the job at once.
hopwise_cluster_test(cluster_fault_sigstop_4x2 MAX_SECONDS 60 EXIT nonzero
                     COMMAND ${run} ${hosts4} -x HOPWISE_TIMEOUT_S=10 $<TARGET_FILE:fault_driver> --fault stop --rank 3 --at 5 --linger 5
                     EXPECT "rank 0: FAILED after [12][0-9]\\.[0-9] s .*rank 3 did not answer"
                            "rank 2: FAILED after [12][0-9]\\.[0-9] s .*rank 3 did not answer"
                            "rank 7: FAILED after [12][0-9]\\.[0-9] s .*rank 3 did not answer"
                     REJECT "ok after")
hopwise_cluster_test(cluster_fault_sigkill_4x2 MAX_SECONDS 30 EXIT nonzero
                     COMMAND ${run} ${hosts4} -x HOPWISE_TIMEOUT_S=10 $<TARGET_FILE:fault_driver> --fault kill --rank 3 --at 5
                     EXPECT "process rank 3 .* on node @HOST@1 exited on signal 9"
                     REJECT "ok after")

# ---- without MPI: torchrun's multi-node form on the cluster's hosts (local-cluster.sh torchrun), UCX between
# them over TCP alone ----
set(torchrun2 ${HOPWISE_CLUSTER_SCRIPT} torchrun --nnodes 2 --nproc_per_node 2)
hopwise_cluster_test(cluster_ucx_contract_2x2 MAX_SECONDS 120
                     COMMAND /usr/bin/env HOPWISE_TEST_WORLD=launch ${torchrun2} $<TARGET_FILE:test_transport_contract>
                     EXPECT "\\[@HOST@0\\] \\[default0\\]:.*PASSED" REJECT "FAILED")
hopwise_cluster_test(cluster_ucx_collectives_2x2 MAX_SECONDS 150
                     COMMAND /usr/bin/env HOPWISE_TEST_WORLD=launch ${torchrun2} $<TARGET_FILE:test_collectives_suite>
                             ${skip_slow}
                     EXPECT "\\[@HOST@0\\] \\[default0\\]:.*PASSED" REJECT "FAILED")
# The restart path across hosts: a rank killed on one host, each host's torchrun agent restarts its own ranks, which
# resume from the newest checkpoint all hold and end with the uninterrupted run's accuracy.
# UCX reports the killed peer within a fraction of a second; HOPWISE_TIMEOUT_S=10 bounds what a miss would cost. The
# restarted rank waits at rank 0's store until rank 0's own restart serves it (a later attempt is not refused).
hopwise_cluster_test(cluster_restart_torchrun_2x1 MAX_SECONDS 170
                     COMMAND /usr/bin/env HOPWISE_TIMEOUT_S=10 ${CMAKE_CURRENT_SOURCE_DIR}/restart_check.sh
                             ${HOPWISE_CLUSTER_SCRIPT}
                             ${CMAKE_BINARY_DIR}/cluster_restart 2 $<TARGET_FILE:train_mnist> --epochs 1 --limit 12800
                             --algo ring
                     EXPECT "restart path ok")
# Honest hosts: at 1 Gbit/s a 64 MiB allreduce between two hosts takes at least its wire time (vs_wire <= 1).
hopwise_cluster_test(cluster_ucx_shaped_wire_time MAX_SECONDS 120
                     COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cluster_shaped.sh 1gbit ${HOPWISE_CLUSTER_SCRIPT} torchrun
                             --nnodes 2 $<TARGET_FILE:hopwise-bench> -b 64M -e 64M -a ring -n 3 -w 1 --wire 1
                     EXPECT "over ucx \\(torchrun\\)" "67108864 +16777216 +float32 +ring .* (0\\.[0-9]+|1\\.000)$"
                     REJECT "67108864 +16777216 +float32 +ring .* (1\\.0*[1-9][0-9]*|[2-9]\\.[0-9]+)$")
