# The gradient reducer (in-process) and a 2-rank smoke run of the training job on a subset of Fashion-MNIST.
hopwise_test(test_reducer test_reducer.cpp)
target_link_libraries(test_reducer PRIVATE hopwise::training GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_reducer DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 300)

add_test(NAME train_mnist_smoke_np2
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:train_mnist>
                 --epochs 1 --limit 12800 --json ${CMAKE_BINARY_DIR}/train_smoke.json)
# Learning from random weights (10%) to above 70% test accuracy in one pass over 12800 images.
set_tests_properties(train_mnist_smoke_np2 PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 2
                     PASS_REGULAR_EXPRESSION "test accuracy (7[0-9]|8[0-9]|9[0-9])\\.[0-9]+%")
add_test(NAME train_mnist_rejects_bad_batch
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:train_mnist> --batch 2)
set_tests_properties(train_mnist_rejects_bad_batch PROPERTIES LABELS mpi TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "--batch 2 leaves some of the 3 ranks without an image; use at least 3")
