# The tuner under mpirun: hopwise-tune's file, read by a job of the same shape (no trials), ignored by one of
# another shape, refused when malformed (the in-process cases are test_tuner.cpp).
hopwise_expect_test(tune_file_roundtrip_mpi EXIT zero MAX_SECONDS 240
                    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tune_roundtrip.sh ${MPIEXEC_EXECUTABLE}
                            $<TARGET_FILE:hopwise-tune> $<TARGET_FILE:hopwise-bench>
                    EXPECT "wrote .*t.json \\(34 size classes"
                           "file entries 34 job {'ranks': 2, 'hosts': 1, 'ranks_per_host': 2}"
                           "tuning: 0 trial calls"
                           "was made for 2 ranks on 1 host, 2 per host, this job is 3 ranks on 1 host, 3 per host"
                           "tuning file .*bad.json, line [12]: not valid JSON")
set_tests_properties(tune_file_roundtrip_mpi PROPERTIES LABELS mpi TIMEOUT 300 PROCESSORS 3)
