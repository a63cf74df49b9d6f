# ---- GPU: device codecs, PowerSGD, the NCCL communicator and the device reducer (label cuda) ----
# Built with HOPWISE_WITH_CUDA; every case skips, with the reason, where no GPU is visible (here and in CI).
# scripts/gpu-check.sh runs them on a GPU machine.
if(HOPWISE_CUDA_ENABLED)
  hopwise_test(test_cuda_codecs test_cuda_codecs.cpp)
  target_link_libraries(test_cuda_codecs PRIVATE hopwise::compression_cuda GTest::gtest_main)
  gtest_discover_tests(test_cuda_codecs DISCOVERY_TIMEOUT 60 PROPERTIES LABELS cuda TIMEOUT 300)

  hopwise_test(test_cuda_powersgd test_cuda_powersgd.cpp)
  target_link_libraries(test_cuda_powersgd PRIVATE hopwise::compression_cuda GTest::gtest_main)
  gtest_discover_tests(test_cuda_powersgd DISCOVERY_TIMEOUT 60 PROPERTIES LABELS cuda TIMEOUT 300)

  # The NCCL communicator and the device reducer under mpirun (one rank per GPU; one rank on a one-GPU machine).
  hopwise_test(test_nccl_communicator test_nccl_communicator.cpp)
  target_link_libraries(test_nccl_communicator PRIVATE hopwise::comm_nccl GTest::gtest MPI::MPI_C)
  add_test(NAME nccl_communicator_np1
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root -np 1 $<TARGET_FILE:test_nccl_communicator>)
  set_tests_properties(nccl_communicator_np1 PROPERTIES LABELS "cuda;mpi" TIMEOUT 300 SKIP_RETURN_CODE 77)

  hopwise_test(test_device_reducer test_device_reducer.cpp)
  target_link_libraries(test_device_reducer PRIVATE hopwise::training_cuda GTest::gtest MPI::MPI_C)
  add_test(NAME device_reducer_np1
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root -np 1 $<TARGET_FILE:test_device_reducer>)
  set_tests_properties(device_reducer_np1 PROPERTIES LABELS "cuda;mpi" TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
