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
endif()
