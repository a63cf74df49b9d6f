# Faults: one rank misbehaves on purpose (fault_driver.cpp) and the others must say so, naming it, within
# HOPWISE_TIMEOUT_S (10 s here; a rank that gives up then listens up to 5 s for the others' notes); the job must
# end non-zero and nothing may hang (expect_run.cmake limits each job's time, ctest's TIMEOUT guards the rest).
# The times each rank reports are checked by what they prove, with room for a loaded machine (scripts/test-stress.sh):
# "[12][0-9].x s" = after the 10 s timeout (and the listening), not a hang; "[0-9].x s" = before any timeout could fire (a watched pid).
# Plus the HOPWISE_DEBUG=CHECK call comparison over the in-process transport.
hopwise_test(fault_driver fault_driver.cpp)
target_link_libraries(fault_driver PRIVATE hopwise::comm)

hopwise_test(test_collective_check test_collective_check.cpp)
target_link_libraries(test_collective_check PRIVATE hopwise::comm GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_collective_check DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)

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

# (a) Rank 2 stops (SIGSTOP): every other rank names it after the 10 s timeout (+5 s listening for the others).
hopwise_fault_test(fault_sigstop_np4 NP 4 MAX_SECONDS 40
                   ARGS --fault stop --rank 2 --at 5
                   EXPECT "rank 0: FAILED after [12][0-9]\\.[0-9] s in iteration 5: .*timed out after 10\\.0 s.*rank 2 did not answer"
                          "rank 1: FAILED after [12][0-9]\\.[0-9] s in iteration 5: .*timed out after 10\\.0 s.*rank 2 did not answer"
                          "rank 3: FAILED after [12][0-9]\\.[0-9] s in iteration 5: .*timed out after 10\\.0 s.*rank 2 did not answer"
                   REJECT "ok after")
# The same through a ring (large messages): the ranks wait on different neighbours, yet all name rank 2. They give
# up seconds apart on a loaded machine: each lingers 5 s after its line, so that mpirun lets the others say theirs.
hopwise_fault_test(fault_sigstop_ring_np4 NP 4 MAX_SECONDS 40
                   ARGS --fault stop --rank 2 --at 3 --algo ring --count 200000 --linger 5
                   EXPECT "rank 0: FAILED after [12][0-9]\\.[0-9] s .*algo=ring.*rank 2 did not answer"
                          "rank 1: FAILED after [12][0-9]\\.[0-9] s .*algo=ring.*rank 2 did not answer"
                          "rank 3: FAILED after [12][0-9]\\.[0-9] s .*algo=ring.*rank 2 did not answer"
                   REJECT "ok after")
# The same inside MPI's own collective (native: MPI_Iallreduce, waited for with the timeout): a rank stopped after
# the neighbours' exchange that precedes the call is named too, where a blocking MPI_Allreduce hung the others.
hopwise_fault_test(fault_sigstop_inside_native_np3 NP 3 MAX_SECONDS 40
                   ARGS --fault stop-inside --rank 2 --at 3 --algo native --count 8000000 --linger 5
                   EXPECT "rank 0: FAILED after [12][0-9]\\.[0-9] s .*algo=native.*rank 2 did not answer"
                          "rank 1: FAILED after [12][0-9]\\.[0-9] s .*algo=native.*rank 2 did not answer"
                   REJECT "ok after")
# The same while the tuner tries its candidates on the first calls of a size: the 8th, iteration 7, is native here.
hopwise_fault_test(fault_sigstop_inside_tuning_np3 NP 3 MAX_SECONDS 40
                   ARGS --fault stop-inside --rank 2 --at 7 --count 8000000 --linger 5
                   EXPECT "rank 0: FAILED after [12][0-9]\\.[0-9] s .*rank 2 did not answer"
                          "rank 1: FAILED after [12][0-9]\\.[0-9] s .*rank 2 did not answer"
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
                   EXPECT "rank 0: FAILED after [12][0-9]\\.[0-9] s .*rank 1 did not answer"
                          "rank 2: FAILED after [12][0-9]\\.[0-9] s .*rank 1 did not answer"
                          "rank 3: FAILED after [12][0-9]\\.[0-9] s .*rank 1 did not answer"
                   REJECT "ok after")
