# ---- the user guide (docs/, mkdocs.yml) and the README's quickstarts ----
# docs_build: the guide builds with MkDocs of the torch environment (frontends/torch/requirements.txt) in strict mode,
# into build/site: mkdocs.yml's validation makes a page left out of nav, a broken link or anchor and an absolute link
# warnings, which --strict turns into errors (not with --quiet, which hides them from the count).
if(HOPWISE_PYTHON AND EXISTS "${HOPWISE_PYTHON}")
  add_test(NAME docs_build
           COMMAND ${HOPWISE_PYTHON} -m mkdocs build --strict -f ${CMAKE_SOURCE_DIR}/mkdocs.yml
                   -d ${CMAKE_BINARY_DIR}/site)
  set_tests_properties(docs_build PROPERTIES LABELS docs TIMEOUT 300)
endif()

# readme_quickstarts (tests/quickstart_check.sh): the README's marked blocks run as a newcomer runs them, from the
# repository root with build/ this build tree: train_mnist and allreduce_example under mpirun, hopwise-topo, the torch
# examples under the torch environment's torchrun (both skipped where the PyTorch backend is not built); the C++ block
# compiled against the headers, the Python blocks parsed, the README's links checked.
set(quickstart_args ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
if(HOPWISE_TORCH_ENABLED)
  get_filename_component(quickstart_venv_bin ${HOPWISE_PYTHON} DIRECTORY)
  get_filename_component(quickstart_venv ${quickstart_venv_bin} DIRECTORY)
  list(APPEND quickstart_args --venv ${quickstart_venv})
else()
  list(APPEND quickstart_args --skip torch --skip torch-lm)  # both run under the torch environment's torchrun
endif()
add_test(NAME readme_quickstarts COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/quickstart_check.sh ${quickstart_args})
set_tests_properties(readme_quickstarts PROPERTIES LABELS docs TIMEOUT 300 RUN_SERIAL TRUE PROCESSORS 2
                                                   PASS_REGULAR_EXPRESSION "quickstarts ok")
