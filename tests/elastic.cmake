# ---- Elastic training: the agreement itself, ranks as threads ----
hopwise_test(test_elastic test_elastic.cpp)
target_link_libraries(test_elastic PRIVATE hopwise::training GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_elastic DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)

# ---- Elastic training: a rank killed mid-run under torchrun --max-restarts; the job restarts every rank, which
# agree on the newest checkpoint all of them hold and finish with the uninterrupted run's accuracy ----
if(HOPWISE_TORCHRUN)
  add_test(NAME train_mnist_restart_torchrun_np2
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/restart_check.sh ${HOPWISE_TORCHRUN} ${CMAKE_BINARY_DIR}/restart_np2 2
                   --no-python $<TARGET_FILE:train_mnist> --epochs 1 --limit 12800 --algo ring)
  set_tests_properties(train_mnist_restart_torchrun_np2 PROPERTIES LABELS "torchrun;elastic" TIMEOUT 600
                       PROCESSORS 2 PASS_REGULAR_EXPRESSION "restart path ok")
  # Ten kills in one run, each of a random rank after every 5 steps' checkpoint: the job finishes with the
  # uninterrupted run's accuracy, nothing lost, no hang.
  add_test(NAME train_mnist_restart_10_kills_np2
           COMMAND /usr/bin/env RUNS=x10 EVERY=5 KILL_AFTER=5 ${CMAKE_CURRENT_SOURCE_DIR}/restart_check.sh
                   ${HOPWISE_TORCHRUN} ${CMAKE_BINARY_DIR}/restart_10_kills 2 --no-python $<TARGET_FILE:train_mnist>
                   --epochs 1 --limit 12800 --algo ring)
  set_tests_properties(train_mnist_restart_10_kills_np2 PROPERTIES LABELS "torchrun;elastic" TIMEOUT 600
                       PROCESSORS 2 PASS_REGULAR_EXPRESSION "restart path ok")
endif()
# The same through PyTorch: the DDP example with a hopwise hook, its state in hopwise.torch.Checkpoints' files.
# fp16:ef=1 keeps its state per parameter and resumes exactly; a codec that scales over a whole bucket (int8) sees
# DDP's first-step single bucket again after a restart and lands near, not on, the uninterrupted run.
if(HOPWISE_TORCH_ENABLED AND HOPWISE_TORCHRUN)
  add_test(NAME torch_restart_torchrun_np2
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/restart_check.sh ${HOPWISE_TORCHRUN} ${CMAKE_BINARY_DIR}/torch_restart_np2
                   2 ${PROJECT_SOURCE_DIR}/examples/torch_ddp/train.py --epochs 0.25 --hidden 256 --hook fp16:ef=1)
  set_tests_properties(torch_restart_torchrun_np2 PROPERTIES
                       ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OMP_NUM_THREADS=1"
                       LABELS "python;torch;torchrun;elastic" TIMEOUT 600 PROCESSORS 2
                       PASS_REGULAR_EXPRESSION "restart path ok")
endif()
# In place (HOPWISE_ELASTIC=shrink): 4 ranks over UCX and a file store; a rank killed (rank 2, then rank 0) or
# stopped for 20 s; the survivors go on with the uninterrupted run's accuracy, the stopped rank is refused;
# a fourth process joins 3 running ranks (HOPWISE_ELASTIC=shrink,grow) and ends with the same parameters, bit for bit.
add_test(NAME train_mnist_elastic_shrink_np4
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/elastic_check.sh $<TARGET_FILE:train_mnist> ${CMAKE_BINARY_DIR}/elastic_np4
                 "kill 2" "kill 0" "kill 2 local:period=8" "stop" grow grow-dies)
set_tests_properties(train_mnist_elastic_shrink_np4 PROPERTIES LABELS "ucx;elastic" TIMEOUT 300 PROCESSORS 4
                     PASS_REGULAR_EXPRESSION "elastic ok")

# Under DiLoCo (outer_regroup.cpp): a replica killed between syncs (blocking), one killed with a fragment's sync
# always in flight (delay 4 of a gap of 4, int8), one stopped past the timeout, one joining: the survivors keep the
# outer state, redo the broken sync over themselves and end on one model bit for bit; the newcomer takes the state.
add_test(NAME train_mnist_elastic_diloco_np4
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/elastic_check.sh $<TARGET_FILE:train_mnist> ${CMAKE_BINARY_DIR}/elastic_diloco
                 "kill 2 diloco:period=8,outer_lr=0.7,momentum=0.9"
                 "kill 1 diloco:period=8,fragments=2,delay=4,codec=int8,outer_lr=0.7,momentum=0.9"
                 "stop 1 diloco:period=8,fragments=4,delay=1,codec=int4,inner=sgd"
                 "grow - diloco:period=8,fragments=2,delay=1,outer_lr=0.7,momentum=0.9")
set_tests_properties(train_mnist_elastic_diloco_np4 PROPERTIES LABELS "ucx;elastic" TIMEOUT 400 PROCESSORS 4
                     PASS_REGULAR_EXPRESSION "elastic ok")

# ---- DiLoCo through a change of members: survivors keep the shared outer state, a newcomer takes it ----
hopwise_test(test_elastic_diloco test_elastic_diloco.cpp)
target_link_libraries(test_elastic_diloco PRIVATE hopwise::training GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_elastic_diloco DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)
