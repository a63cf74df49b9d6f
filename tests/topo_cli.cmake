# ---- hopwise-topo on the live machine, on a whole mpirun job, and on every shared topology file ----
if(TARGET hopwise-topo)
  set(_topo $<TARGET_FILE:hopwise-topo>)
  set(_mpirun ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe)
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/topo-cli)
  file(MAKE_DIRECTORY ${_out})

  # This machine, discovered with hwloc.
  add_test(NAME topo_live_show COMMAND ${_topo} show)
  set_tests_properties(topo_live_show PROPERTIES PASS_REGULAR_EXPRESSION "hwloc-live.*Host .*(Package|NUMANode)")
  add_test(NAME topo_live_matrix COMMAND ${_topo} matrix)
  add_test(NAME topo_live_plan COMMAND ${_topo} plan --ranks 2)
  set_tests_properties(topo_live_plan PROPERTIES PASS_REGULAR_EXPRESSION "2 ranks on 1 host.*ring exact.*bottleneck")
  set_tests_properties(topo_live_matrix PROPERTIES PASS_REGULAR_EXPRESSION "Legend")
  # The plan as JSON, in the documented shape.
  add_test(NAME topo_plan_json COMMAND ${_topo} plan --input ${_topo_smoke} --format json)
  set_tests_properties(topo_plan_json PROPERTIES PASS_REGULAR_EXPRESSION
      "\"ranks\": 4.*\"rings\".*\"order\".*\"hops\".*\"from\": 0.*\"to\": 1.*\"path\": \"NVL\".*\"bw_gbs\".*\"bottleneck_gbs\".*\"cost\".*\"trees\".*\"baseline\".*\"order\"")
  add_test(NAME topo_plan_bad_format COMMAND ${_topo} plan --format yaml)
  set_tests_properties(topo_plan_bad_format PROPERTIES PASS_REGULAR_EXPRESSION "'yaml' is not a plan format")
  add_test(NAME topo_input_twice COMMAND ${_topo} show ${_topo_smoke} --input other.xml)
  set_tests_properties(topo_input_twice PROPERTIES PASS_REGULAR_EXPRESSION "give the topology once")

  # export: JSON and NCCL XML round trips are byte-identical (written, read back, written again).
  foreach(fmt json nccl-xml)
    add_test(NAME topo_export_${fmt}_1 COMMAND ${_topo} export --input ${_topo_smoke} --format ${fmt}
                                               -o ${_out}/smoke.1.${fmt})
    add_test(NAME topo_export_${fmt}_2 COMMAND ${_topo} export --input ${_out}/smoke.1.${fmt} --format ${fmt}
                                               -o ${_out}/smoke.2.${fmt})
    add_test(NAME topo_export_${fmt}_same COMMAND ${CMAKE_COMMAND} -E compare_files ${_out}/smoke.1.${fmt}
                                                  ${_out}/smoke.2.${fmt})
    set_tests_properties(topo_export_${fmt}_2 PROPERTIES DEPENDS topo_export_${fmt}_1)
    set_tests_properties(topo_export_${fmt}_same PROPERTIES DEPENDS topo_export_${fmt}_2)
    set_tests_properties(topo_export_${fmt}_1 topo_export_${fmt}_2 topo_export_${fmt}_same PROPERTIES
                         RESOURCE_LOCK topo_export_${fmt})
  endforeach()
  add_test(NAME topo_export_png_needs_output COMMAND ${_topo} export --format png)
  set_tests_properties(topo_export_png_needs_output PROPERTIES PASS_REGULAR_EXPRESSION "--format png needs -o OUT")

  # The DGX-2 picture with its plan: legible (at most 2500 px wide; it was 13,725) and the ring drawn in it.
  find_program(_graphviz_dot dot)
  set(_dgx2 ${CMAKE_CURRENT_SOURCE_DIR}/data/topologies/hwloc/nvidiaDGX2.xml)
  add_test(NAME topo_export_plan_dot COMMAND ${_topo} export --input ${_dgx2} --format dot --plan)
  set_tests_properties(topo_export_plan_dot PROPERTIES LABELS unit TIMEOUT 60 PASS_REGULAR_EXPRESSION
      "nvswitch_fabric \\[label=\"NVSwitch fabric.*dir=forward, color=red[^\n]*label=\"16\"")
  if(_graphviz_dot)
    add_test(NAME topo_export_dgx2_png COMMAND ${_topo} export --input ${_dgx2} --format png --plan
                                               -o ${_out}/dgx2-plan.png)
    add_test(NAME topo_export_dgx2_png_width COMMAND ${CMAKE_COMMAND} -DPNG=${_out}/dgx2-plan.png -DMAX_WIDTH=2500
                                                     -P ${CMAKE_CURRENT_SOURCE_DIR}/topo_png_width.cmake)
    set_tests_properties(topo_export_dgx2_png_width PROPERTIES DEPENDS topo_export_dgx2_png)
    set_tests_properties(topo_export_dgx2_png topo_export_dgx2_png_width PROPERTIES LABELS unit TIMEOUT 60
                         RESOURCE_LOCK topo_dgx2_png)
  endif()
  add_test(NAME topo_export_plan_needs_picture COMMAND ${_topo} export --input ${_dgx2} --format json --plan)
  set_tests_properties(topo_export_plan_needs_picture PROPERTIES LABELS unit TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "--plan draws on a picture")

  # The whole job: four ranks' views gathered, printed once.
  add_test(NAME topo_job_show_np4 COMMAND ${_mpirun} -np 4 ${_topo} show)
  set_tests_properties(topo_job_show_np4 PROPERTIES PROCESSORS 4 PASS_REGULAR_EXPRESSION
      "^4 rank\\(s\\) on 1 host\\(s\\) \\(cluster\\)[^\n]*\n.*rank 0: host .*rank 3: host [^\n]*\n$")
  add_test(NAME topo_job_plan_np3 COMMAND ${_mpirun} -np 3 ${_topo} plan --format json)
  set_tests_properties(topo_job_plan_np3 PROPERTIES PROCESSORS 3 PASS_REGULAR_EXPRESSION "\"ranks\": 3")
  add_test(NAME topo_job_rejects_ranks COMMAND ${_mpirun} -np 2 ${_topo} plan --ranks 8)
  set_tests_properties(topo_job_rejects_ranks PROPERTIES PROCESSORS 2 PASS_REGULAR_EXPRESSION
                                                         "--ranks does not apply to a job")

  # The communicator discovers, plans and dumps what it found (HOPWISE_TOPO_DUMP_FILE); the dump loads again.
  add_test(NAME topo_dump_np2 COMMAND ${CMAKE_COMMAND} -E env HOPWISE_TOPO_DUMP_FILE=${_out}/job.json
                                      ${_mpirun} -np 2 $<TARGET_FILE:allreduce_example>)
  add_test(NAME topo_dump_loads COMMAND ${_topo} show --input ${_out}/job.json)
  set_tests_properties(topo_dump_loads PROPERTIES DEPENDS topo_dump_np2 PASS_REGULAR_EXPRESSION
                                                 "2 rank\\(s\\) on 1 host\\(s\\) \\(cluster\\).*Host ")
  set_tests_properties(topo_dump_np2 PROPERTIES PROCESSORS 2 RESOURCE_LOCK topo_dump)
  set_tests_properties(topo_dump_loads PROPERTIES RESOURCE_LOCK topo_dump)

  set_tests_properties(topo_live_show topo_live_matrix topo_live_plan topo_plan_json topo_plan_bad_format
                       topo_input_twice topo_export_png_needs_output topo_dump_loads
                       PROPERTIES LABELS unit TIMEOUT 60)
  set_tests_properties(topo_export_json_1 topo_export_json_2 topo_export_json_same topo_export_nccl-xml_1
                       topo_export_nccl-xml_2 topo_export_nccl-xml_same PROPERTIES LABELS unit TIMEOUT 60)
  set_tests_properties(topo_job_show_np4 topo_job_plan_np3 topo_job_rejects_ranks topo_dump_np2
                       PROPERTIES LABELS mpi TIMEOUT 120)

  # --input with every shared topology file: it loads and gets a plan (skipped where ../shared is absent).
  set(_shared ${CMAKE_SOURCE_DIR}/../shared/topologies)
  if(IS_DIRECTORY ${_shared})
    file(GLOB_RECURSE _files ${_shared}/*.xml ${_shared}/*.txt)
    foreach(f ${_files})
      file(RELATIVE_PATH _rel ${_shared} ${f})
      string(MAKE_C_IDENTIFIER ${_rel} _name)
      add_test(NAME topo_input_${_name} COMMAND ${_topo} plan --input ${f})
      set_tests_properties(topo_input_${_name} PROPERTIES LABELS unit TIMEOUT 60
                           PASS_REGULAR_EXPRESSION "plan: [0-9]+ ranks on")
    endforeach()
  endif()
endif()

# The planning-time benchmark runs to 4096 ranks (its timings are for reading, not asserted here).
if(TARGET plan-bench)
  add_test(NAME plan_bench_runs COMMAND $<TARGET_FILE:plan-bench>)
  set_tests_properties(plan_bench_runs PROPERTIES LABELS unit TIMEOUT 120 PASS_REGULAR_EXPRESSION
                                                  "\n +4096 +512 [^\n]* 512 +4096 +yes\n")
endif()
