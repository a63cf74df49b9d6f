# The utilization monitor (training/src/monitor/): its arithmetic, options, exports and the in-process path
# (test_monitor); train_mnist and hopwise-bench under mpirun, as users run them (monitor_check.py): the straggler
# named, the alert firing for a starved job and silent for a healthy one, promtool on the metrics files, the charts.
hopwise_test(test_monitor test_monitor.cpp)
target_link_libraries(test_monitor PRIVATE hopwise::training GTest::gtest_main Threads::Threads)
gtest_discover_tests(test_monitor DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)

foreach(mode straggler alert promtool plots)
  add_test(NAME monitor_${mode}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/monitor_check.py ${mode}
                   ${CMAKE_BINARY_DIR}/bin ${CMAKE_BINARY_DIR}/monitor_${mode})
  set_tests_properties(monitor_${mode} PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 2
                       PASS_REGULAR_EXPRESSION "${mode} ok")
endforeach()
set_tests_properties(monitor_plots PROPERTIES PASS_REGULAR_EXPRESSION "png ok: .*topology.png")

# Bad input stops every rank at once, naming what was wrong.
add_test(NAME train_mnist_rejects_bad_monitor
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:train_mnist>
                 --monitor interval=0s)
set_tests_properties(train_mnist_rejects_bad_monitor PROPERTIES LABELS mpi TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "HOPWISE_MONITOR: interval=0s is not a duration")
add_test(NAME train_mnist_rejects_missing_metrics_dir
         COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:train_mnist>
                 --limit 256 --metrics-file /nonexistent-hopwise-dir/job.prom)
set_tests_properties(train_mnist_rejects_missing_metrics_dir PROPERTIES LABELS mpi TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "HOPWISE_METRICS_FILE /nonexistent-hopwise-dir/job.prom: the directory /nonexistent-hopwise-dir does not exist")