# (c) Rank 3 leaves out the last allreduce: the others time out naming it. (Left out mid-loop, the ranks pair
# each call with the next one of rank 3 and nothing waits: only the data is wrong, which the driver catches.)
hopwise_fault_test(fault_skip_np4 NP 4 MAX_SECONDS 40
                   ARGS --fault skip --rank 3 --iters 20 --at 19
                   EXPECT "rank 0: FAILED after [12][0-9]\\.[0-9] s in iteration 19: .*rank 3 did not answer"
                          "rank 1: FAILED after [12][0-9]\\.[0-9] s in iteration 19: .*rank 3 did not answer"
                          "rank 2: FAILED after [12][0-9]\\.[0-9] s in iteration 19: .*rank 3 did not answer"
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

# ---- the same faults over UCX, with no MPI: ranks spawned as a test harness does (tests/spawn_ranks.sh sets
# torchrun's variables and, unlike mpirun and torchrun, lets the survivors run on after a rank dies) ----
# hopwise_ucx_fault_test(NAME NP n MAX_SECONDS s ARGS driver-args... EXPECT regex... [REJECT regex...])
function(hopwise_ucx_fault_test name)
  cmake_parse_arguments(F "" "NP;MAX_SECONDS;GRACE" "ARGS;EXPECT;REJECT" ${ARGN})
  if(NOT F_GRACE)
    set(F_GRACE 5)
  endif()
  hopwise_expect_test(${name} EXIT nonzero MAX_SECONDS ${F_MAX_SECONDS} EXPECT ${F_EXPECT} REJECT ${F_REJECT}
                      COMMAND /usr/bin/env HOPWISE_TIMEOUT_S=10 ${CMAKE_CURRENT_SOURCE_DIR}/spawn_ranks.sh ${F_NP}
                              --grace ${F_GRACE} $<TARGET_FILE:fault_driver> ${F_ARGS})
  set_tests_properties(${name} PROPERTIES LABELS "faults;ucx" TIMEOUT 120 PROCESSORS ${F_NP}
                                          RESOURCE_LOCK hopwise_faults)
endfunction()
function(hopwise_all_ranks_say out ranks pattern)
  set(lines "")
  foreach(r ${ranks})
    list(APPEND lines "rank ${r}: FAILED after ${pattern}")
  endforeach()
  set(${out} ${lines} PARENT_SCOPE)
endfunction()
# (e) The same, with no option set: the default call check (each collective's stamp travels beside its first
# messages, or sits in the shared slots' header) names the field and the ranks; nothing waits for a timeout.
foreach(case "count|allreduce|count: 256 on ranks 0,1,3, 128 on rank 2"
             "dtype|allreduce|dtype: float64 on ranks 0,1,3, float32 on rank 2"
             "op|allreduce|op: sum on ranks 0,1,3, max on rank 2"
             "root|broadcast|root: 0 on ranks 0,1,3, 1 on rank 2")
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 what)
  list(GET case 1 coll)
  list(GET case 2 field)
  hopwise_all_ranks_say(expect "0;1;2;3" "[0-9]\\.[0-9] s in iteration 5: .*checked by default.*rank 2 differs from ranks 0,1,3. ${field}")
  hopwise_fault_test(fault_mismatch_default_${what}_np4 NP 4 MAX_SECONDS 30
                     ARGS --fault mismatch --what ${what} --coll ${coll} --rank 2 --at 5
                     EXPECT ${expect} REJECT "ok after" "wrong data")
endforeach()
# Through a ring's messages (large buffers, no shared slots): rank 2's neighbours name it at once, from the stamps
# that come with its first messages.
foreach(what count op)
  hopwise_fault_test(fault_mismatch_default_ring_${what}_np4 NP 4 MAX_SECONDS 30
                     ARGS --fault mismatch --what ${what} --coll allreduce --rank 2 --at 3 --algo ring --count 200000
                     EXPECT "rank [13]: FAILED after [0-9]\\.[0-9] s in iteration 3: .*algo=ring.*checked by default.*${what}:"
                     REJECT "ok after" "wrong data")
endforeach()

# (a) A rank stops: the others name it after the timeout, through shared memory and through a ring.
hopwise_all_ranks_say(expect "0;1;3" "[12][0-9]\\.[0-9] s in iteration 5: .*(timed out after 10\\.0 s|gave up on this job).*rank 2 did not answer")
hopwise_ucx_fault_test(ucx_fault_sigstop_np4 NP 4 MAX_SECONDS 40 ARGS --fault stop --rank 2 --at 5
                       EXPECT ${expect} REJECT "ok after")
hopwise_ucx_fault_test(ucx_fault_sigstop_ring_np4 NP 4 MAX_SECONDS 40
                       ARGS --fault stop --rank 2 --at 5 --algo ring --count 200000 --linger 5 EXPECT ${expect}
                       REJECT "ok after")
