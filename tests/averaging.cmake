# Fewer synchronization points (training/src/averaging/): every method against a serial simulation on 1-8 in-process
# ranks; train_mnist --averaging under mpirun (averaging_mpi below).
hopwise_test(test_averaging test_averaging.cpp)
target_link_libraries(test_averaging PRIVATE hopwise::training GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_averaging DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 300)

add_executable(averaging_mpi averaging_mpi.cpp)
target_link_libraries(averaging_mpi PRIVATE hopwise::training)
foreach(np 2 4)
  add_test(NAME averaging_mpi_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${np} $<TARGET_FILE:averaging_mpi>)
  set_tests_properties(averaging_mpi_np${np} PROPERTIES LABELS mpi TIMEOUT 120 PROCESSORS ${np}
                       PASS_REGULAR_EXPRESSION "18 of 18 methods match the serial simulation on ${np} ranks")
endforeach()
add_test(NAME averaging_ucx_mpi_np3
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -x HOPWISE_TRANSPORT=ucx -np 3
                 $<TARGET_FILE:averaging_mpi>)
set_tests_properties(averaging_ucx_mpi_np3 PROPERTIES LABELS "mpi;ucx" TIMEOUT 120 PROCESSORS 3
                     PASS_REGULAR_EXPRESSION "18 of 18 methods match the serial simulation on 3 ranks over ucx")

# train_mnist --averaging: a method trains (the target's probes, the epoch's full average), a resumed run lands
# where the straight one does, and a bad spec is refused naming the field.
add_test(NAME train_mnist_local_sgd_np2
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:train_mnist>
                 --epochs 1 --limit 6400 --averaging local:period=4,warmup=10 --target-accuracy 0.6 --eval-every 10
                 --json ${CMAKE_BINARY_DIR}/train_local_sgd.json)
set_tests_properties(train_mnist_local_sgd_np2 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 2
                     PASS_REGULAR_EXPRESSION
                     "test accuracy [7-9][0-9]\\.[0-9]+% after 1 epoch[^\n]*\naveraging local:period=4,warmup=10: [0-9]+ averagings[^\n]*\ntarget accuracy 60.00% reached after [0-9]+ steps")
foreach(method local:period=3 async:period=3 gossip:peers=1)
  string(REGEX REPLACE "[:=,]" "_" tag ${method})
  set(mid "")
  if(method STREQUAL "local:period=3")  # the mid-epoch checkpoints once: the method does not change them
    set(mid mid)
  endif()
  add_test(NAME train_mnist_resume_${tag}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/resume_check.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_mnist>
                   ${CMAKE_BINARY_DIR}/resume_${tag} ${method} ${mid})
  set_tests_properties(train_mnist_resume_${tag} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 2
                       PASS_REGULAR_EXPRESSION "resume matches")
endforeach()
# Resumed mid-period: checkpoints every 12 steps under period 8, the run resumed from step 12 (diloco: the outer
# momentum, a fragment's all-reduce in flight, the codec's residuals) ends bit-identical to the straight one.
foreach(method diloco:period=8 diloco:period=8,fragments=2,delay=1,codec=int8)
  string(REGEX REPLACE "[:=,]" "_" tag ${method})
  add_test(NAME train_mnist_resume_midperiod_${tag}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/resume_check.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_mnist>
                   ${CMAKE_BINARY_DIR}/resume_midperiod_${tag} ${method} every=12)
  set_tests_properties(train_mnist_resume_midperiod_${tag} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 2
                       PASS_REGULAR_EXPRESSION "resume matches")
endforeach()
add_test(NAME train_mnist_rejects_bad_averaging
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:train_mnist>
                 --averaging local:period=0)
set_tests_properties(train_mnist_rejects_bad_averaging PROPERTIES LABELS mpi TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "averaging 'local:period=0': period=0 must be a whole number >= 1")

# train_mnist's checkpoints (examples/train_mnist/checkpoint.cpp): planted files (out-of-range headers, a FIFO, a
# symlink to /dev/zero) are skipped with a warning and the run resumes from the valid save; cut-short files at higher
# steps push no valid save out. The header parser alone, in test_train_mnist_checkpoint.
add_test(NAME train_mnist_checkpoint_refusals
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_check.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_mnist>
                 ${CMAKE_BINARY_DIR}/checkpoint_refusals)
set_tests_properties(train_mnist_checkpoint_refusals PROPERTIES LABELS mpi TIMEOUT 600 PROCESSORS 2
                     PASS_REGULAR_EXPRESSION "checkpoint refusals ok")
hopwise_test(test_train_mnist_checkpoint test_train_mnist_checkpoint.cpp
             ${CMAKE_SOURCE_DIR}/examples/train_mnist/checkpoint.cpp)
target_include_directories(test_train_mnist_checkpoint PRIVATE ${CMAKE_SOURCE_DIR}/examples/train_mnist)
target_link_libraries(test_train_mnist_checkpoint PRIVATE hopwise::training GTest::gtest_main)
gtest_discover_tests(test_train_mnist_checkpoint DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 60)

# diloco and the outer path: local's bits, resume mid-period, codecs with error feedback, auto's choice.
hopwise_test(test_diloco test_diloco.cpp)
target_link_libraries(test_diloco PRIVATE hopwise::training GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_diloco DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 300)
# diloco:auto's pick on busy cores: the syncs' other work, the fewest bits, the period by the inner family.
hopwise_test(test_diloco_auto_pick test_diloco_auto_pick.cpp)
target_link_libraries(test_diloco_auto_pick PRIVATE hopwise::training GTest::gtest_main)
gtest_discover_tests(test_diloco_auto_pick DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 60)
