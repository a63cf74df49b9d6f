# ---- the PyTorch backend (frontends/torch/): pytest of the torch environment, over real ranks (torchrun, mpirun,
# spawn_ranks.sh) ----
if(HOPWISE_TORCH_ENABLED)
  set(pytest ${HOPWISE_PYTHON} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_SOURCE_DIR}/python/test_torch_backend.py)
  foreach(part collectives ddp hook faults averaging monitor elastic compressed diloco fsdp placement elastic_diloco)
    if(part STREQUAL "elastic" OR part STREQUAL "diloco")
      set(select "${part} and not elastic_diloco")
    elseif(part STREQUAL "faults")
      set(select "import or bad or mismatch or stopped or plan or barrier")
    elseif(part STREQUAL "ddp")
      set(select "parity")
    elseif(part STREQUAL "hook")
      set(select "hooks or checkpoint")
    elseif(part STREQUAL "compressed")
      set(select "compressed_allreduce")
    else()
      set(select "${part}")
    endif()
    add_test(NAME torch_${part} COMMAND ${pytest} -k "${select}")
    set_tests_properties(torch_${part} PROPERTIES ENVIRONMENT "HOPWISE_BUILD_DIR=${CMAKE_BINARY_DIR}"
                                                  LABELS "python;torch" TIMEOUT 600 PROCESSORS 4)
  endforeach()
endif()

# ---- examples/torch_lm (the GPT-style language model), small and short: it trains on both backends under torchrun
# and mpirun with each kind of method, and a run resumed from its checkpoint ends where the straight one ends ----
if(HOPWISE_TORCH_ENABLED)
  add_test(NAME torch_lm COMMAND ${HOPWISE_PYTHON} -m pytest -q -p no:cacheprovider
                                 ${CMAKE_CURRENT_SOURCE_DIR}/python/test_torch_lm.py)
  set_tests_properties(torch_lm PROPERTIES ENVIRONMENT "HOPWISE_BUILD_DIR=${CMAKE_BINARY_DIR}"
                                           LABELS "python;torch" TIMEOUT 900 PROCESSORS 2)
endif()

# ---- CUDA tensors through the backend (one rank: one GPU here at most); skipped (77) where there is no GPU, which
# gpu-check.sh counts as a failure on its machine (label cuda) ----
if(HOPWISE_TORCH_ENABLED)
  add_test(NAME torch_cuda COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/spawn_ranks.sh 1 ${HOPWISE_PYTHON}
                                   ${CMAKE_CURRENT_SOURCE_DIR}/python/cuda_worker.py)
  set_tests_properties(torch_cuda PROPERTIES ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python"
                       LABELS "python;torch;cuda" TIMEOUT 300 SKIP_RETURN_CODE 77)
  # the averagers, compressed all-reduce and FSDP2 collectives on CUDA tensors, host-staged: 2 ranks on one GPU
  add_test(NAME torch_cuda_placement COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/spawn_ranks.sh 2 ${HOPWISE_PYTHON}
                                             ${CMAKE_CURRENT_SOURCE_DIR}/python/cuda_placement_worker.py)
  set_tests_properties(torch_cuda_placement PROPERTIES ENVIRONMENT "PYTHONPATH=${CMAKE_BINARY_DIR}/python"
                       LABELS "python;torch;cuda" TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# ---- scripts/diloco_recipe.py (plain PyTorch DiLoCo over gloo, the peer of hopwise's diloco): its outer step
# against a hand computation on 2 ranks (no hopwise build needed) ----
if(HOPWISE_TORCH_ENABLED)
  add_test(NAME torch_diloco_recipe COMMAND ${HOPWISE_PYTHON} -m pytest -q -p no:cacheprovider
                                            ${CMAKE_CURRENT_SOURCE_DIR}/python/test_diloco_recipe.py)
  set_tests_properties(torch_diloco_recipe PROPERTIES LABELS "python;torch" TIMEOUT 180 PROCESSORS 2)
endif()
