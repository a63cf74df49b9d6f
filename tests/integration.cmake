# Whole-program checks: the benchmark's own result checks under mpirun, the example, and an installed hopwise used from another CMake project through find_package.

# hopwise-bench -c 1 compares every row with a serial reference bit for bit and exits non-zero on a mismatch.
foreach(np 2 3)
  add_test(NAME bench_check_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${np} $<TARGET_FILE:hopwise-bench>
                   -b 1K -e 4M -f 8 -a ring,hd,tree,direct,shm,native,auto -c 1 -n 2 -w 1)
  set_tests_properties(bench_check_np${np} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS ${np})
endforeach()
add_test(NAME bench_check_bf16_avg_np4
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 4 $<TARGET_FILE:hopwise-bench>
                 -b 4K -e 1M -f 16 -d bf16 -o avg -a ring,hd,tree,direct,shm,native -c 1 -n 2 -w 1)
set_tests_properties(bench_check_bf16_avg_np4 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 4)
foreach(coll reduce_scatter allgather broadcast reduce)
  add_test(NAME bench_check_${coll}_np3
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:hopwise-bench>
                   --coll ${coll} -b 1K -e 1M -f 32 -a auto,ring,tree,native -c 1 -n 2 -w 1)
  set_tests_properties(bench_check_${coll}_np3 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 3)
endforeach()
add_test(NAME bench_rejects_bad_flag COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root -np 1
                                             $<TARGET_FILE:hopwise-bench> -a warp)
set_tests_properties(bench_rejects_bad_flag PROPERTIES LABELS mpi TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "unknown algorithm 'warp'")

add_test(NAME example_allreduce_np3
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:allreduce_example>)
set_tests_properties(example_allreduce_np3 PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS 3)


# Install into a scratch prefix, then configure, build and run examples/consumer against it.
add_test(NAME package_consumer
         COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DSOURCE_DIR=${CMAKE_SOURCE_DIR}
                 -DMPIEXEC=${MPIEXEC_EXECUTABLE} -P ${CMAKE_CURRENT_SOURCE_DIR}/package_consumer.cmake)
set_tests_properties(package_consumer PROPERTIES LABELS unit TIMEOUT 300)

# Compressed allreduce rows: each checked against a serial run of its codec.
add_test(NAME bench_check_codecs_np3
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:hopwise-bench>
                 -b 64K -e 1M -f 16 -a auto -C none -C fp16 -C bf16 -C int8 -C int8:round=stochastic -C qsgd
                 -C terngrad -C sign -C topk:ratio=0.01 -C randomk:ratio=0.01 -C powersgd:rank=4
                 -C powersgd:rank=2,ef=0 -c 1 -n 2 -w 1)
set_tests_properties(bench_check_codecs_np3 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 3 FAIL_REGULAR_EXPRESSION "FAIL")
