# ---- compression codecs: round trips, unbiasedness, error feedback, summed payloads, factory errors ----
# fp16 runs F16C kernels where hopwise::active_isa() allows them, so every case runs capped at generic and at avx2.
hopwise_test(test_compression_codecs test_compression_codecs.cpp)
target_link_libraries(test_compression_codecs PRIVATE hopwise::compression GTest::gtest_main)
foreach(isa generic avx2)
  gtest_discover_tests(test_compression_codecs TEST_PREFIX "${isa}/" DISCOVERY_TIMEOUT 60
                       PROPERTIES ENVIRONMENT "HOPWISE_ISA=${isa}" LABELS unit TIMEOUT 300)
endforeach()

# Compressed allreduce through the communicator (in-process ranks) against a serial run of the same codec.
hopwise_test(test_compressed_allreduce test_compressed_allreduce.cpp)
target_link_libraries(test_compressed_allreduce PRIVATE hopwise::comm hopwise::compression GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_compressed_allreduce DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 300)
hopwise_test(test_network_compression test_network_compression.cpp)
target_link_libraries(test_network_compression PRIVATE hopwise::comm hopwise::compression hopwise::topology
                                                       GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_network_compression DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 300)

# int4 and fp8 (e4m3) against scalar references written in the test, their error bounds, error feedback, and the
# compressed allreduce over 1..8 in-process ranks against the reference sum.
hopwise_test(test_codecs_lowbit test_codecs_lowbit.cpp)
target_link_libraries(test_codecs_lowbit PRIVATE hopwise::comm hopwise::compression GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_codecs_lowbit DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 600)

hopwise_test(test_sharded_compressed test_sharded_compressed.cpp)
target_link_libraries(test_sharded_compressed PRIVATE hopwise::comm hopwise::compression GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_sharded_compressed DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 300)