# (b) A rank dies: on one host its pid is watched, so the others fail within about a second, not at the timeout;
# through a ring its neighbours see it go, the others see them give up, and all name the dead rank.
hopwise_all_ranks_say(expect "0;2;3" "[0-9]\\.[0-9] s in iteration 5: .*rank 1 did not answer")
# spawn_ranks.sh gives the survivors 15 s after the death to say so, not 5: on a loaded machine the word passes
# down the ring in seconds (rank 2 knew after 3.6 s beside stress-ng, and the harness killed the others at 5 s).
# No UCX request is left behind at the survivors' cleanup ("... was not returned to mpool ucp_requests": the notes
# a rank that gives up sends every peer, to the dead one too, were never freed; 4M doubles showed it every run).
hopwise_ucx_fault_test(ucx_fault_sigkill_np4 NP 4 MAX_SECONDS 40 GRACE 15 ARGS --fault kill --rank 1 --at 5
                       EXPECT ${expect} REJECT "ok after" "mpool")
hopwise_ucx_fault_test(ucx_fault_sigkill_ring_np4 NP 4 MAX_SECONDS 40 GRACE 15
                       ARGS --fault kill --rank 1 --at 5 --algo ring --count 4000000 EXPECT ${expect}
                       REJECT "ok after" "mpool")
# (c) A rank skips the last allreduce: the others name it (it has exited by then, so they know within a second).
hopwise_all_ranks_say(expect "0;1;2" "[0-9]+\\.[0-9] s in iteration 19: .*rank 3 did not answer")
hopwise_ucx_fault_test(ucx_fault_skip_np4 NP 4 MAX_SECONDS 40 ARGS --fault skip --rank 3 --iters 20 --at 19
                       EXPECT ${expect} "rank 3: ok after 20 iterations")
# (d) A rank never joins: every other rank names it when the rendezvous times out; rank 0 (the store's server)
# stays until the others have said so too.
hopwise_all_ranks_say(expect "0;1;3" "(9|1[0-9])\\.[0-9] s .*rank\\(s\\) 2 did not arrive within 10\\.0 s")
hopwise_ucx_fault_test(ucx_fault_absent_np4 NP 4 MAX_SECONDS 30 ARGS --fault absent --rank 2
                       EXPECT ${expect} REJECT "closed the connection")
# (e) Rank 0, which serves the store, never starts: the others name the address nobody serves.
hopwise_all_ranks_say(expect "1;2" "(9|1[0-9])\\.[0-9] s .*store: nobody serves tcp://127\\.0\\.0\\.1:[0-9]+")
hopwise_ucx_fault_test(ucx_fault_store_unserved_np3 NP 3 MAX_SECONDS 30 ARGS --fault absent --rank 0
                       EXPECT ${expect})
# (f') The default call check over UCX: a rank calling with another op is named by every rank at once.
hopwise_all_ranks_say(expect "0;1;2;3" "[0-9]\\.[0-9] s in iteration 5: .*checked by default.*op: sum on ranks 0,1,3, max on rank 2")
hopwise_ucx_fault_test(ucx_fault_mismatch_default_np4 NP 4 MAX_SECONDS 40
                       ARGS --fault mismatch --what op --coll allreduce --rank 2 --at 5 EXPECT ${expect}
                       REJECT "ok after" "wrong data")
# (f) Under torchrun itself: a rank that skips a call is named by the others; torchrun fails the job (torch 2.x
# ends the other ranks at the first failure: --linger lets each report first).
if(HOPWISE_TORCHRUN)
  hopwise_all_ranks_say(expect "0;1" "[0-9]+\\.[0-9] s in iteration 9: .*rank 2 did not answer")
  hopwise_expect_test(ucx_fault_skip_torchrun_np3 EXIT nonzero MAX_SECONDS 60 EXPECT ${expect}
                      COMMAND /usr/bin/env HOPWISE_TIMEOUT_S=10 OMP_NUM_THREADS=1 ${HOPWISE_TORCHRUN} --standalone
                              --nproc_per_node 3 --redirects 1 --tee 1 --no_python $<TARGET_FILE:fault_driver>
                              --fault skip --rank 2 --iters 10 --at 9 --linger 5)
  set_tests_properties(ucx_fault_skip_torchrun_np3 PROPERTIES LABELS "faults;ucx;torchrun" TIMEOUT 120
                                                              PROCESSORS 3 RESOURCE_LOCK hopwise_faults)
endif()
