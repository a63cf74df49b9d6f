// Small CUDA helpers shared by the NCCL communicator and the device reducer (internal).
#pragma once

#include <cuda_runtime.h>
#include <fmt/core.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "hopwise/common/error.h"

namespace hopwise::comm::nccl_detail {

inline std::string cuda_text(cudaError_t e) {
  return fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
}

// Throws TransportError naming the rank and the CUDA call.
inline void check_cuda(cudaError_t e, std::string_view what, int rank) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so that later calls do not report it again
  throw TransportError(fmt::format("rank {}: {} failed: {}; check the GPU (nvidia-smi) and that every buffer is "
                                   "live device memory of the right size",
                                   rank, what, cuda_text(e)));
}

// Makes `device` current for the scope (the caller's thread may have moved to another GPU).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) {
      cudaSetDevice(device);  // an error here surfaces on the next CUDA call, with its name
    } else {
      previous_ = -1;  // nothing to restore
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// InvalidArgument unless `p` (count elements) is device memory of `device` or managed memory. count 0: anything.
inline void check_device_pointer(const void* p, std::size_t count, std::string_view what, std::string_view arg,
                                 int rank, int device) {
  if (count == 0) return;
  if (p == nullptr)
    throw InvalidArgument(fmt::format("rank {}: {}: {} is null but count is {}; pass device memory of {} elements",
                                      rank, what, arg, count, count));
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw InvalidArgument(fmt::format("rank {}: {}: {} ({}) is not memory CUDA knows: {}; pass device memory "
                                      "(cudaMalloc) of {} elements",
                                      rank, what, arg, p, cuda_text(e), count));
  }
  if (a.type == cudaMemoryTypeManaged) return;
  if (a.type != cudaMemoryTypeDevice)
    throw InvalidArgument(fmt::format("rank {}: {}: {} ({}) is host memory; NCCL moves device memory only: copy "
                                      "the data to the GPU (cudaMalloc + cudaMemcpy) or use "
                                      "hopwise::comm::Communicator for host buffers",
                                      rank, what, arg, p));
  if (a.device != device)
    throw InvalidArgument(fmt::format("rank {}: {}: {} ({}) lives on CUDA device {} but this rank's communicator "
                                      "uses device {}; allocate it on device {}",
                                      rank, what, arg, p, a.device, device, device));
}

}  // namespace hopwise::comm::nccl_detail
