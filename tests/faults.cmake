# Faults: one rank misbehaves on purpose (fault_driver.cpp) and the others must say so, naming it, within
# HOPWISE_TIMEOUT_S (10 s here; the rank that gives up first then listens 1 s for the others' notes); the job must
# end non-zero and nothing may hang (expect_run.cmake limits each job's time, ctest's TIMEOUT guards the rest).
# Plus the HOPWISE_DEBUG=CHECK call comparison over the in-process transport.
hopwise_test(fault_driver fault_driver.cpp)
target_link_libraries(fault_driver PRIVATE hopwise::comm)

hopwise_test(test_collective_check test_collective_check.cpp)
target_link_libraries(test_collective_check PRIVATE hopwise::comm GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_collective_check DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "faults;unit" TIMEOUT 120)

# hopwise_fault_test(NAME NP n MAX_SECONDS s [EXIT zero|nonzero|any] ARGS driver-args... [MPI mpirun-args...]
#                    [EXPECT regex...] [REJECT regex...]): fault_driver under mpirun -np n with HOPWISE_TIMEOUT_S=10.
function(hopwise_fault_test name)
  cmake_parse_arguments(F "" "NP;MAX_SECONDS;EXIT" "ARGS;MPI;EXPECT;REJECT" ${ARGN})
  if(NOT F_EXIT)
    set(F_EXIT nonzero)
  endif()
  hopwise_expect_test(${name} EXIT ${F_EXIT} MAX_SECONDS ${F_MAX_SECONDS} EXPECT ${F_EXPECT} REJECT ${F_REJECT}
                      COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe ${F_MPI} -np ${F_NP}
                              -x HOPWISE_TIMEOUT_S=10 $<TARGET_FILE:fault_driver> ${F_ARGS})
  # Timeouts are the point here: keep other jobs from stretching them.
  set_tests_properties(${name} PROPERTIES LABELS faults TIMEOUT 120 PROCESSORS ${F_NP} RESOURCE_LOCK hopwise_faults)
endfunction()

# (a) Rank 2 stops (SIGSTOP): every other rank names it after the 10 s timeout (+1 s listening for the others).
hopwise_fault_test(fault_sigstop_np4 NP 4 MAX_SECONDS 40
                   ARGS --fault stop --rank 2 --at 5
                   EXPECT "rank 0: FAILED after 1[01]\\.[0-9] s in iteration 5: .*timed out after 10\\.0 s.*rank 2 did not answer"
                          "rank 1: FAILED after 1[01]\\.[0-9] s in iteration 5: .*timed out after 10\\.0 s.*rank 2 did not answer"
                          "rank 3: FAILED after 1[01]\\.[0-9] s in iteration 5: .*timed out after 10\\.0 s.*rank 2 did not answer"
                   REJECT "ok after")
# The same through a ring (large messages): the ranks wait on different neighbours, yet all name rank 2.
hopwise_fault_test(fault_sigstop_ring_np4 NP 4 MAX_SECONDS 40
                   ARGS --fault stop --rank 2 --at 3 --algo ring --count 200000
                   EXPECT "rank 0: FAILED after 1[01]\\.[0-9] s .*algo=ring.*rank 2 did not answer"
                          "rank 1: FAILED after 1[01]\\.[0-9] s .*algo=ring.*rank 2 did not answer"
                          "rank 3: FAILED after 1[01]\\.[0-9] s .*algo=ring.*rank 2 did not answer"
                   REJECT "ok after")
# (b) Rank 1 dies (SIGKILL): Open MPI notices at once and kills the job (exit 137) long before any timeout, so
# the survivors print nothing.
hopwise_fault_test(fault_sigkill_np4 NP 4 MAX_SECONDS 20
                   ARGS --fault kill --rank 1 --at 5
                   EXPECT "rank 1: killing itself" "process rank 1 .* exited on signal 9"
                   REJECT "ok after")
# With --enable-recovery Open MPI lets the survivors run on: hopwise names the dead rank on each. (mpirun then
# exits 0 although every survivor exited 1, so the exit status is not checked.)
hopwise_fault_test(fault_sigkill_recovery_np4 NP 4 MAX_SECONDS 40 EXIT any MPI --enable-recovery
                   ARGS --fault kill --rank 1 --at 5
                   EXPECT "rank 0: FAILED after 1[01]\\.[0-9] s .*rank 1 did not answer"
                          "rank 2: FAILED after 1[01]\\.[0-9] s .*rank 1 did not answer"
                          "rank 3: FAILED after 1[01]\\.[0-9] s .*rank 1 did not answer"
                   REJECT "ok after")
# (c) Rank 3 leaves out the last allreduce: the others time out naming it. (Left out mid-loop, the ranks pair
# each call with the next one of rank 3 and nothing waits: only the data is wrong, which the driver catches.)
hopwise_fault_test(fault_skip_np4 NP 4 MAX_SECONDS 40
                   ARGS --fault skip --rank 3 --iters 20 --at 19
                   EXPECT "rank 0: FAILED after 1[01]\\.[0-9] s in iteration 19: .*rank 3 did not answer"
                          "rank 1: FAILED after 1[01]\\.[0-9] s in iteration 19: .*rank 3 did not answer"
                          "rank 2: FAILED after 1[01]\\.[0-9] s in iteration 19: .*rank 3 did not answer"
                          "rank 3: ok after 20 iterations")
# (d) Rank 2 calls with another count, dtype, op or root: with HOPWISE_DEBUG=CHECK every rank reports the field
# and the ranks that disagree, before any data moves.
foreach(case "count|allreduce|count: 256 on ranks 0,1,3, 128 on rank 2"
             "dtype|allreduce|dtype: float64 on ranks 0,1,3, float32 on rank 2"
             "op|allreduce|op: sum on ranks 0,1,3, max on rank 2"
             "root|broadcast|root: 0 on ranks 0,1,3, 1 on rank 2")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 what)
  list(GET case 1 coll)
  list(GET case 2 field)
  set(expect "")
  foreach(r 0 1 2 3)
    list(APPEND expect "rank ${r}: FAILED after 0\\.[0-9] s in iteration 5: .*HOPWISE_DEBUG=CHECK.*rank 2 differs from ranks 0,1,3, ${field}")
  endforeach()
  hopwise_fault_test(fault_mismatch_${what}_np4 NP 4 MAX_SECONDS 30 MPI -x HOPWISE_DEBUG=CHECK
                     ARGS --fault mismatch --what ${what} --coll ${coll} --rank 2 --at 5
                     EXPECT ${expect} REJECT "ok after")
endforeach()
