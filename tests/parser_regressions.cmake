# ---- parser regressions: inputs the fuzz targets (tests/fuzz) found, stated size/depth limits, entity handling ----
hopwise_test(test_parser_regressions test_parser_regressions.cpp)
target_link_libraries(test_parser_regressions PRIVATE hopwise::topology hopwise::compression hopwise::common
                                                      GTest::gtest_main)
gtest_discover_tests(test_parser_regressions DISCOVERY_TIMEOUT 60 PROPERTIES LABELS unit TIMEOUT 120)
