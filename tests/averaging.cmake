# Fewer synchronization points (comm/src/averaging/): every method against a serial simulation on 1-8 in-process
# ranks; train_mnist --averaging under mpirun (averaging_mpi below).
hopwise_test(test_averaging test_averaging.cpp)
target_link_libraries(test_averaging PRIVATE hopwise::comm GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_averaging DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 300)
