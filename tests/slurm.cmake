# A real Slurm (scripts/local-slurm.sh: munge, slurmctld, a slurmd per host) on the emulated cluster of
# cluster.cmake, brought up once for these tests (fixture) and stopped after them. Jobs go through sbatch, as a user
# submits them: the examples in examples/slurm, on 2 of the cluster's hosts. Skipped where the cluster is.
set(slurm ${HOPWISE_CLUSTER_SCRIPT} slurm)
set(slurm_job ${CMAKE_CURRENT_SOURCE_DIR}/slurm_job.sh)

function(hopwise_slurm_test name)
  hopwise_cluster_test(${name} ${ARGN})
  get_test_property(${name} FIXTURES_SETUP is_setup)
  get_test_property(${name} FIXTURES_CLEANUP is_cleanup)
  if(NOT is_setup AND NOT is_cleanup)
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED "hopwise_cluster;hopwise_slurm" TIMEOUT 300)
  endif()
endfunction()

hopwise_cluster_test(slurm_up MAX_SECONDS 60 COMMAND ${slurm} up EXPECT "slurm up on cluster '@HOST@'" "idle")
set_tests_properties(slurm_up PROPERTIES FIXTURES_SETUP hopwise_slurm)
hopwise_cluster_test(slurm_down MAX_SECONDS 60 COMMAND ${slurm} down EXPECT "slurm down on cluster '@HOST@'")
set_tests_properties(slurm_down PROPERTIES FIXTURES_CLEANUP hopwise_slurm FIXTURES_REQUIRED hopwise_cluster)

# One task per rank under srun --mpi=pmix: 4 ranks on 2 nodes, UCX between them meeting through MPI.
hopwise_slurm_test(slurm_train_mnist_sbatch MAX_SECONDS 240
                   COMMAND ${slurm_job} ${PROJECT_SOURCE_DIR}/examples/slurm/train_mnist.sbatch -- --limit 12800
                   EXPECT "train_mnist: 4 ranks over ucx on 2 host\\(s\\)"
                          "test accuracy (79|8[0-9])\\.[0-9]+% after 1 epoch" "job [0-9]+ ended COMPLETED")

# One torchrun per node (srun torchrun, c10d rendezvous at the first node): the PyTorch example over the hopwise
# backend, 2 workers per node.
if(HOPWISE_TORCHRUN AND HOPWISE_PYTHON)
  hopwise_slurm_test(slurm_torch_ddp_sbatch MAX_SECONDS 280
                     COMMAND ${slurm_job} ${PROJECT_SOURCE_DIR}/examples/slurm/torch_ddp.sbatch
                             --export=ALL,TORCHRUN=${HOPWISE_TORCHRUN},PYTHONPATH=${CMAKE_BINARY_DIR}/python
                             -- --epochs 0.25 --hidden 256
                     EXPECT "train.py: 4 ranks, backend hopwise" "on 2 host\\(s\\)" "test accuracy 0\\.[6-9]"
                            "job [0-9]+ ended COMPLETED")
  # the language model through the same batch script (TRAINER), a short run
  hopwise_slurm_test(slurm_torch_lm_sbatch MAX_SECONDS 280
                     COMMAND ${slurm_job} ${PROJECT_SOURCE_DIR}/examples/slurm/torch_ddp.sbatch
                             --export=ALL,TORCHRUN=${HOPWISE_TORCHRUN},PYTHONPATH=${CMAKE_BINARY_DIR}/python,TRAINER=examples/torch_lm/train.py
                             -- --layers 2 --width 64 --heads 2 --context 64 --steps 30 --eval-every 0 --sample 0
                     EXPECT "train.py: 4 ranks, backend hopwise" "on 2 host\\(s\\)" "validation [0-9.]+ bits per byte"
                            "job [0-9]+ ended COMPLETED")
endif()

# Faults (tests/slurm_faults.sh): the job cancelled mid-run, one rank killed, a node's slurmd stopped; each time the
# job ends, each rank or srun names what happened, and no train_mnist is left on any host. srun, with
# --kill-on-bad-exit, ends the others at once when a rank dies: before hopwise's own timeout names the dead rank,
# which it does where nobody ends them (the ranks stranded on the node whose slurmd stopped).
hopwise_slurm_test(slurm_fault_scancel MAX_SECONDS 200 COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm_faults.sh scancel
                   EXPECT "ended CANCELLED" "JOB [0-9]+ ON @HOST@[0-9]+ CANCELLED AT"
                          "train_mnist: rank 3 got SIGTERM \\(scancel, a time limit or a preemption\\)"
                          "no train_mnist left on any of the 4 hosts")
hopwise_slurm_test(slurm_fault_kill_task MAX_SECONDS 200 COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm_faults.sh kill
                   EXPECT "ended (FAILED|CANCELLED)" "srun: error: @HOST@[0-9]+: task [23]: Killed"
                          "no train_mnist left on any of the 4 hosts")
hopwise_slurm_test(slurm_fault_slurmd_stopped MAX_SECONDS 240
                   COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm_faults.sh slurmd
                   EXPECT "ended NODE_FAIL" "srun: error: Node failure on @HOST@[0-9]+"
                          "task [23]: .*train_mnist: hopwise: rank [23]: .* the connection to rank [01] failed"
                          "the node is idle" "no train_mnist left on any of the 4 hosts")
# Requeue (a preemption, a node failure): the job runs again and resumes from its checkpoint, to the same accuracy
# as the job run straight through.
hopwise_slurm_test(slurm_requeue_resumes MAX_SECONDS 240 COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm_faults.sh requeue
                   EXPECT "ended COMPLETED" "got SIGTERM" "resumed at step [1-9][0-9]* \\(epoch 1"
                          "requeued job: accuracy [0-9.]+%, straight" "no train_mnist left on any of the 4 hosts")
