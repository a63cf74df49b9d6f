# Whole-program checks: the benchmark's own result checks under mpirun, the example, and an installed hopwise used from another CMake project through find_package.

# hopwise-bench -c 1 compares every row with a serial reference bit for bit and exits non-zero on a mismatch.
foreach(np 2 3)
  add_test(NAME bench_check_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${np} $<TARGET_FILE:hopwise-bench>
                   -b 1K -e 4M -f 8 -a all -c 1 -n 2 -w 1)
  set_tests_properties(bench_check_np${np} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${np})
endforeach()
add_test(NAME bench_check_bf16_avg_np4
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 4 $<TARGET_FILE:hopwise-bench>
                 -b 4K -e 1M -f 16 -d bf16 -o avg -a all -c 1 -n 2 -w 1)
set_tests_properties(bench_check_bf16_avg_np4 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 4)
foreach(coll reduce_scatter allgather broadcast reduce)
  add_test(NAME bench_check_${coll}_np3
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:hopwise-bench>
                   --coll ${coll} -b 1K -e 1M -f 32 -a all -c 1 -n 2 -w 1)
  set_tests_properties(bench_check_${coll}_np3 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 3)
endforeach()
add_test(NAME bench_rejects_bad_flag COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root -np 1
                                             $<TARGET_FILE:hopwise-bench> -a warp)
set_tests_properties(bench_rejects_bad_flag PROPERTIES LABELS mpi TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "unknown algorithm 'warp'")

add_test(NAME example_allreduce_np3
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:allreduce_example>)
set_tests_properties(example_allreduce_np3 PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS 3)


# Installed as a user installs it: cmake --install, find_package from examples/consumer, import hopwise.torch
# from the prefix in a clean environment, the .deb packages (tests/install_check.sh says what each step checks).
add_test(NAME install_and_package
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/install_check.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}
                 $<$<BOOL:${HOPWISE_TORCH_ENABLED}>:${HOPWISE_PYTHON}>)
set_tests_properties(install_and_package PROPERTIES LABELS mpi TIMEOUT 600 PROCESSORS 2
                     PASS_REGULAR_EXPRESSION "install and packages ok")

# Compressed allreduce rows: each checked against a serial run of its codec.
add_test(NAME bench_check_codecs_np3
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:hopwise-bench>
                 -b 64K -e 1M -f 16 -a auto -C none -C fp16 -C bf16 -C int8 -C int8:round=stochastic -C qsgd
                 -C terngrad -C sign -C topk:ratio=0.01 -C randomk:ratio=0.01 -C powersgd:rank=4
                 -C powersgd:rank=2,ef=0 -c 1 -n 2 -w 1)
set_tests_properties(bench_check_codecs_np3 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 3 FAIL_REGULAR_EXPRESSION "FAIL")

