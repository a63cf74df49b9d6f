// The error check of CUDA runtime calls, for sources built with CUDA (it includes the CUDA runtime header).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "hopwise/common/error.h"

namespace hopwise::cuda {

// Throws TransportError naming the call; clears a non-sticky error so that later calls do not report it again.
inline void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw TransportError(std::string(what) + " failed: " + cudaGetErrorString(e) +
                       " (is a GPU visible? check nvidia-smi and CUDA_VISIBLE_DEVICES)");
}

}  // namespace hopwise::cuda