# ---- the programs without MPI: under torchrun (UCX over the TCP store; no MPI row, the Gloo row stays), and
# over UCX under mpirun (HOPWISE_TRANSPORT=ucx: hopwise over UCX beside MPI's own collective, same run) ----
if(HOPWISE_TORCHRUN)
  set(torchrun_np3 /usr/bin/env OMP_NUM_THREADS=1 ${HOPWISE_TORCHRUN} --standalone --nproc_per_node 3 --redirects 1
                   --tee 1 --no_python)
  hopwise_expect_test(bench_check_torchrun_np3 EXIT zero MAX_SECONDS 240
                      COMMAND ${torchrun_np3} $<TARGET_FILE:hopwise-bench> -b 1K -e 4M -f 8
                              -a all -c 1 -n 2 -w 1
                      EXPECT "3 ranks on 1 host\\(s\\) over ucx \\(torchrun\\)" "vs_gloo" " gloo " " ok$"
                      REJECT "FAIL" " mpi +[0-9]")
  set_tests_properties(bench_check_torchrun_np3 PROPERTIES LABELS "torchrun;ucx" TIMEOUT 300 PROCESSORS 3)
  hopwise_expect_test(train_mnist_torchrun_np2 EXIT zero MAX_SECONDS 240
                      COMMAND /usr/bin/env OMP_NUM_THREADS=1 ${HOPWISE_TORCHRUN} --standalone --nproc_per_node 2
                              --redirects 1 --tee 1 --no_python $<TARGET_FILE:train_mnist> --epochs 1 --limit 12800
                      EXPECT "2 ranks over ucx" "test accuracy (7[0-9]|8[0-9]|9[0-9])\\.[0-9]+%")
  set_tests_properties(train_mnist_torchrun_np2 PROPERTIES LABELS "torchrun;ucx" TIMEOUT 300 PROCESSORS 2)
  hopwise_expect_test(topo_show_torchrun_np2 EXIT zero MAX_SECONDS 120
                      COMMAND /usr/bin/env OMP_NUM_THREADS=1 ${HOPWISE_TORCHRUN} --standalone --nproc_per_node 2
                              --redirects 1 --tee 1 --no_python $<TARGET_FILE:hopwise-topo> show
                      EXPECT "2 rank\\(s\\) on 1 host\\(s\\)" "rank 1: host ")
  set_tests_properties(topo_show_torchrun_np2 PROPERTIES LABELS "torchrun;ucx" TIMEOUT 180 PROCESSORS 2)
  # The file store across runs, restarts (--max_restarts) and a run that died (README, "Trust and limits").
  add_test(NAME file_store_runs_torchrun
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/file_store_runs.sh ${HOPWISE_TORCHRUN} $<TARGET_FILE:fault_driver>
                   ${CMAKE_BINARY_DIR}/file_store_runs)
  set_tests_properties(file_store_runs_torchrun PROPERTIES LABELS "torchrun;ucx;faults" TIMEOUT 300 PROCESSORS 2
                       PASS_REGULAR_EXPRESSION "file store runs ok")
endif()
# hopwise-bench with no launcher at all: one rank, Gloo's row beside it.
hopwise_expect_test(bench_one_process EXIT zero MAX_SECONDS 120
                    COMMAND $<TARGET_FILE:hopwise-bench> -b 4K -e 64K -c 1 -n 2 -w 1
                    EXPECT "1 ranks on 1 host\\(s\\) over mpi \\(single process\\)" " gloo " REJECT "FAIL")
set_tests_properties(bench_one_process PROPERTIES LABELS mpi TIMEOUT 180)
hopwise_expect_test(bench_check_ucx_mpirun_np3 EXIT zero MAX_SECONDS 240
                    COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -x HOPWISE_TRANSPORT=ucx -np 3
                            $<TARGET_FILE:hopwise-bench> -b 1K -e 4M -f 8 -a all -c 1 -n 2 -w 1
                    EXPECT "3 ranks on 1 host\\(s\\) over ucx \\(mpirun\\)" " mpi +[0-9]" " ok$" REJECT "FAIL")
set_tests_properties(bench_check_ucx_mpirun_np3 PROPERTIES LABELS "mpi;ucx" TIMEOUT 300 PROCESSORS 3)

# How the transport is chosen from the launcher's variables, and the errors for bad ones.
hopwise_test(test_launch test_launch.cpp)
target_link_libraries(test_launch PRIVATE hopwise::comm GTest::gtest_main)
gtest_discover_tests(test_launch DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 60)

# hopwise.torch as a wheel: pip wheel from the torch environment, installed into a fresh virtual environment,
# imported and run there, refused under another torch (tests/wheel_check.sh says what each step checks).
if(HOPWISE_TORCH_ENABLED)
  add_test(NAME wheel_install COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/wheel_check.sh ${CMAKE_SOURCE_DIR}
                                      ${CMAKE_BINARY_DIR}/wheel-check ${HOPWISE_PYTHON})
  set_tests_properties(wheel_install PROPERTIES LABELS "python;torch" TIMEOUT 1200 PROCESSORS 2
                       PASS_REGULAR_EXPRESSION "wheel ok: hopwise-")
endif()
